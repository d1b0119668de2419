#!/usr/bin/env python3
"""Checks that every CUDA kernel's registers and static shared memory fit
the block size it is launched with, from the compiled machine code (no GPU).

Reads the cubins (plain ELF images, e_machine EM_CUDA; nvcc compresses only
PTX in its fat binaries) inside the given objects, archives or executables:
each kernel's register count (EIATTR_REGCOUNT in .nv.info), its
__launch_bounds__ (EIATTR_MAX_THREADS in .nv.info.<kernel>) and its static
shared memory (.nv.shared.<kernel>), per architecture. A block of T threads
needs T x (registers rounded up to 8) of the 65536 registers an SM gives one
block on sm_80 / sm_90, and at most 48 KiB of static shared memory. Where
cuobjdump is on the PATH or in /usr/local/cuda/bin, its -res-usage
register counts must agree with what is read here.

Usage: cuda_resource_test.py FILE...   (exit 77: no CUDA code in them)
"""
import os
import re
import shutil
import struct
import subprocess
import sys

# Kernels launched with more threads than kDefaultThreads, by identifier,
# and the block size of their launch (dense/cuda/dense_kernels.cu: BceKernel
# with kLossThreads, LayerFinishKernel with kFinishThreads). These must also
# carry __launch_bounds__ of at least that size, so that the compiler holds
# their registers to what the block may have.
LAUNCHED_WITH = {"BceKernel": 1024, "LayerFinishKernel": 1024}
# Every other kernel's largest launch (the embedding, exchange and dense
# kernels launch 128 or 256 threads).
DEFAULT_THREADS = 256
REGISTERS_PER_BLOCK = 65536
REGISTER_GRANULE = 8
STATIC_SHARED_LIMIT = 48 * 1024

EM_CUDA = 190
EIATTR_MAX_THREADS = 0x05
EIATTR_REGCOUNT = 0x2F


def sections(elf):
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + k * shentsize)
             for k in range(shnum)]
    names = heads[shstrndx][4]

    def cstr(at):
        return elf[at:elf.index(b"\0", at)].decode()

    return [(cstr(names + h[0]), h) for h in heads], cstr


def info_records(elf, head):
    """(attribute, payload bytes or int) of one .nv.info section."""
    at, end = head[4], head[4] + head[5]
    while at < end:
        fmt, attr = elf[at], elf[at + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size, payload
            size, = struct.unpack_from("<H", elf, at + 2)
            yield attr, elf[at + 4:at + 4 + size]
            at += 4 + size
        elif fmt == 3:  # EIFMT_HVAL: u16 value
            yield attr, struct.unpack_from("<H", elf, at + 2)[0]
            at += 4
        elif fmt == 2:  # EIFMT_BVAL
            yield attr, elf[at + 2]
            at += 4
        else:  # EIFMT_NVAL
            yield attr, None
            at += 2


def kernels_of(elf):
    """{kernel: (registers, max threads or None, static shared bytes)} and
    the architecture (sm_XY) of one cubin."""
    secs, cstr = sections(elf)
    by_name = dict((n, h) for n, h in secs)
    flags, = struct.unpack_from("<I", elf, 0x30)
    # e_flags holds the SM version in bits 8-15 (ABI v7+) or 0-7 (older).
    sm = (flags >> 8) & 0xFF or flags & 0xFF
    symtab = by_name.get(".symtab")
    strtab = by_name.get(".strtab")
    symbols = []
    if symtab is not None and strtab is not None:
        for k in range(symtab[5] // 24):
            name_at, = struct.unpack_from("<I", elf, symtab[4] + 24 * k)
            symbols.append(cstr(strtab[4] + name_at))
    regs = {}
    if ".nv.info" in by_name:
        for attr, payload in info_records(elf, by_name[".nv.info"]):
            if attr == EIATTR_REGCOUNT and isinstance(payload, bytes):
                sym, count = struct.unpack_from("<II", payload)
                regs[symbols[sym]] = count
    out = {}
    for name, head in secs:
        if not name.startswith(".text."):
            continue
        kernel = name[len(".text."):]
        max_threads = None
        info = by_name.get(".nv.info." + kernel)
        if info is not None:
            for attr, payload in info_records(elf, info):
                if attr == EIATTR_MAX_THREADS and isinstance(payload, bytes):
                    x, y, z = struct.unpack_from("<III", payload)
                    max_threads = x * y * z
        shared = by_name.get(".nv.shared." + kernel)
        out[kernel] = (regs.get(kernel, head[7] >> 24), max_threads,
                       shared[5] if shared is not None else 0)
    return f"sm_{sm}", out


def cubins(path):
    data = open(path, "rb").read()
    at = data.find(b"\x7fELF\x02\x01")
    while at >= 0:
        machine, = struct.unpack_from("<H", data, at + 0x12)
        if machine == EM_CUDA:
            try:
                yield kernels_of(data[at:])
            except (struct.error, ValueError, IndexError, UnicodeDecodeError):
                pass  # bytes that only look like an ELF header
        at = data.find(b"\x7fELF\x02\x01", at + 4)


def launch_threads(kernel):
    for name, threads in LAUNCHED_WITH.items():
        if f"{len(name)}{name}" in kernel:
            return name, threads
    return None, DEFAULT_THREADS


def cuobjdump_registers(path):
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.access(tool, os.X_OK):
        return None
    text = subprocess.run([tool, "-res-usage", path], capture_output=True,
                          text=True).stdout
    found = {}
    for kernel, regs in re.findall(r"Function (\S+):\s*\n\s*REG:(\d+)", text):
        found.setdefault(kernel.rstrip(":"), set()).add(int(regs))
    return found


def main(paths):
    failures = []
    seen = {}  # (arch, kernel) -> (registers, max threads, shared)
    for path in paths:
        for arch, kernels in cubins(path):
            for kernel, usage in kernels.items():
                seen[(arch, kernel)] = usage
        dumped = cuobjdump_registers(path)
        if dumped:
            ours = {}
            for (_, kernel), usage in seen.items():
                ours.setdefault(kernel, set()).add(usage[0])
            for kernel, regs in dumped.items():
                if kernel in ours and regs != ours[kernel]:
                    failures.append(f"{kernel}: cuobjdump says registers "
                                    f"{sorted(regs)}, the ELF {sorted(ours[kernel])}")
    if not seen:
        print("no CUDA machine code in", " ".join(paths),
              "(built without nvcc?): skipped")
        return 77
    named = set()
    for (arch, kernel), (regs, max_threads, shared) in sorted(seen.items()):
        name, threads = launch_threads(kernel)
        if name:
            named.add(name)
        granted = -(-regs // REGISTER_GRANULE) * REGISTER_GRANULE
        line = (f"{arch} {kernel}: {regs} registers, {shared} B shared, "
                f"launched with {threads} threads"
                + (f", bounds {max_threads}" if max_threads else ""))
        print(line)
        if granted * threads > REGISTERS_PER_BLOCK:
            failures.append(f"{line}: {granted} x {threads} registers > "
                            f"{REGISTERS_PER_BLOCK}")
        if shared > STATIC_SHARED_LIMIT:
            failures.append(f"{line}: static shared memory over 48 KiB")
        if name and (max_threads is None or max_threads < threads):
            failures.append(f"{line}: no __launch_bounds__({threads})")
    for name in sorted(set(LAUNCHED_WITH) - named):
        failures.append(f"{name}: in LAUNCHED_WITH but in no cubin (renamed?)")
    print(f"{len(seen)} kernel images checked")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))

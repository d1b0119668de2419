#!/usr/bin/env python3
"""Converts a TorchRec DLRM state_dict between torch.save (.pt) and safetensors.

dlrm_torchrec (docs/torchrec.md) reads and writes safetensors only; this
helper, which needs torch (anyone holding a TorchRec model has it) but not
the safetensors package, bridges the files torch.save writes:

    python3 scripts/torchrec_convert.py to-safetensors model.pt model.safetensors
    python3 scripts/torchrec_convert.py to-pt model.safetensors model.pt

to-safetensors takes a state_dict (or a dict holding one under "state_dict"
or "model"), drops a "module." or "_orig_mod." prefix that every key shares
(DistributedDataParallel, torch.compile), and writes every tensor as
contiguous float32; a floating tensor of another dtype is cast with a note,
the int64 buffers of managed-collision modules (keys under
"managed_collision_collection.", docs/torchrec.md "Dynamic tables") stay
int64, anything else (other integer buffers, a ShardedTensor of a sharded
model: gather it on one rank first) is an error naming the key. to-pt
writes the tensors of a safetensors file with torch.save as a plain
state_dict, for DLRM.load_state_dict.
"""

import argparse
import json
import struct
import sys

import torch

_PREFIXES = ("module.", "_orig_mod.")
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64, "I64": torch.int64}
# The managed-collision state of dynamic tables: int64 buffers.
MC_PREFIX = "managed_collision_collection."


def _state_dict(obj):
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], dict):
                return obj[key]
        return obj
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    raise ValueError(f"expected a state_dict, got {type(obj).__name__}")


def _strip_prefixes(sd):
    changed = True
    while changed and sd:
        changed = False
        for prefix in _PREFIXES:
            if all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                changed = True
    return sd


def to_float32_tensors(sd):
    """The state_dict `sd` as contiguous float32 CPU tensors; ValueError naming
    a key whose value is not a floating torch.Tensor."""
    out = {}
    for key, value in _strip_prefixes(dict(sd)).items():
        if type(value) is not torch.Tensor and not isinstance(
                value, torch.nn.Parameter):
            raise ValueError(
                f"{key}: a {type(value).__name__}, not a plain tensor (a "
                "sharded model's state_dict must be gathered on one rank)")
        if key.startswith(MC_PREFIX) and value.dtype == torch.int64:
            out[key] = value.detach().to("cpu").contiguous()
            continue
        if not value.is_floating_point():
            raise ValueError(f"{key}: dtype {value.dtype} is not floating point")
        if value.dtype != torch.float32:
            print(f"note: {key}: {value.dtype} cast to float32", file=sys.stderr)
        out[key] = value.detach().to("cpu", torch.float32).contiguous()
    return out


def write_safetensors(tensors, path, metadata=None):
    """Writes float32 and int64 `tensors` (name -> tensor) to `path` in
    safetensors, the int64 ones first (every tensor aligned)."""
    header = {}
    offset = 0
    names = sorted(tensors, key=lambda n: (tensors[n].dtype != torch.int64, n))
    for name in names:
        dtype = "I64" if tensors[name].dtype == torch.int64 else "F32"
        size = tensors[name].numel() * (8 if dtype == "I64" else 4)
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(tensors[name].numpy().tobytes())


def read_safetensors(path):
    """The tensors of the safetensors file `path` (name -> tensor, a copy)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{name}: dtype {entry['dtype']} not supported")
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype)
        out[name] = flat.reshape(entry["shape"]).clone()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-safetensors", help=".pt state_dict -> safetensors")
    a.add_argument("input")
    a.add_argument("output")
    b = sub.add_parser("to-pt", help="safetensors -> .pt state_dict")
    b.add_argument("input")
    b.add_argument("output")
    args = parser.parse_args(argv)
    try:
        if args.command == "to-safetensors":
            obj = torch.load(args.input, map_location="cpu", weights_only=True)
            tensors = to_float32_tensors(_state_dict(obj))
            write_safetensors(tensors, args.output, {"format": "pt"})
        else:
            tensors = read_safetensors(args.input)
            torch.save(tensors, args.output)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        print(f"torchrec_convert: {args.input}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())

// CRC-32C (Castagnoli), the checksum of checkpoint files: the SSE4.2 crc32
// instruction where the CPU has it, else a table. Debian's Abseil (20220623)
// predates absl/crc, so this is our own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlrm {

// The CRC-32C of `crc`'s message followed by `n` bytes at `data` (start
// with crc = 0). Thread-safe.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) {
  return Crc32cExtend(0, data, n);
}

namespace internal {
// Crc32cExtend without the SSE4.2 path (for tests on any CPU).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace dlrm

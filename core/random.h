// Deterministic, counter-based random numbers. Values are pure functions of
// (seed, stream, counter), so any row of any table can be initialised or
// regenerated in any order, on any rank or storage tier, with the same result.
#pragma once

#include <cmath>
#include <cstdint>

namespace dlrm {

// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of (seed, stream, counter).
inline uint64_t HashKey(uint64_t seed, uint64_t stream, uint64_t counter) {
  return Mix64(Mix64(Mix64(seed) ^ stream) + counter);
}

// Uniform float in [0, 1) from the top 24 bits of `bits`.
inline float BitsToUnitFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Uniform double in (0, 1) (never 0, so log() is safe).
inline double BitsToOpenUnitDouble(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// A small sequential generator (SplitMix64 stream) for data generation and
// weight initialisation where order is fixed. Not thread-safe; cheap to copy.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() {
    return static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);
  }
  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n); n > 0.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(NextU64()) * n) >> 64);
  }
  // Standard normal (Box-Muller; one value per call for simplicity).
  double Normal() {
    const double u1 = BitsToOpenUnitDouble(NextU64());
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace dlrm

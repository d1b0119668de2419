// Seeded random streams for the tests: every one prints its seed, so that a
// failure can be replayed (STYLE.md habit 9).
#ifndef DLRM_TESTS_SUPPORT_RANDOM_H_
#define DLRM_TESTS_SUPPORT_RANDOM_H_

#include <cstdint>
#include <cstdio>

#include "core/random.h"

namespace dlrm::test {

// An Rng of `seed`, after printing "seed <seed>" on stdout.
inline Rng SeededRng(uint64_t seed) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return Rng(seed);
}

}  // namespace dlrm::test

#endif  // DLRM_TESTS_SUPPORT_RANDOM_H_

// Seed mixing: derives independent, reproducible seeds from (seed, stream) pairs.
#pragma once

#include <cstdint>

namespace trainer {

// SplitMix64's finaliser: a bijective scramble of 64 bits.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A seed for sub-stream `stream` of `seed`.
inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  return splitmix64(seed ^ splitmix64(stream));
}

}  // namespace trainer

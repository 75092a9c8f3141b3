// A small, fast generator with the same output on every platform, for per-sample randomness.
#pragma once

#include <cstdint>

#include "util/hash.h"

namespace trainer {

// SplitMix64 as a stream: each call scrambles the next value of a counter.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() { return splitmix64(state_++); }
  // Uniform in [0, 1), with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n); n > 0. Modulo bias is below n / 2^64.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // True with probability p.
  bool bernoulli(double p) { return uniform() < p; }

 private:
  uint64_t state_;
};

}  // namespace trainer

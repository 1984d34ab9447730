// The project's own PRNG for everything that must give the same numbers with every compiler and
// standard library: the document split and the training data order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cemfrac {

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit counter passed through a mixing function.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, bound), bound > 0, without modulo bias (rejection sampling).
  uint64_t next_below(uint64_t bound);

 private:
  uint64_t state_;
};

// A permutation of 0..n-1: Fisher-Yates from the back, driven by SplitMix64(seed).
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);

}  // namespace cemfrac

#include "cemfrac/core/random.h"

#include <numeric>
#include <utility>

namespace cemfrac {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::next_below(uint64_t bound) {
  // Values below `threshold` would make some residues more likely; 2^64 mod bound of them exist.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<size_t> seeded_permutation(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  SplitMix64 rng(seed);
  for (size_t i = n; i > 1; --i) {
    const auto j = static_cast<size_t>(rng.next_below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

}  // namespace cemfrac

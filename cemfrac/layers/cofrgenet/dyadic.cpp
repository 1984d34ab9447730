#include "cemfrac/layers/cofrgenet/dyadic.h"

namespace cemfrac {

int64_t dyadic_start(int64_t depth, int64_t total_steps) {
  if (depth <= 0) return 0;
  if (depth >= 63) return total_steps;  // t / 2^i = 0 for every int64 t
  return total_steps - (total_steps >> depth);
}

int64_t dyadic_active_depth(int64_t step, int64_t total_steps, int64_t max_depth) {
  int64_t m = 0;
  while (m < max_depth && step >= dyadic_start(m + 1, total_steps)) ++m;
  return m;
}

}  // namespace cemfrac

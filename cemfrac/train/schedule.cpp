#include "cemfrac/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace cemfrac {

double CosineSchedule::lr(int64_t step) const {
  const int64_t last = total_steps - 1;
  if (step < warmup_steps) return lr_max * static_cast<double>(step + 1) / warmup_steps;
  if (step > last) return lr_min;
  const int64_t s0 = std::max<int64_t>(warmup_steps - 1, 0);
  if (last <= s0) return lr_max;
  const double p = static_cast<double>(step - s0) / static_cast<double>(last - s0);
  return lr_min + (lr_max - lr_min) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace cemfrac

// Learning-rate schedules as pure functions of the optimizer step, so a resumed run needs only the
// step to continue the schedule. Steps are 0-based: step s is the (s+1)-th optimizer step.
#pragma once
#include <cstdint>

namespace cemfrac {

// Linear warmup, then cosine decay to a floor (llm.c's convention for the warmup):
//   s <  W:          lr = lr_max * (s + 1) / W            (lr(0) = lr_max / W, lr(W-1) = lr_max)
//   W <= s <= last:  p = (s - s0) / (last - s0), s0 = max(W - 1, 0), last = total_steps - 1
//                    lr = lr_min + (lr_max - lr_min) * (1 + cos(pi * p)) / 2   (lr(last) = lr_min)
//   s >  last:       lr = lr_min
// With W = 0 the decay starts at lr(0) = lr_max.
struct CosineSchedule {
  double lr_max = 3e-3;
  double lr_min = 3e-4;
  int64_t warmup_steps = 0;  // W
  int64_t total_steps = 1;

  double lr(int64_t step) const;
};

}  // namespace cemfrac

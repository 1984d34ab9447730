// The dyadic depth schedule of CoFrGeNet ladders (docs/layers/cofrgenet.md; the CoFrGeNet paper,
// §4): over a run of t optimizer steps, ladder depth i >= 1 is trained from 0-based step ceil(t (1
// - 2^-i)) = t - floor(t / 2^i) on (for its last t / 2^i steps); depth 0 (everything else) from
// step 0. E.g. t = 19073: 9537, 14305, 16689, 17881, 18477. The trainer unfreezes depth-i tensors
// at dyadic_start(i, t); the ladders with `truncate` evaluate only dyadic_active_depth(...) depths.
#pragma once
#include <cstdint>

namespace cemfrac {

// First 0-based step at which ladder depth `depth` trains, in a run of `total_steps` steps.
int64_t dyadic_start(int64_t depth, int64_t total_steps);
// The deepest active depth at 0-based `step`: max{i in 0..max_depth : step >= dyadic_start(i, t)}.
int64_t dyadic_active_depth(int64_t step, int64_t total_steps, int64_t max_depth);

}  // namespace cemfrac

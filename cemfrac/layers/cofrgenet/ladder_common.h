// What every CoFrGeNet layer does the same way with its ladders (docs/layers/cofrgenet.md):
//   - evaluates them through cemfrac::continuant (fused / reference / literal, pole guard eps);
//   - under the dyadic schedule with `truncate`, evaluates only the active depths a_1..a_m
//     (stage m = 0: no fraction, the ladders output 0);
//   - records the range of its ladder outputs during training (the trainer switches recording on)
//     and, in eval mode, clips the outputs to that range (spec §2.5).
// The dyadic thresholds themselves are cemfrac::dyadic_start (layers/cofrgenet/dyadic.h).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include "cemfrac/layers/param_tags.h"
#include "cemfrac/ops/continuant.h"

namespace cemfrac {

struct CofrConfig;

struct LadderOptions {
  TORCH_ARG(ContinuantOptions, continuant) = {};
  // Dyadic stages evaluate only the active depths (default: frozen depths still take part).
  TORCH_ARG(bool, truncate) = false;
  // Eval mode clips ladder outputs to [z_min, z_max] recorded in training.
  TORCH_ARG(bool, eval_clip) = true;
};

// The ladder settings of a model config (impl, backward and eps parsed; throws cemfrac::Error).
LadderOptions ladder_options(const CofrConfig& config);

// The run-time side of a layer's ladders: active depth and range recording.
class LadderRuntime {
 public:
  LadderRuntime(const LadderOptions& options, int64_t depth)
      : options_(options), depth_(depth), active_depth_(depth) {}

  // From TaggedModule::on_train_step: sets the active depth (truncate + dyadic) and switches range
  // recording on; at the first step of the recording window (the last max(1, ceil(t / 100)) steps)
  // the range buffers are reset, so they hold what the final 1 % of training produced.
  void on_train_step(const TrainProgress& progress, torch::Tensor& z_min, torch::Tensor& z_max);

  // f of every ladder of a (..., d, L) -> (..., L), over the active depths only.
  torch::Tensor evaluate(const torch::Tensor& a) const;

  // Training with recording on: extends [z_min, z_max] by z (no gradient) and returns z. Eval mode
  // with eval_clip: returns z clamped to the range (ladders with nothing recorded, z_min > z_max,
  // are left alone). Otherwise z. z_min / z_max are broadcastable to z (trailing dimensions; size-1
  // dimensions and leading dimensions are reduced when recording); they may be views of the layer's
  // buffers.
  torch::Tensor range(const torch::Tensor& z, bool training, const torch::Tensor& z_min,
                      const torch::Tensor& z_max) const;

  int64_t depth() const { return depth_; }
  int64_t active_depth() const { return active_depth_; }
  void set_active_depth(int64_t m) { active_depth_ = m; }
  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }
  const LadderOptions& options() const { return options_; }

 private:
  LadderOptions options_;
  int64_t depth_;
  int64_t active_depth_;
  bool recording_ = false;
};

// First step of the range-recording window of a run of `total_steps` steps.
int64_t range_window_start(int64_t total_steps);

// Range buffers of `shape`: z_min = +inf, z_max = -inf (clipping is the identity until recorded).
torch::Tensor initial_range_min(torch::IntArrayRef shape, torch::Device device);
torch::Tensor initial_range_max(torch::IntArrayRef shape, torch::Device device);

// The additive causal mask of `length` positions, (length, length): 0 where key s <= query t, -inf
// above the diagonal (masked probabilities come out as exact zeros).
torch::Tensor causal_logit_mask(int64_t length, torch::Device device);

}  // namespace cemfrac

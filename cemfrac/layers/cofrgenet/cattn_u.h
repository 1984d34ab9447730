// Mixer "cattn_u" (CoFrGeNet spec §3.3; docs/layers/cofrgenet.md): attention replaced
// by two ensembles e = 1, 2 of univariate ladders along the token axis and causal token mixing,
//     Y⁽ᵉ⁾[b,i,c] = w⁽ᵉ⁾_0[i] X[b,i,c] + f̃(w⁽ᵉ⁾_1[i] X[b,i,c] (+ b⁽ᵉ⁾_1[i]), .., w⁽ᵉ⁾_{d-1}[i]
//     X[b,i,c] (+ ..)), Z⁽ᵉ⁾[b,j,c] = Σ_{i<=j} T⁽ᵉ⁾[j,i] Y⁽ᵉ⁾[b,i,c],        O = Z⁽¹⁾ ⊙ Z⁽²⁾.
// Position i's ladder sees only token i, and T is lower triangular (coefficient from input position
// i to output position j is exactly 0 for i > j), so the layer is causal. Built for l positions:
// sequences shorter than l use the leading entries of w and the leading block of T; longer ones are
// an error. Parameters: exactly l (2 d + l + 1) (+ 2 (d - 1) l biases, reported separately).
// Checkpoint keys under blocks.<l>.attn.:
//   w_pos_0 (2, l)            w⁽ᵉ⁾_0, the linear term, init 1                  no decay
//   w_pos_<k> (2, l)          w⁽ᵉ⁾_k, fraction level k = 1..d-1                 no decay, dyadic
//   depth k b_pos_<k> (2, l)          b⁽ᵉ⁾_k, init 1 (option)                           no decay,
//   dyadic depth k t_mix (2, l (l + 1) / 2)  T⁽ᵉ⁾ packed row by row (row j holds T[j, 0..j]), init
//   1 / (j + 1)
//                             (a causal mean; the leading n (n + 1) / 2 entries are the n x n
//                             block)
// State buffers: z_min, z_max (2, l, 1): the fraction output range per ensemble and position.
// Decode state: Y⁽¹⁾, Y⁽²⁾ of every position seen, (B, 2, T, p).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "cemfrac/layers/cofrgenet/ladder_common.h"
#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct CAttnUOptions {
  CAttnUOptions(int64_t d_model, int64_t length, int64_t depth)
      : d_model_(d_model), length_(length), depth_(depth) {}
  TORCH_ARG(int64_t, d_model);  // p (channels; no channel mixing happens here)
  TORCH_ARG(int64_t, length);   // l
  TORCH_ARG(int64_t, depth);    // d = 1 linear term + (d - 1) fraction levels
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(LadderOptions, ladder) = {};
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

struct CAttnUState : MixerState {
  KvCache y;  // (B, 2, T, p)
  int64_t cache_bytes() const override { return y.bytes(); }
};

class CAttnUImpl : public MixerImpl {
 public:
  explicit CAttnUImpl(const CAttnUOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;
  void on_train_step(const TrainProgress& progress) override;

  // The effective token-mixing matrices (2, n, n) of the leading n positions: [e, j, i] is the
  // coefficient from input position i to output position j (exact zeros above the diagonal).
  torch::Tensor mixing(int64_t n) const;
  // Y (B, n, 2, p) of x (B, n, p) at positions offset..offset+n-1.
  torch::Tensor ladder_outputs(const torch::Tensor& x, int64_t offset) const;
  // The partial denominators (B, n, d - 1, 2 p) of the fraction levels, for tests.
  torch::Tensor ladder_inputs(const torch::Tensor& x, int64_t offset) const;

  const CAttnUOptions& options() const { return options_; }
  LadderRuntime& ladders() { return runtime_; }

  torch::Tensor w_pos_0, t_mix;
  std::vector<torch::Tensor> w_pos, b_pos;  // index k - 1 holds fraction level k
  torch::Tensor z_min, z_max;

 private:
  CAttnUOptions options_;
  LadderRuntime runtime_;
};

}  // namespace cemfrac

// FFN "cffn" (CoFrGeNet spec §3.2; docs/layers/cofrgenet.md): the GPT-2 MLP replaced
// by L continued-fraction ladders on a gated, non-expanded input,
//     x̂ = x ⊙ σ(G x),   a⁽ʲ⁾ = W⁽ʲ⁾ x̂ + b⁽ʲ⁾,   z_j = f̃(a⁽ʲ⁾_1..a⁽ʲ⁾_d),   y = U x̂ + Σ_j v_j z_j.
// Options: SiLU gate; U on the raw input x; GLU-style gate x̂ = act(G₁x) ⊙ G₂x with no U (y = V z);
// univariate ladders (p element-wise fractions per ladder, a_{k,i} = W_{k,j,i} x̂_i + b_{k,j,i}).
// Parameters: exactly L p (d + 1) + 2 p² (biases excluded; they are L d, or L d p when univariate).
// Checkpoint keys under blocks.<l>.mlp.:
//   w_gate (p, p)         G (G₁ with glu)                          decay
//   w_up (p, p)           G₂, glu only                             decay
//   w_direct (p, p)       U, absent with glu (residual init)       decay
//   w_ladder_<k> (L, p)   row k of every W⁽ʲ⁾, k = 1..d            decay, dyadic depth k
//   b_ladder_<k> (L)      b⁽ʲ⁾_k, init 1 ((L, p) when univariate) no decay, dyadic depth k
//   w_out (p, L)          V (residual init)                        decay
// State buffers (checkpointed, not parameters): z_min, z_max (L) ((L, p) when univariate), the
// ladder output range for eval-time clipping.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <vector>

#include "cemfrac/layers/cofrgenet/cofrgenet_config.h"
#include "cemfrac/layers/cofrgenet/ladder_common.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct CffnOptions {
  CffnOptions(int64_t d_model, int64_t ladders, int64_t depth)
      : d_model_(d_model), ladders_(ladders), depth_(depth) {}
  TORCH_ARG(int64_t, d_model);  // p
  TORCH_ARG(int64_t, ladders);  // L
  TORCH_ARG(int64_t, depth);    // d
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(CffnGate, gate) = CffnGate::kSigmoid;
  TORCH_ARG(bool, glu) = false;
  TORCH_ARG(bool, direct_raw) = false;
  TORCH_ARG(bool, univariate) = false;
  TORCH_ARG(LadderOptions, ladder) = {};
  TORCH_ARG(double, init_std) = 0.02;      // G (and G₂)
  TORCH_ARG(double, out_init_std) = 0.02;  // U and V (they write into the residual stream)
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

class CffnImpl : public FfnImpl {
 public:
  explicit CffnImpl(const CffnOptions& options);
  torch::Tensor forward(const torch::Tensor& x) override;
  double forward_flops_per_token() const override;
  void on_train_step(const TrainProgress& progress) override;

  // Pieces of the forward, for tests: the gated input x̂ (B, N, p) and the partial denominators a
  // (B, N, d, L) (univariate: (B, N, d, L p)) of every ladder.
  torch::Tensor gated(const torch::Tensor& x) const;
  torch::Tensor ladder_inputs(const torch::Tensor& x_hat) const;

  const CffnOptions& options() const { return options_; }
  LadderRuntime& ladders() { return runtime_; }

  torch::Tensor w_gate, w_up, w_direct, w_out;
  std::vector<torch::Tensor> w_ladder, b_ladder;  // index k - 1 holds depth k
  torch::Tensor z_min, z_max;

 private:
  CffnOptions options_;
  LadderRuntime runtime_;
};

}  // namespace cemfrac

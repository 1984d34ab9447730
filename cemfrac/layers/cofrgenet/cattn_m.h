// Mixer "cattn_m" (CoFrGeNet spec §3.4; docs/layers/cofrgenet.md): attention replaced
// by an ensemble of L p-variate ladders whose outputs are mapped to logits over the positions,
//     z(b,t) = (f̃(W⁽ʲ⁾ X[b,t] + b⁽ʲ⁾))_{j=1..L},   s_h(b,t,·) = F_hᵀ z(b,t) ∈ R^l,
//     A_h = causal softmax(s_h) (diagonal included),  O = concat_h(A_h X W^v_h) (then W^o,
//     optional).
// The logits of token t depend on token t only, and A_h[t, s] = 0 for s > t: causal. Built for l
// positions (sequences shorter than l use the leading columns of F; longer ones are an error).
// Parameters: L p d + H L l + p² (+ p² with W^o; ladder biases L d reported separately); the
// paper's L (p + l) + p² is the case d = 1, H = 1. Checkpoint keys under blocks.<l>.attn.:
//   w_ladder_<k> (L, p)   row k of every ladder, k = 1..d     decay, dyadic depth k
//   b_ladder_<k> (L)      init 1 (option)                     no decay, dyadic depth k
//   w_logits (H, L, l)    F_h                                 decay
//   w_v (p, p)            values (heads are slices of d_model / H channels)   decay
//   w_o (p, p)            output projection (option)          decay
// State buffers: z_min, z_max (L). Decode state: the values X W^v of every position, (B, H, T, p /
// H).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "cemfrac/layers/cofrgenet/ladder_common.h"
#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct CAttnMOptions {
  CAttnMOptions(int64_t d_model, int64_t length, int64_t ladders, int64_t depth)
      : d_model_(d_model), length_(length), ladders_(ladders), depth_(depth) {}
  TORCH_ARG(int64_t, d_model);  // p
  TORCH_ARG(int64_t, length);   // l
  TORCH_ARG(int64_t, ladders);  // L
  TORCH_ARG(int64_t, depth);    // d
  TORCH_ARG(int64_t, heads) = 1;
  TORCH_ARG(bool, bias) = true;       // ladder biases
  TORCH_ARG(bool, out_proj) = false;  // W^o
  TORCH_ARG(LadderOptions, ladder) = {};
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, out_init_std) = 0.02;  // of the matrix that writes into the residual stream
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

struct CAttnMState : MixerState {
  KvCache v;  // (B, H, T, p / H): the values of every position seen
  int64_t cache_bytes() const override { return v.bytes(); }
};

class CAttnMImpl : public MixerImpl {
 public:
  explicit CAttnMImpl(const CAttnMOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;
  void on_train_step(const TrainProgress& progress) override;

  // Ladder partial denominators (B, N, d, L) and outputs z (B, N, L) of x (B, N, p).
  torch::Tensor ladder_inputs(const torch::Tensor& x) const;
  torch::Tensor ladder_outputs(const torch::Tensor& x);
  // The attention matrix (B, H, N, offset + N) of queries at offset..offset+N-1 over keys
  // 0..offset+N-1.
  torch::Tensor attention(const torch::Tensor& x, int64_t offset);

  const CAttnMOptions& options() const { return options_; }
  LadderRuntime& ladders() { return runtime_; }

  std::vector<torch::Tensor> w_ladder, b_ladder;
  torch::Tensor w_logits, w_v, w_o;
  torch::Tensor z_min, z_max;

 private:
  CAttnMOptions options_;
  LadderRuntime runtime_;
  torch::Tensor mask_;  // buffer "mask": (l, l) additive causal mask (cast per use)
};

}  // namespace cemfrac

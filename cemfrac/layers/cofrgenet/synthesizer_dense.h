// Mixer "synthesizer_dense" (Dense Synthesizer, Tay et al. 2021; the CoFrGeNet paper's baseline,
// spec §5.2; docs/layers/cofrgenet.md): each token's logits over the l positions come from a
// two-layer MLP of that token alone, B_t = W_2 ReLU(W_1 x_t + b_1) + b_2; head k's l logits come
// from the k-th slice of the h hidden units (W_2 is block-diagonal over heads, h l parameters in
// all); causal softmax (diagonal included); values X W^v in H heads; output projection W^o. CAttnM
// is its continued-fraction analogue. Parameters: p h + h l + 2 p² (+ biases h + H l + 2 p).
// Checkpoint keys under blocks.<l>.attn.:
//   w_1 (h, p), b_1 (h) when bias       first layer (h = synth_hidden, default p)     decay / no
//   decay w_2 (H, l, h/H), b_2 (H, l) when bias  logits over positions per head           decay /
//   no decay w_v (p, p), b_v (p) when bias       values                                      decay
//   / no decay w_o (p, p), b_o (p) when bias       output projection (residual init) decay / no
//   decay
// Decode state: the values of every position, (B, H, T, p / H).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct SynthesizerDenseOptions {
  SynthesizerDenseOptions(int64_t d_model, int64_t length, int64_t heads)
      : d_model_(d_model), length_(length), heads_(heads) {}
  TORCH_ARG(int64_t, d_model);     // p
  TORCH_ARG(int64_t, length);      // l
  TORCH_ARG(int64_t, heads);       // H
  TORCH_ARG(int64_t, hidden) = 0;  // h (0 = p)
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, out_init_std) = 0.02;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

struct SynthesizerDenseState : MixerState {
  KvCache v;  // (B, H, T, p / H): the values of every position seen
  int64_t cache_bytes() const override { return v.bytes(); }
};

class SynthesizerDenseImpl : public MixerImpl {
 public:
  explicit SynthesizerDenseImpl(const SynthesizerDenseOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;

  // The attention matrix (B, H, N, offset + N).
  torch::Tensor attention(const torch::Tensor& x, int64_t offset) const;

  torch::Tensor w_1, b_1, w_2, b_2, w_v, b_v, w_o, b_o;

 private:
  SynthesizerDenseOptions options_;
  torch::Tensor mask_;  // buffer "mask": (l, l) additive causal mask
};

}  // namespace cemfrac

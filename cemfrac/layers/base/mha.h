// Mixer "mha": causal multi-head self-attention in two flavours chosen by the options.
//   GPT-2: biases on the projections, no rotation (learned absolute positions live in the model).
//   Llama: no biases, RoPE on queries and keys, optional grouped-query attention (n_kv_heads < H:
//          each key/value head serves H / n_kv_heads consecutive query heads).
// Parameters (checkpoint keys under blocks.<l>.attn.):
//   w_qkv (H d_h + 2 H_kv d_h, D)  queries, keys, values stacked in that order (one matmul)
//   b_qkv (H d_h + 2 H_kv d_h)     when bias
//   w_o   (D, H d_h)               output projection (a residual projection: init std / sqrt(2L))
//   b_o   (D)                      when bias
// Decode state: K (after RoPE) and V of every position seen, (B, H_kv, T, d_h) each.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"
#include "cemfrac/ops/causal_attention.h"  // causal_attention, for the tests that used it from here

namespace cemfrac {

struct MhaOptions {
  MhaOptions(int64_t d_model, int64_t n_heads) : d_model_(d_model), n_heads_(n_heads) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(int64_t, n_kv_heads) = 0;  // 0 = n_heads
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(bool, rope) = false;  // rotate q and k with MixerContext::rope_cos/sin
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, out_init_std) = 0.02;  // of w_o
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

struct MhaState : MixerState {
  KvCache k;  // (B, H_kv, T, d_h), after RoPE
  KvCache v;  // (B, H_kv, T, d_h)
  int64_t cache_bytes() const override { return k.bytes() + v.bytes(); }
};

class MhaImpl : public MixerImpl {
 public:
  explicit MhaImpl(const MhaOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;

  const MhaOptions& options() const { return options_; }

  torch::Tensor w_qkv, b_qkv, w_o, b_o;

 private:
  MhaOptions options_;
  int64_t n_kv_heads_;
  int64_t head_dim_;
};

}  // namespace cemfrac

// Mixer "sparse_attention" (Child et al. 2019, "fixed" and "strided" patterns; the CoFrGeNet
// paper's baseline, spec §5.2; docs/layers/cofrgenet.md): multi-head softmax attention whose query
// t sees key s <= t only where the pattern allows (block/stride length b, summary width c):
//   fixed:   floor(s / b) == floor(t / b)  (own block)  or  s mod b >= b - c  (summary positions)
//   strided: t - s < b  (local window)  or  (t - s) mod b == 0  (stride)
// Every head uses the union of both parts (Child et al.'s merged form); the diagonal is always
// seen. Parameters are those of MHA (the pattern has none); checkpoint keys under blocks.<l>.attn.:
//   w_qkv (3 p, p), b_qkv (3 p) when bias, w_o (p, p) (residual init), b_o (p) when bias.
// With positions = rope, queries and keys are rotated as in MHA. Computed densely with a cached
// additive mask (the pattern's savings are not exploited). Decode state: K and V, (B, H, T, d_h).
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/cofrgenet/cofrgenet_config.h"
#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct SparseAttentionOptions {
  SparseAttentionOptions(int64_t d_model, int64_t n_heads, int64_t length)
      : d_model_(d_model), n_heads_(n_heads), length_(length) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(int64_t, length);  // positions the mask covers (model.context)
  TORCH_ARG(SparsePattern, pattern) = SparsePattern::kFixed;
  TORCH_ARG(int64_t, block) = 16;   // b
  TORCH_ARG(int64_t, summary) = 1;  // c (fixed)
  TORCH_ARG(bool, bias) = false;
  TORCH_ARG(bool, rope) = false;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(double, out_init_std) = 0.02;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

struct SparseAttentionState : MixerState {
  KvCache k, v;  // (B, H, T, d_h)
  int64_t cache_bytes() const override { return k.bytes() + v.bytes(); }
};

// Whether query t may see key s under the pattern (s <= t required).
bool sparse_pattern_allows(SparsePattern pattern, int64_t block, int64_t summary, int64_t t,
                           int64_t s);

class SparseAttentionImpl : public MixerImpl {
 public:
  explicit SparseAttentionImpl(const SparseAttentionOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;

  const torch::Tensor& mask() const { return mask_; }  // (l, l) additive: 0 allowed, -inf hidden

  torch::Tensor w_qkv, b_qkv, w_o, b_o;

 private:
  SparseAttentionOptions options_;
  torch::Tensor mask_;  // buffer "mask" (l, l)
};

}  // namespace cemfrac

// Mixer "mha": projections, RoPE, the decode cache and the output projection wired around
// ops/causal_attention (whose fused full-sequence kernel is kernels/cpu/attention_cpu.cpp).
#include "cemfrac/layers/base/mha.h"

#include <torch/types.h>

#include <vector>

#include "cemfrac/ops/causal_attention.h"
#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/rope.h"

namespace cemfrac {

MhaImpl::MhaImpl(const MhaOptions& options) : options_(options) {
  const int64_t D = options.d_model(), H = options.n_heads();
  n_kv_heads_ = options.n_kv_heads() > 0 ? options.n_kv_heads() : H;
  TORCH_INTERNAL_ASSERT(D % H == 0 && H % n_kv_heads_ == 0, "mha: bad head counts");
  head_dim_ = D / H;
  const int64_t qkv_width = (H + 2 * n_kv_heads_) * head_dim_;
  const torch::Device device = options.device();
  w_qkv = add_parameter("w_qkv", init_normal({qkv_width, D}, options.init_std(), device),
                        ParamKind::kAttention, ParamGroup::kDecay);
  if (options.bias()) {
    b_qkv = add_parameter("b_qkv", init_constant({qkv_width}, 0.0, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  }
  w_o = add_parameter("w_o", init_normal({D, H * head_dim_}, options.out_init_std(), device),
                      ParamKind::kAttention, ParamGroup::kDecay);
  if (options.bias()) {
    b_o = add_parameter("b_o", init_constant({D}, 0.0, device), ParamKind::kAttention,
                        ParamGroup::kNoDecay);
  }
}

std::unique_ptr<MixerState> MhaImpl::new_state() const {
  return std::make_unique<MhaState>();
}

torch::Tensor MhaImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t B = x.size(0), N = x.size(1);
  const int64_t H = options_.n_heads(), H_kv = n_kv_heads_, d_h = head_dim_;

  // 1. Queries, keys and values in one projection, split into heads.
  torch::Tensor qkv = cemfrac::linear(x, w_qkv, b_qkv);  // (B, N, (H + 2 H_kv) d_h)
  std::vector<torch::Tensor> parts = qkv.split_with_sizes({H * d_h, H_kv * d_h, H_kv * d_h}, -1);
  torch::Tensor q = parts[0].view({B, N, H, d_h}).transpose(1, 2);     // (B, H, N, d_h)
  torch::Tensor k = parts[1].view({B, N, H_kv, d_h}).transpose(1, 2);  // (B, H_kv, N, d_h)
  torch::Tensor v = parts[2].view({B, N, H_kv, d_h}).transpose(1, 2);  // (B, H_kv, N, d_h)

  // 2. Rotate queries and keys by their absolute positions (Llama).
  if (options_.rope()) {
    q = apply_rope(q, ctx.rope_cos, ctx.rope_sin);
    k = apply_rope(k, ctx.rope_cos, ctx.rope_sin);
  }

  // 3. With a decode state, attend over every earlier position too, and remember this step's K, V.
  if (ctx.state != nullptr) {
    auto* state = static_cast<MhaState*>(ctx.state);
    k = state->k.append(k, ctx.offset, ctx.capacity, 2, "mha");  // (B, H_kv, T, d_h)
    v = state->v.append(v, ctx.offset, ctx.capacity, 2, "mha");
  }

  // 4. Causal attention, then merge the heads and project back to D. Under autocast
  // (train.precision = "bf16") the rotation returns float32 q, k (the tables are float32) beside a
  // bfloat16 v; the op takes one dtype, so v joins q's (a no-op otherwise).
  if (v.scalar_type() != q.scalar_type()) v = v.to(q.scalar_type());
  torch::Tensor y = causal_attention(q, k, v, ctx.offset);  // (B, H, N, d_h)
  y = y.transpose(1, 2).reshape({B, N, H * d_h});           // (B, N, H d_h)
  return cemfrac::linear(y, w_o, b_o);                      // (B, N, D)
}

// Projections 2 D (H d_h + 2 H_kv d_h) + 2 H d_h D; scores q k^T and read-out P v 2 H d_h context
// each.
double MhaImpl::forward_flops_per_token(int64_t context) const {
  const double D = double(options_.d_model()), Hd = double(options_.n_heads() * head_dim_);
  const double Hkv_d = double(n_kv_heads_ * head_dim_);
  return 2.0 * D * (Hd + 2.0 * Hkv_d) + 2.0 * Hd * D + 4.0 * Hd * double(context);
}

}  // namespace cemfrac

#include "cemfrac/layers/cofrgenet/sparse_attention.h"

#include <torch/types.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/rope.h"

namespace cemfrac {

bool sparse_pattern_allows(SparsePattern pattern, int64_t block, int64_t summary, int64_t t,
                           int64_t s) {
  if (s > t) return false;
  switch (pattern) {
    case SparsePattern::kFixed: return s / block == t / block || s % block >= block - summary;
    case SparsePattern::kStrided: return t - s < block || (t - s) % block == 0;
  }
  TORCH_INTERNAL_ASSERT(false, "sparse_pattern_allows: unhandled pattern");
}

SparseAttentionImpl::SparseAttentionImpl(const SparseAttentionOptions& o) : options_(o) {
  const int64_t D = o.d_model(), H = o.n_heads(), l = o.length();
  TORCH_INTERNAL_ASSERT(D % H == 0 && l >= 1 && o.block() >= 1, "sparse_attention: bad sizes");
  const torch::Device device = o.device();
  w_qkv = add_parameter("w_qkv", init_normal({3 * D, D}, o.init_std(), device),
                        ParamKind::kAttention, ParamGroup::kDecay);
  if (o.bias()) {
    b_qkv = add_parameter("b_qkv", init_constant({3 * D}, 0.0, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  }
  w_o = add_parameter("w_o", init_normal({D, D}, o.out_init_std(), device), ParamKind::kAttention,
                      ParamGroup::kDecay);
  if (o.bias()) {
    b_o = add_parameter("b_o", init_constant({D}, 0.0, device), ParamKind::kAttention,
                        ParamGroup::kNoDecay);
  }
  // A buffer, not a plain member, so that Module::to() moves it with the parameters (not saved in
  // checkpoints: it follows from the pattern). On the meta device only its shape exists.
  torch::Tensor mask = torch::empty({l, l}, torch::TensorOptions().device(device));
  if (!device.is_meta()) {
    std::vector<float> m(static_cast<size_t>(l * l));
    const float hidden = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < l; ++t)
      for (int64_t s = 0; s < l; ++s)
        m[static_cast<size_t>(t * l + s)] =
            sparse_pattern_allows(o.pattern(), o.block(), o.summary(), t, s) ? 0.0f : hidden;
    mask = torch::from_blob(m.data(), {l, l}, torch::kFloat32).clone().to(device);
  }
  mask_ = register_buffer("mask", mask);
}

std::unique_ptr<MixerState> SparseAttentionImpl::new_state() const {
  return std::make_unique<SparseAttentionState>();
}

torch::Tensor SparseAttentionImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t B = x.size(0), N = x.size(1), D = options_.d_model(), H = options_.n_heads();
  const int64_t d_h = D / H, T = ctx.offset + N;
  CEMFRAC_CHECK(T <= options_.length(),
                "sparse_attention: positions {}..{} exceed the pattern's length {} (model.context)",
                ctx.offset, T - 1, options_.length());
  // 1. Queries, keys, values split into heads (and rotated with RoPE).
  const std::vector<torch::Tensor> qkv = cemfrac::linear(x, w_qkv, b_qkv).chunk(3, -1);
  torch::Tensor q = qkv[0].view({B, N, H, d_h}).transpose(1, 2);  // (B, H, N, d_h)
  torch::Tensor k = qkv[1].view({B, N, H, d_h}).transpose(1, 2);
  torch::Tensor v = qkv[2].view({B, N, H, d_h}).transpose(1, 2);
  if (options_.rope()) {
    q = apply_rope(q, ctx.rope_cos, ctx.rope_sin);
    k = apply_rope(k, ctx.rope_cos, ctx.rope_sin);
  }
  // 2. Decode state: attend over every earlier position too.
  if (ctx.state != nullptr) {
    auto* state = static_cast<SparseAttentionState*>(ctx.state);
    k = state->k.append(k, ctx.offset, ctx.capacity, 2, "sparse_attention");
    v = state->v.append(v, ctx.offset, ctx.capacity, 2, "sparse_attention");
  }
  CEMFRAC_CHECK(k.size(2) == T,
                "sparse_attention: input at position {} without a decode state; "
                "pass the decode state or the whole sequence",
                ctx.offset);
  // 3. Scores under the pattern's mask, softmax, values; merge heads and project.
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d_h)));
  s = s + mask_.narrow(0, ctx.offset, N).narrow(1, 0, T).to(s.options());  // (B, H, N, T)
  const torch::Tensor y = torch::matmul(torch::softmax(s, -1), v);         // (B, H, N, d_h)
  return cemfrac::linear(y.transpose(1, 2).reshape({B, N, D}), w_o, b_o);
}

// As MHA's (the pattern's hidden entries are computed and masked, so counted like the causal half):
// 2 D (3 D) + 2 D D projections, 4 D context for scores and read-out.
double SparseAttentionImpl::forward_flops_per_token(int64_t context) const {
  const double D = double(options_.d_model());
  return 8.0 * D * D + 4.0 * D * double(context);
}

}  // namespace cemfrac

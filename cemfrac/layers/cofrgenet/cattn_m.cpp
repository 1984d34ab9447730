#include "cemfrac/layers/cofrgenet/cattn_m.h"

#include <torch/types.h>

#include <cmath>
#include <string>

#include "cemfrac/core/check.h"
#include "cemfrac/ops/linear.h"

namespace cemfrac {

CAttnMImpl::CAttnMImpl(const CAttnMOptions& o) : options_(o), runtime_(o.ladder(), o.depth()) {
  const int64_t p = o.d_model(), l = o.length(), L = o.ladders(), d = o.depth(), H = o.heads();
  const torch::Device device = o.device();
  TORCH_INTERNAL_ASSERT(p >= 1 && l >= 1 && L >= 1 && d >= 1 && H >= 1 && p % H == 0,
                        "cattn_m: bad sizes");
  // Ladders as in cffn: biases 1 and |w^T x| << 1, so no ladder starts near a pole (spec §2.8).
  const double ladder_std = 0.1 / std::sqrt(static_cast<double>(p));
  for (int64_t k = 1; k <= d; ++k) {
    w_ladder.push_back(add_parameter("w_ladder_" + std::to_string(k),
                                     init_normal({L, p}, ladder_std, device), ParamKind::kAttention,
                                     ParamGroup::kDecay, k));
    if (o.bias()) {
      b_ladder.push_back(add_parameter("b_ladder_" + std::to_string(k),
                                       init_constant({L}, 1.0, device), ParamKind::kAttention,
                                       ParamGroup::kNoDecay, k));
    }
  }
  w_logits = add_parameter("w_logits", init_normal({H, L, l}, o.init_std(), device),
                           ParamKind::kAttention, ParamGroup::kDecay);
  w_v = add_parameter("w_v",
                      init_normal({p, p}, o.out_proj() ? o.init_std() : o.out_init_std(), device),
                      ParamKind::kAttention, ParamGroup::kDecay);
  if (o.out_proj()) {
    w_o = add_parameter("w_o", init_normal({p, p}, o.out_init_std(), device), ParamKind::kAttention,
                        ParamGroup::kDecay);
  }
  z_min = add_state_buffer("z_min", initial_range_min({L}, device));
  z_max = add_state_buffer("z_max", initial_range_max({L}, device));
  // A buffer, not a plain member, so that Module::to() moves it with the parameters (not saved in
  // checkpoints: it follows from l).
  mask_ = register_buffer("mask", causal_logit_mask(l, device));
}

std::unique_ptr<MixerState> CAttnMImpl::new_state() const {
  return std::make_unique<CAttnMState>();
}

void CAttnMImpl::on_train_step(const TrainProgress& progress) {
  runtime_.on_train_step(progress, z_min, z_max);
}

torch::Tensor CAttnMImpl::ladder_inputs(const torch::Tensor& x) const {
  const torch::Tensor w = torch::cat(w_ladder, 0);                                       // (d L, p)
  const torch::Tensor b = b_ladder.empty() ? torch::Tensor() : torch::cat(b_ladder, 0);  // (d L)
  return cemfrac::linear(x, w, b).view(
      {x.size(0), x.size(1), options_.depth(), options_.ladders()});
}

torch::Tensor CAttnMImpl::ladder_outputs(const torch::Tensor& x) {
  return runtime_.range(runtime_.evaluate(ladder_inputs(x)), is_training(), z_min, z_max);
}

torch::Tensor CAttnMImpl::attention(const torch::Tensor& x, int64_t offset) {
  const int64_t N = x.size(1), T = offset + N, l = options_.length();
  CEMFRAC_CHECK(T <= l,
                "cattn_m: positions {}..{} exceed the layer's length l = {}; shorten the input or "
                "build the model with model.cofrgenet.length >= {}",
                offset, T - 1, l, T);
  // Logits over the first T positions: s[b, h, n, t] = sum_j z[b, n, j] F[h, j, t].
  const torch::Tensor z = ladder_outputs(x);                                  // (B, N, L)
  torch::Tensor s = torch::matmul(z.unsqueeze(1), w_logits.narrow(2, 0, T));  // (B, H, N, T)
  // Causal: query offset + n sees positions <= offset + n (masked entries become exact zeros).
  s = s + mask_.narrow(0, offset, N).narrow(1, 0, T).to(s.options());
  return torch::softmax(s, -1);
}

torch::Tensor CAttnMImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t B = x.size(0), N = x.size(1), p = options_.d_model(), H = options_.heads();
  // 1. Attention from the ladders: (B, H, N, T).
  const torch::Tensor a = attention(x, ctx.offset);
  // 2. Values X W^v split into heads; with a decode state, every earlier position's values too.
  torch::Tensor v =
      cemfrac::linear(x, w_v).view({B, N, H, p / H}).transpose(1, 2);  // (B, H, N, p/H)
  if (ctx.state != nullptr) {
    auto* state = static_cast<CAttnMState*>(ctx.state);
    v = state->v.append(v, ctx.offset, ctx.capacity, 2, "cattn_m");  // (B, H, T, p/H)
  }
  CEMFRAC_CHECK(v.size(2) == a.size(3),
                "cattn_m: input at position {} without a decode state; pass "
                "the decode state or the whole sequence",
                ctx.offset);
  // 3. Mix the values, merge the heads, project (option).
  torch::Tensor o = torch::matmul(a, v).transpose(1, 2).reshape({B, N, p});  // (B, N, p)
  if (options_.out_proj()) o = cemfrac::linear(o, w_o);
  return o;
}

// Ladder inputs 2 p d L; logits 2 H L context; values 2 p p; read-out 2 p context; w_o 2 p p
// (option).
double CAttnMImpl::forward_flops_per_token(int64_t context) const {
  const double p = double(options_.d_model()), L = double(options_.ladders()), S = double(context);
  const double d = double(options_.depth()), H = double(options_.heads());
  return 2.0 * p * d * L + 2.0 * H * L * S + 2.0 * p * p * (options_.out_proj() ? 2.0 : 1.0) +
         2.0 * p * S;
}

}  // namespace cemfrac

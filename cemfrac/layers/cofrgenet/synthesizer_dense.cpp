#include "cemfrac/layers/cofrgenet/synthesizer_dense.h"

#include <torch/types.h>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/cofrgenet/ladder_common.h"
#include "cemfrac/ops/linear.h"

namespace cemfrac {

SynthesizerDenseImpl::SynthesizerDenseImpl(const SynthesizerDenseOptions& o) : options_(o) {
  const int64_t p = o.d_model(), l = o.length(), H = o.heads();
  const int64_t h = o.hidden() > 0 ? o.hidden() : p;
  const torch::Device device = o.device();
  TORCH_INTERNAL_ASSERT(p >= 1 && l >= 1 && H >= 1 && p % H == 0 && h % H == 0,
                        "synthesizer_dense: bad sizes");
  const auto decay = ParamGroup::kDecay, no_decay = ParamGroup::kNoDecay;
  const auto kind = ParamKind::kAttention;
  w_1 = add_parameter("w_1", init_normal({h, p}, o.init_std(), device), kind, decay);
  if (o.bias()) b_1 = add_parameter("b_1", init_constant({h}, 0.0, device), kind, no_decay);
  w_2 = add_parameter("w_2", init_normal({H, l, h / H}, o.init_std(), device), kind, decay);
  if (o.bias()) b_2 = add_parameter("b_2", init_constant({H, l}, 0.0, device), kind, no_decay);
  w_v = add_parameter("w_v", init_normal({p, p}, o.init_std(), device), kind, decay);
  if (o.bias()) b_v = add_parameter("b_v", init_constant({p}, 0.0, device), kind, no_decay);
  w_o = add_parameter("w_o", init_normal({p, p}, o.out_init_std(), device), kind, decay);
  if (o.bias()) b_o = add_parameter("b_o", init_constant({p}, 0.0, device), kind, no_decay);
  // A buffer, not a plain member, so that Module::to() moves it with the parameters (not saved in
  // checkpoints: it follows from l).
  mask_ = register_buffer("mask", causal_logit_mask(l, device));
}

std::unique_ptr<MixerState> SynthesizerDenseImpl::new_state() const {
  return std::make_unique<SynthesizerDenseState>();
}

torch::Tensor SynthesizerDenseImpl::attention(const torch::Tensor& x, int64_t offset) const {
  const int64_t N = x.size(1), T = offset + N, l = options_.length();
  CEMFRAC_CHECK(T <= l,
                "synthesizer_dense: positions {}..{} exceed the layer's length l = {}; shorten the "
                "input or build the model with model.cofrgenet.length >= {}",
                offset, T - 1, l, T);
  const int64_t B = x.size(0), H = options_.heads();
  torch::Tensor hidden = torch::relu(cemfrac::linear(x, w_1, b_1));  // (B, N, h)
  // Head k reads its slice of the hidden layer: (B, H, N, h/H) x (H, h/H, T) -> (B, H, N, T),
  // logits over the first T positions.
  hidden = hidden.view({B, N, H, hidden.size(-1) / H}).transpose(1, 2);
  torch::Tensor s = torch::matmul(hidden, w_2.narrow(1, 0, T).transpose(1, 2));
  if (b_2.defined()) s = s + b_2.narrow(1, 0, T).unsqueeze(1);
  s = s + mask_.narrow(0, offset, N).narrow(1, 0, T).to(s.options());
  return torch::softmax(s, -1);
}

torch::Tensor SynthesizerDenseImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t B = x.size(0), N = x.size(1), p = options_.d_model(), H = options_.heads();
  const torch::Tensor a = attention(x, ctx.offset);  // (B, H, N, T)
  torch::Tensor v =
      cemfrac::linear(x, w_v, b_v).view({B, N, H, p / H}).transpose(1, 2);  // (B, H, N, p/H)
  if (ctx.state != nullptr) {
    auto* state = static_cast<SynthesizerDenseState*>(ctx.state);
    v = state->v.append(v, ctx.offset, ctx.capacity, 2, "synthesizer_dense");  // (B, H, T, p/H)
  }
  CEMFRAC_CHECK(v.size(2) == a.size(3),
                "synthesizer_dense: input at position {} without a decode "
                "state; pass the decode state or the whole sequence",
                ctx.offset);
  const torch::Tensor o = torch::matmul(a, v).transpose(1, 2).reshape({B, N, p});
  return cemfrac::linear(o, w_o, b_o);
}

// w_1 2 h p; logits 2 h context (head k: its h / H hidden units against context columns of w_2);
// values 2 p p; read-out 2 p context; w_o 2 p p.
double SynthesizerDenseImpl::forward_flops_per_token(int64_t context) const {
  const double p = double(options_.d_model()), S = double(context);
  const double h = double(options_.hidden() > 0 ? options_.hidden() : options_.d_model());
  return 2.0 * h * p + 2.0 * h * S + 4.0 * p * p + 2.0 * p * S;
}

}  // namespace cemfrac

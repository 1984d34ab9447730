#include "cemfrac/layers/cofrgenet/cattn_u.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <string>

#include "cemfrac/core/check.h"

namespace cemfrac {

CAttnUImpl::CAttnUImpl(const CAttnUOptions& o) : options_(o), runtime_(o.ladder(), o.depth() - 1) {
  const int64_t l = o.length(), d = o.depth();
  const torch::Device device = o.device();
  TORCH_INTERNAL_ASSERT(l >= 1 && d >= 1 && o.d_model() >= 1, "cattn_u: bad sizes");
  // Linear term w_0 = 1 (small noise breaks the symmetry of the two ensembles). Fraction levels:
  // with biases 1, a_k = 1 + w_k x with |w_k x| << 1 (no pole, spec §2.8); without, a_k = w_k x,
  // w_k ~ 1.
  w_pos_0 = add_parameter("w_pos_0", init_normal({2, l}, 0.02, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  if (!w_pos_0.is_meta()) {
    torch::NoGradGuard no_grad;
    w_pos_0.add_(1.0);
  }
  for (int64_t k = 1; k < d; ++k) {
    torch::Tensor w = init_normal({2, l}, 0.1, device);
    if (!o.bias() && !w.is_meta()) {
      torch::NoGradGuard no_grad;
      w.add_(1.0);
    }
    w_pos.push_back(add_parameter("w_pos_" + std::to_string(k), w, ParamKind::kAttention,
                                  ParamGroup::kNoDecay, k));
    if (o.bias()) {
      b_pos.push_back(add_parameter("b_pos_" + std::to_string(k),
                                    init_constant({2, l}, 1.0, device), ParamKind::kAttention,
                                    ParamGroup::kNoDecay, k));
    }
  }
  // Packed lower triangles, row j = T[j, 0..j] at offset j (j + 1) / 2; init: the causal mean.
  const int64_t packed = l * (l + 1) / 2;
  // On the meta device (shapes only: `cemfrac params`) nothing of size l^2 is built on the host.
  torch::Tensor t = torch::empty({2, packed}, torch::TensorOptions().device(device));
  if (!device.is_meta()) {
    std::vector<float> mean(static_cast<size_t>(packed));
    for (int64_t j = 0, e = 0; j < l; ++j) {
      for (int64_t i = 0; i <= j; ++i, ++e) mean[static_cast<size_t>(e)] = 1.0f / float(j + 1);
    }
    torch::NoGradGuard no_grad;
    t.copy_(torch::from_blob(mean.data(), {1, packed}, torch::kFloat32).expand({2, packed}));
  }
  t_mix = add_parameter("t_mix", t, ParamKind::kAttention, ParamGroup::kDecay);
  z_min = add_state_buffer("z_min", initial_range_min({2, l, 1}, device));
  z_max = add_state_buffer("z_max", initial_range_max({2, l, 1}, device));
}

std::unique_ptr<MixerState> CAttnUImpl::new_state() const {
  return std::make_unique<CAttnUState>();
}

void CAttnUImpl::on_train_step(const TrainProgress& progress) {
  runtime_.on_train_step(progress, z_min, z_max);
}

torch::Tensor CAttnUImpl::mixing(int64_t n) const {
  const int64_t m = n * (n + 1) / 2;
  // Rows 0..n-1 of the packed triangles are its first m = n (n + 1) / 2 entries; T[j, i] sits at
  // j (j + 1) / 2 + i for i <= j. The index is built where t_mix lives (no host tensor to move),
  // and the entries above the diagonal read an appended exact zero at index m.
  const torch::TensorOptions index = t_mix.options().dtype(torch::kInt64);
  const torch::Tensor j = torch::arange(n, index).unsqueeze(1), i = torch::arange(n, index);
  const torch::Tensor at =
      torch::where(i <= j, torch::div(j * (j + 1), 2, "floor") + i, torch::full({}, m, index));
  const torch::Tensor packed =
      torch::cat({t_mix.narrow(1, 0, m), torch::zeros({2, 1}, t_mix.options())}, 1);
  return packed.index_select(1, at.reshape({-1})).view({2, n, n});
}

torch::Tensor CAttnUImpl::ladder_inputs(const torch::Tensor& x, int64_t offset) const {
  const int64_t B = x.size(0), n = x.size(1), p = x.size(2), levels = options_.depth() - 1;
  // (levels, 2, n) -> (n, levels, 2, 1): one scalar per position, level and ensemble.
  const torch::Tensor w =
      torch::stack(w_pos, 0).narrow(2, offset, n).permute({2, 0, 1}).unsqueeze(-1);
  torch::Tensor a = x.reshape({B, n, 1, 1, p}) * w;  // (B, n, levels, 2, p)
  if (!b_pos.empty())
    a = a + torch::stack(b_pos, 0).narrow(2, offset, n).permute({2, 0, 1}).unsqueeze(-1);
  return a.reshape({B, n, levels, 2 * p});
}

torch::Tensor CAttnUImpl::ladder_outputs(const torch::Tensor& x, int64_t offset) const {
  const int64_t B = x.size(0), n = x.size(1), p = x.size(2);
  // Linear term w_0[i] X[b, i, c] in the (B, 2, n, p) layout of the mixing product.
  torch::Tensor y = x.unsqueeze(1) * w_pos_0.narrow(1, offset, n).unsqueeze(-1);  // (B, 2, n, p)
  if (options_.depth() >= 2) {
    torch::Tensor f = runtime_.evaluate(ladder_inputs(x, offset));  // (B, n, 2 p)
    f = f.reshape({B, n, 2, p}).permute({0, 2, 1, 3});              // (B, 2, n, p)
    f = runtime_.range(f, is_training(), z_min.narrow(1, offset, n), z_max.narrow(1, offset, n));
    y = y + f;
  }
  return y;
}

torch::Tensor CAttnUImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t N = x.size(1), l = options_.length();
  const int64_t T = ctx.offset + N;
  CEMFRAC_CHECK(T <= l,
                "cattn_u: positions {}..{} exceed the layer's length l = {}; shorten the input or "
                "build the model with model.cofrgenet.length >= {}",
                ctx.offset, T - 1, l, T);
  // 1. Both ladder ensembles, position-wise: Y (B, 2, N, p).
  torch::Tensor y = ladder_outputs(x, ctx.offset);
  // 2. With a decode state, mix over every earlier position's Y too.
  if (ctx.state != nullptr) {
    auto* state = static_cast<CAttnUState*>(ctx.state);
    y = state->y.append(y, ctx.offset, ctx.capacity, 2, "cattn_u");  // (B, 2, T, p)
  }
  // 3. Causal token mixing Z = T Y (rows offset..T-1 of the lower triangles), then Z1 * Z2.
  // Without a state the earlier positions are unknown: only a whole sequence (offset 0) works.
  CEMFRAC_CHECK(y.size(2) == T,
                "cattn_u: input at position {} without a decode state; pass the "
                "decode state or the whole sequence",
                ctx.offset);
  torch::Tensor t = mixing(T);                         // (2, T, T)
  if (ctx.offset > 0) t = t.narrow(1, ctx.offset, N);  // (2, N, T)
  const torch::Tensor z = torch::matmul(t, y);         // (B, 2, N, p)
  return z.select(1, 0) * z.select(1, 1);              // (B, N, p)
}

// Position weights w_0..w_(d-1) on every channel of both ensembles: 2 (2 d p); token mixing Z = T Y
// of both ensembles: 2 (2 p context).
double CAttnUImpl::forward_flops_per_token(int64_t context) const {
  const double p = double(options_.d_model()), d = double(options_.depth());
  return 4.0 * d * p + 4.0 * p * double(context);
}

}  // namespace cemfrac

#include "cemfrac/layers/cofrgenet/cffn.h"
#include "cemfrac/ops/linear.h"

#include <torch/types.h>

#include <cmath>
#include <string>

namespace cemfrac {

CffnImpl::CffnImpl(const CffnOptions& o) : options_(o), runtime_(o.ladder(), o.depth()) {
  const int64_t p = o.d_model(), L = o.ladders(), d = o.depth();
  const torch::Device device = o.device();
  TORCH_INTERNAL_ASSERT(p >= 1 && L >= 1 && d >= 1, "cffn: bad sizes");
  w_gate = add_parameter("w_gate", init_normal({p, p}, o.init_std(), device), ParamKind::kFfn,
                         ParamGroup::kDecay);
  if (o.glu()) {
    w_up = add_parameter("w_up", init_normal({p, p}, o.init_std(), device), ParamKind::kFfn,
                         ParamGroup::kDecay);
  } else {
    w_direct = add_parameter("w_direct", init_normal({p, p}, o.out_init_std(), device),
                             ParamKind::kFfn, ParamGroup::kDecay);
  }
  // Ladder rows: |w^T x̂| well below 1 on normalised inputs and biases 1, so every a_k starts near 1
  // and no ladder starts near a pole (spec §2.8): p-variate N(0, (0.1 / sqrt(p))^2), univariate
  // N(0, 0.1^2).
  const double ladder_std = o.univariate() ? 0.1 : 0.1 / std::sqrt(static_cast<double>(p));
  const std::vector<int64_t> bias_shape =
      o.univariate() ? std::vector<int64_t>{L, p} : std::vector<int64_t>{L};
  for (int64_t k = 1; k <= d; ++k) {
    w_ladder.push_back(add_parameter("w_ladder_" + std::to_string(k),
                                     init_normal({L, p}, ladder_std, device), ParamKind::kFfn,
                                     ParamGroup::kDecay, k));
    if (o.bias()) {
      b_ladder.push_back(add_parameter("b_ladder_" + std::to_string(k),
                                       init_constant(bias_shape, 1.0, device), ParamKind::kFfn,
                                       ParamGroup::kNoDecay, k));
    }
  }
  w_out = add_parameter("w_out", init_normal({p, L}, o.out_init_std(), device), ParamKind::kFfn,
                        ParamGroup::kDecay);
  z_min = add_state_buffer("z_min", initial_range_min(bias_shape, device));
  z_max = add_state_buffer("z_max", initial_range_max(bias_shape, device));
}

void CffnImpl::on_train_step(const TrainProgress& progress) {
  runtime_.on_train_step(progress, z_min, z_max);
}

torch::Tensor CffnImpl::gated(const torch::Tensor& x) const {
  torch::Tensor g = cemfrac::linear(x, w_gate);  // (B, N, p)
  g = options_.gate() == CffnGate::kSilu ? torch::silu(g) : torch::sigmoid(g);
  return options_.glu() ? g * cemfrac::linear(x, w_up) : x * g;
}

torch::Tensor CffnImpl::ladder_inputs(const torch::Tensor& x_hat) const {
  const int64_t d = options_.depth(), L = options_.ladders(), p = options_.d_model();
  if (!options_.univariate()) {
    // One GEMM for all depths: rows of W stacked depth-major, so (.., d L) views as (.., d, L).
    const torch::Tensor w = torch::cat(w_ladder, 0);  // (d L, p)
    const torch::Tensor b = b_ladder.empty() ? torch::Tensor() : torch::cat(b_ladder, 0);  // (d L)
    torch::Tensor a = cemfrac::linear(x_hat, w, b);  // (.., d L)
    std::vector<int64_t> shape = x_hat.sizes().vec();
    shape.back() = d;
    shape.push_back(L);
    return a.view(shape);  // (.., d, L)
  }
  // a[.., k, j, i] = W_k[j, i] x̂_i + b_k[j, i]: L p independent fractions per row.
  torch::Tensor a = x_hat.unsqueeze(-2).unsqueeze(-2) * torch::stack(w_ladder, 0);  // (.., d, L, p)
  if (!b_ladder.empty()) a = a + torch::stack(b_ladder, 0);
  std::vector<int64_t> shape = x_hat.sizes().vec();
  shape.back() = d;
  shape.push_back(L * p);
  return a.reshape(shape);  // (.., d, L p)
}

torch::Tensor CffnImpl::forward(const torch::Tensor& x) {
  const int64_t L = options_.ladders(), p = options_.d_model();
  // 1. Gate (no expansion): x̂ (B, N, p).
  const torch::Tensor x_hat = gated(x);
  // 2. Ladders: partial denominators, then one continued fraction per ladder.
  const torch::Tensor a = ladder_inputs(x_hat);  // (B, N, d, L) or (B, N, d, L p)
  torch::Tensor z = runtime_.evaluate(a);        // (B, N, L) or (B, N, L p)
  // 3. Combine: y = U x̂ (or U x) + V z.
  torch::Tensor y;
  if (!options_.univariate()) {
    z = runtime_.range(z, is_training(), z_min, z_max);
    y = cemfrac::linear(z, w_out);  // (B, N, p)
  } else {
    std::vector<int64_t> shape = z.sizes().vec();
    shape.back() = L;
    shape.push_back(p);
    z = runtime_.range(z.view(shape), is_training(), z_min, z_max);  // (B, N, L, p)
    y = (z * w_out.t()).sum(-2);                                     // y_i = sum_j V[i, j] z_{j, i}
  }
  if (!options_.glu()) y = y + cemfrac::linear(options_.direct_raw() ? x : x_hat, w_direct);
  return y;
}

// Gate G 2 p p (+ G2 2 p p with glu); U 2 p p (without glu); ladder inputs 2 d L p (a matrix per
// depth, or L p weights per depth when univariate: the same count); read-out V 2 L p.
double CffnImpl::forward_flops_per_token() const {
  const double p = double(options_.d_model()), L = double(options_.ladders()),
               d = double(options_.depth());
  return 4.0 * p * p + 2.0 * d * L * p + 2.0 * L * p;
}

}  // namespace cemfrac

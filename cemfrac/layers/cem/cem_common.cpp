#include "cemfrac/layers/cem/cem_common.h"

#include <torch/types.h>

#include <algorithm>
#include <cmath>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

// torch::nn::functional::softplus with its default options: the ATen op it calls, with the beta and
// threshold it passes.
torch::Tensor default_softplus(const torch::Tensor& x) {
  return torch::softplus(x, /*beta=*/1.0, /*threshold=*/20.0);
}

}  // namespace

torch::Tensor CemProx::gradient(const torch::Tensor& x, const torch::Tensor& anchor) const {
  const torch::Tensor diff = x - anchor;
  return raw.defined() ? default_softplus(raw) * diff : diff;
}

torch::Tensor CemProx::energy(const torch::Tensor& x, const torch::Tensor& anchor) const {
  const torch::Tensor sq = 0.5 * (x - anchor).pow(2).sum(-1);
  return raw.defined() ? default_softplus(raw) * sq : sq;
}

double CemProx::value() const {
  if (!on) return 0.0;
  if (!raw.defined()) return 1.0;
  return default_softplus(raw.detach().to(torch::kFloat64)).item<double>();
}

torch::Tensor cem_rms(const torch::Tensor& h) {
  return h.pow(2).mean(-1, /*keepdim=*/true).sqrt();
}

torch::Tensor cem_rescale_to(const torch::Tensor& x, const torch::Tensor& rms_h) {
  // A row of zeros stays zero (its RMS is clamped away from 0).
  return x * (rms_h / cem_rms(x).clamp_min(1e-30));
}

void CemEnergyTrace::add(int64_t t, const torch::Tensor& energy) {
  if (static_cast<int64_t>(sum.size()) <= t) sum.resize(t + 1, 0.0);
  sum[t] += energy.to(torch::kFloat64).mean().item<double>();
  if (t == 0) ++forwards;
}

std::vector<double> CemEnergyTrace::mean() const {
  std::vector<double> out(sum);
  for (double& v : out) v /= double(std::max<int64_t>(forwards, 1));
  return out;
}

double softplus_inverse_of_one() {
  return std::log(std::exp(1.0) - 1.0);
}

double softplus_inverse(double y) {
  return y + std::log(-std::expm1(-y));
}

CemPreconditionerImpl::CemPreconditionerImpl(int64_t d_model, int64_t rank, bool psd_,
                                             ParamKind kind, torch::Device device)
    : psd(psd_) {
  // p and the diagonal are a per-channel step size: no weight decay (like eta). U, V are matrices:
  // decay pulls U V^T towards 0, i.e. P towards its diagonal, the neutral point it starts from.
  p = add_parameter("p", init_constant({d_model}, softplus_inverse_of_one(), device), kind,
                    ParamGroup::kNoDecay);
  u = add_parameter("u", init_normal({d_model, rank}, 0.02, device), kind, ParamGroup::kDecay);
  if (!psd) {
    v = add_parameter("v", init_constant({d_model, rank}, 0.0, device), kind, ParamGroup::kDecay);
  }
}

torch::Tensor CemPreconditionerImpl::apply(const torch::Tensor& g) const {
  torch::Tensor out = default_softplus(p) * g;                       // (..., D)
  torch::Tensor gu = torch::matmul(g, u);                            // (..., r) = U^T g
  if (psd) return out + torch::matmul(gu, u.t());                    // + U U^T g
  torch::Tensor gv = torch::matmul(g, v);                            // (..., r) = V^T g
  return out + torch::matmul(gv, u.t()) + torch::matmul(gu, v.t());  // + U V^T g + V U^T g
}

torch::Tensor CemPreconditionerImpl::dense() const {
  torch::Tensor P = torch::diag(default_softplus(p));
  if (psd) return P + u.matmul(u.t());
  return P + u.matmul(v.t()) + v.matmul(u.t());
}

torch::Tensor CemStepSize::advance(const torch::Tensor& x, const torch::Tensor& d) const {
  if (!raw.defined()) return x + d;
  return x + default_softplus(raw) * d;
}

torch::Tensor CemStepSize::scale(const torch::Tensor& d) const {
  if (!raw.defined()) return d;
  return default_softplus(raw) * d;
}

double CemStepSize::value() const {
  if (!raw.defined()) return 1.0;
  return default_softplus(raw.detach().to(torch::kFloat64)).item<double>();
}

torch::Tensor cem_phi(const torch::Tensor& u_in) {
  // Li2(-e^u) through sigma(u) = e^u / (1 + e^u) and Landen's identity
  //   Li2(z) = -Li2(z / (z - 1)) - log(1 - z)^2 / 2,   z = -e^u  =>  z / (z - 1) = sigma(u),
  // and for u > 0 the inversion Li2(-e^u) = -pi^2/6 - u^2/2 - Li2(-e^-u), so the series below
  // always runs on w = sigma(-|u|) <= 1/2: sum_k w^k / k^2, 60 terms leave < 2^-60.
  const torch::Tensor u = u_in.to(torch::kFloat64);
  const double pi2 = M_PI * M_PI;
  const torch::Tensor a = torch::where(u > 0, -u, u);  // -|u| (slope +-1 at 0 too)
  const torch::Tensor w = torch::sigmoid(a);           // <= 1/2
  const torch::Tensor sp = default_softplus(a);        // log(1 + e^-|u|)
  torch::Tensor series = torch::zeros_like(w), power = torch::ones_like(w);
  for (int k = 1; k <= 60; ++k) {
    power = power * w;
    series = series + power / double(k * k);
  }
  const torch::Tensor li2_neg = -series - 0.5 * sp * sp;  // Li2(-e^-|u|)
  // u <= 0: Li2(-e^u) = li2_neg; u > 0: -pi^2/6 - u^2/2 - li2_neg.
  const torch::Tensor li2 = torch::where(u > 0, -pi2 / 6.0 - 0.5 * u * u - li2_neg, li2_neg);
  const torch::Tensor phi = u * default_softplus(u) + li2 + pi2 / 12.0;
  return phi.to(u_in.scalar_type());
}

double cem_precond_flops_per_token(const CemStepOptions& step, int64_t d_model) {
  if (!step.precond()) return 0.0;
  const double D = double(d_model), r = double(step.precond_rank());
  return 2.0 * D + (step.precond_psd() ? 4.0 : 8.0) * D * r;
}

}  // namespace cemfrac

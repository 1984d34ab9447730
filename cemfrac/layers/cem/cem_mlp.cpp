#include "cemfrac/layers/cem/cem_mlp.h"

#include <torch/types.h>

#include <string>

#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/silu_mul.h"

namespace cemfrac {

CemMlpImpl::CemMlpImpl(const CemMlpOptions& o) : options_(o) {
  const int64_t D = o.d_model(), M = o.d_ff();
  const torch::Device device = o.device();
  w_u = add_parameter("w_u", init_normal({M, D}, o.init_std(), device), ParamKind::kFfn,
                      ParamGroup::kDecay);
  w_g = add_parameter("w_g", init_normal({M, D}, o.init_std(), device), ParamKind::kFfn,
                      ParamGroup::kDecay);
  if (o.step().learn_eta() && !o.step().precond()) {
    eta_.raw =
        add_parameter("eta_raw", init_constant({1}, softplus_inverse(o.step().eta_init()), device),
                      ParamKind::kFfn, ParamGroup::kNoDecay);
  }
  prox_.on = o.step().prox() != CemProxMode::kNone;
  if (o.step().prox() == CemProxMode::kLearned) {
    prox_.raw = add_parameter("lambda_raw", init_constant({1}, softplus_inverse_of_one(), device),
                              ParamKind::kFfn, ParamGroup::kNoDecay);
  }
  if (o.step().precond()) {
    precond_ = register_module("precond", std::make_shared<CemPreconditionerImpl>(
                                              D, o.step().precond_rank(), o.step().precond_psd(),
                                              ParamKind::kFfn, device));
  }
}

torch::Tensor CemMlpImpl::condition(const torch::Tensor& h) {
  ++gate_projections_;
  torch::Tensor g = cemfrac::linear(h, w_g);  // (B, N, M)
  return options_.form_b() ? torch::silu(g) : g;
}

torch::Tensor CemMlpImpl::direction(const torch::Tensor& x, const torch::Tensor& gate,
                                    const torch::Tensor& anchor) const {
  torch::Tensor u = cemfrac::linear(x, w_u);  // (B, N, M): the only projection repeated per step
  torch::Tensor hidden = options_.form_b() ? gate * u : silu_mul(u, gate);  // fused (ops/)
  torch::Tensor d = torch::matmul(hidden, w_u);  // (B, N, D): W_U^T, the same tensor
  if (prox_.on && anchor.defined()) d = d - prox_.gradient(x, anchor);  // - lambda (x - h)
  if (precond_) d = precond_->apply(d);
  return d;
}

torch::Tensor CemMlpImpl::step(const torch::Tensor& x, const torch::Tensor& gate,
                               const torch::Tensor& anchor) const {
  return eta_.advance(x, direction(x, gate, anchor));
}

torch::Tensor CemMlpImpl::forward(const torch::Tensor& h) {
  const torch::Tensor gate = condition(h);  // once
  // T = 1: the displacement is eta d itself (no h + eta d - h round trip). The proximal term's
  // gradient is 0 at x = h and step_norm starts at the second step, so neither changes T = 1.
  const bool trace = observer_ != nullptr;
  if (options_.step().steps() == 1 && !trace) return eta_.scale(direction(h, gate));
  auto report = [&](int64_t t, const torch::Tensor& e) {
    (*observer_)("energy." + std::to_string(t), e.detach());
  };
  torch::Tensor x = h;
  const torch::Tensor rms_h = options_.step().step_norm() ? cem_rms(h) : torch::Tensor();
  if (trace) report(0, energy(x, h));
  for (int64_t t = 0; t < options_.step().steps(); ++t) {
    if (t > 0 && rms_h.defined()) x = cem_rescale_to(x, rms_h);
    x = step(x, gate, h);
    if (trace) report(t + 1, energy(x, h));
  }
  return x - h;
}

torch::Tensor CemMlpImpl::energy(const torch::Tensor& x, const torch::Tensor& h) const {
  torch::Tensor g = cemfrac::linear(h, w_g);  // (B, N, M)
  torch::Tensor u = cemfrac::linear(x, w_u);  // (B, N, M)
  torch::Tensor e =
      options_.form_b() ? -0.5 * (torch::silu(g) * u * u).sum(-1) : -(g * cem_phi(u)).sum(-1);
  if (prox_.on) e = e + prox_.energy(x, h);
  return e;
}

// The gate W_G h once (2 D M); per step W_U x and the read-out W_U^T (2 D M each) and P.
double CemMlpImpl::forward_flops_per_token() const {
  const double D = double(options_.d_model()), M = double(options_.d_ff());
  const double T = double(options_.step().steps());
  return 2.0 * D * M +
         T * (4.0 * D * M + cem_precond_flops_per_token(options_.step(), options_.d_model()));
}

}  // namespace cemfrac

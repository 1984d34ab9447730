// FFN "cem_mlp": causal energy minimisation with an element-wise energy and tied projections
// (docs/layers/cem.md, CEM spec §2.4). With the fixed input h and the iterate x (x^(0) = h):
//   option A (default):  E_i = -sum_m (W_G h_i)_m Phi((W_U x_i)_m),  Phi' = SiLU
//                         x <- x + eta P W_U^T [SiLU(W_U x) * (W_G h)]
//   option B:            E_i = -1/2 sum_m SiLU((W_G h_i)_m) (W_U x_i)_m^2
//                         x <- x + eta P W_U^T [SiLU(W_G h) * (W_U x)]
// The gate G = W_G h (option B: SiLU(W_G h)) is computed once and reused by every step; only W_U x
// is recomputed. Returns x^(T) - h. At T = 1, eta = 1, P = I option A is SwiGLU with w_gate = W_U,
// w_up = W_G, w_down = W_U^T; option B is SwiGLU with w_gate = W_G, w_up = W_U, w_down = W_U^T.
// Parameters (checkpoint keys under blocks.<l>.mlp.):
//   w_u (M, D)        the projection inside the nonlinearity (A) and, transposed, the read-out
//   w_g (M, D)        the gate projection, applied to h only
//   eta_raw (1)       eta = softplus(eta_raw), when learnable
//   lambda_raw (1)    lambda = softplus(lambda_raw) of the proximal term (cem.prox = learned)
//   precond.p (D), precond.u (D, r), precond.v (D, r)   the preconditioner (v absent when psd)
// Reports to its observer (FfnImpl::set_observer; cemfrac eval --cem-energy): "energy.<t>" (B, N),
// the energy before step 1 (t = 0) and after step t; observing it costs one energy per step.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/cem/cem_common.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct CemMlpOptions {
  CemMlpOptions(int64_t d_model, int64_t d_ff) : d_model_(d_model), d_ff_(d_ff) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, d_ff);
  TORCH_ARG(bool, form_b) = false;
  TORCH_ARG(CemStepOptions, step) = CemStepOptions();
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

class CemMlpImpl : public FfnImpl {
 public:
  explicit CemMlpImpl(const CemMlpOptions& options);

  // h (B, N, D) normalised input -> x^(T) - h (B, N, D).
  torch::Tensor forward(const torch::Tensor& h) override;
  double forward_flops_per_token() const override;

  // The pieces of forward, public for tests and diagnostics.
  // The gate from h, once: (B, N, M); W_G h (A) or SiLU(W_G h) (B).
  torch::Tensor condition(const torch::Tensor& h);
  // -P grad_x E(x; h) for the iterate x (B, N, D), given the gate; with cem.prox and an anchor h,
  // the gradient includes the proximal term's lambda (x - h).
  torch::Tensor direction(const torch::Tensor& x, const torch::Tensor& gate,
                          const torch::Tensor& anchor = torch::Tensor()) const;
  // One step x + eta (-P grad E).
  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& gate,
                     const torch::Tensor& anchor = torch::Tensor()) const;
  // The closed-form energy E_i(x_i; h_i) per position, (B, N) (option A through cem_phi), plus
  // 1/2 lambda |x_i - h_i|^2 with cem.prox.
  torch::Tensor energy(const torch::Tensor& x, const torch::Tensor& h) const;

  const CemMlpOptions& options() const { return options_; }
  void set_steps(int64_t steps) { options_.step().steps(steps); }
  double eta() const { return eta_.value(); }
  double prox_lambda() const { return prox_.value(); }  // 0 without cem.prox
  void set_step_norm(bool on) { options_.step().step_norm(on); }
  int64_t gate_projections() const { return gate_projections_; }  // calls of h -> W_G h so far
  const CemPreconditionerImpl* preconditioner() const { return precond_.get(); }

  torch::Tensor w_u, w_g;

 private:
  CemMlpOptions options_;
  CemStepSize eta_;
  CemProx prox_;
  std::shared_ptr<CemPreconditionerImpl> precond_;
  int64_t gate_projections_ = 0;
};

}  // namespace cemfrac

// Pieces shared by the CEM sub-layers (docs/layers/cem.md): the options every CEM sub-layer has,
// the learned preconditioner P = diag(softplus(p)) + U V^T + V U^T (or diag(softplus(p)) + U U^T),
// the step size eta = softplus(eta_raw), and the MLP energy's primitive Phi(u) = int_0^u s sigma(s)
// ds.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cemfrac/layers/cem/cem_config.h"
#include "cemfrac/layers/param_tags.h"

namespace cemfrac {

// Options common to cem_attention and cem_mlp.
struct CemStepOptions {
  TORCH_ARG(int64_t, steps) = 1;      // T
  TORCH_ARG(bool, learn_eta) = true;  // eta = softplus(eta_raw) learnable; false: eta = 1
  TORCH_ARG(double, eta_init) = 1.0;  // the learnable eta at init (eta_raw = softplus^-1 of it)
  TORCH_ARG(bool, precond) = false;   // apply P to every step's direction
  TORCH_ARG(int64_t, precond_rank) = 16;
  TORCH_ARG(bool, precond_psd) = false;
  // The proximal term 1/2 lambda |x - h|^2 added to the energy (docs/layers/cem.md §8.2): none,
  // lambda = softplus(lambda_raw) learnable (init 1), or lambda = 1 fixed.
  TORCH_ARG(CemProxMode, prox) = CemProxMode::kNone;
  // Rescale the iterate to h's per-token RMS before every step after the first (§8.3).
  TORCH_ARG(bool, step_norm) = false;
};

// P as a module with parameters "p" (D), "u" (D, r) and, unless psd, "v" (D, r). At init P = I
// exactly: softplus(p) = 1, U ~ N(0, 0.02^2), V = 0 (psd: P = I + U U^T, about I; U = 0 would never
// receive a gradient).
// Model FLOPs per token of applying P once (0 without a preconditioner): softplus(p) * g 2 D, then
// U^T g and U (.) (psd) 4 D r, or U^T g, V^T g and both products back 8 D r.
double cem_precond_flops_per_token(const CemStepOptions& step, int64_t d_model);

class CemPreconditionerImpl : public TaggedModule {
 public:
  CemPreconditionerImpl(int64_t d_model, int64_t rank, bool psd, ParamKind kind,
                        torch::Device device);
  // P g for g (..., D), without forming P: softplus(p) * g + (g V) U^T + (g U) V^T  (psd: (g U)
  // U^T).
  torch::Tensor apply(const torch::Tensor& g) const;
  // The D x D matrix (tests only).
  torch::Tensor dense() const;

  torch::Tensor p, u, v;
  bool psd;
};

// The learnable step size: registers "eta_raw" (1,) initialised to log(e - 1) so softplus gives 1.
// eta() returns softplus(eta_raw), or the constant 1 (undefined tensor) when not learnable.
struct CemStepSize {
  torch::Tensor raw;  // undefined when eta is fixed at 1
  // x + eta * d
  torch::Tensor advance(const torch::Tensor& x, const torch::Tensor& d) const;
  // eta * d
  torch::Tensor scale(const torch::Tensor& d) const;
  double value() const;  // eta as a number (tests, logging)
};

// The proximal term's weight lambda: "lambda_raw" (1,) with lambda = softplus(lambda_raw), init 1,
// or the constant 1 (raw undefined); `on` false when there is no proximal term.
struct CemProx {
  bool on = false;
  torch::Tensor raw;  // learned only
  // lambda (x - anchor): the term's gradient (x, anchor (B, N, D)).
  torch::Tensor gradient(const torch::Tensor& x, const torch::Tensor& anchor) const;
  // 1/2 lambda |x - anchor|^2 per position, (B, N).
  torch::Tensor energy(const torch::Tensor& x, const torch::Tensor& anchor) const;
  double value() const;  // lambda as a number (0 when off)
};

// step_norm: x * rms(h) / rms(x) per token (rms over the last dimension), so the iterate keeps the
// RMS of the sub-layer's input.
torch::Tensor cem_rescale_to(const torch::Tensor& x, const torch::Tensor& rms_h);
// rms(h) per token, (B, N, 1).
torch::Tensor cem_rms(const torch::Tensor& h);

// A diagnostic: the mean energy (over batch and positions) before the first step and after every
// step, summed over the forwards made while enabled (full sequences only; decoding is skipped).
struct CemEnergyTrace {
  bool enabled = false;
  std::vector<double> sum;  // [t] for t = 0..T
  int64_t forwards = 0;
  void add(int64_t t, const torch::Tensor& energy);  // energy (B, N)
  std::vector<double> mean() const;                  // sum / forwards
};

// log(e - 1): softplus of it is exactly 1 (to rounding).
double softplus_inverse_of_one();
// softplus^-1(y) = log(exp(y) - 1) for y > 0, computed as y + log(1 - exp(-y)) (no overflow).
double softplus_inverse(double y);

// Phi(u) = int_0^u s sigmoid(s) ds = u softplus(u) + Li2(-e^u) + pi^2/12, element-wise, computed in
// float64 (the result has u's dtype). Phi' = SiLU; differentiable by autograd to rounding.
torch::Tensor cem_phi(const torch::Tensor& u);

}  // namespace cemfrac

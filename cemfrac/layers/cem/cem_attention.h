// Mixer "cem_attention": causal energy minimisation with the conditional log-sum-exp energy
// (docs/layers/cem.md, CEM spec §2.3, §2.5, §3):
//     E_i(x_i; h_1..i) = -1/beta sum_k log sum_{j<=i} exp(beta s_kij)
//     (cem.attention = linear: -1/(2 n_i) sum_k sum_{j<=i} beta s_kij^2, n_i = i + 1),
//     s_kij = (R_i W_Qk x_i)^T (R_j W_Kk h_j)  [+ x_i^T diag(delta_k) h_j]  [- 1/2 |x_i -
//     h_j|^2_delta_k].
// The input is the normalised residual h; the iterate starts at x = h and takes T steps
//     x <- x - eta P grad_x E(x; h),
// each of which is causal attention with queries W_Q x, keys = values = W_K h (computed once) and
// the output projection W_Q^T (the same tensor); the mixer returns x^(T) - h, which the block adds
// to z. At T = 1, eta = 1, P = I, no diagonal it is exactly MHA with W_V = W_K, W_O = W_Q^T, beta =
// 1/sqrt(d_h). Parameters (checkpoint keys under blocks.<l>.attn.):
//   w_q (H d_h, D)    queries; transposed, also the output projection
//   w_k (H d_h, D)    keys; also the values
//   eta_raw (1)       eta = softplus(eta_raw), when learnable (not frozen, no preconditioner)
//   lambda_raw (1)    lambda = softplus(lambda_raw) of the proximal term (cem.prox = learned)
//   delta (H, D)      D+LR diagonal per head (dlr = per_head); (D) when shared
//   precond.p (D), precond.u (D, r), precond.v (D, r)   the preconditioner (v absent when psd)
// Reports to MixerContext::observer, for full sequences without a state (cemfrac eval
// --cem-energy):
//   "energy.<t>"  (B, N) the energy E_i before step 1 (t = 0) and after step t; observing it
//                 costs one energy per step and takes the direct loop.
// Decode state: K (after RoPE) of every position seen, (B, H, T, d_h): half of MHA's K + V; plus
// the inputs h (B, T, D) under D+LR and, only for the naive RoPE ablation, the unrotated keys.
#pragma once
#include <torch/arg.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "cemfrac/layers/cem/cem_common.h"
#include "cemfrac/layers/kv_cache.h"
#include "cemfrac/layers/mixer.h"

namespace cemfrac {

struct CemAttentionOptions {
  CemAttentionOptions(int64_t d_model, int64_t n_heads) : d_model_(d_model), n_heads_(n_heads) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, n_heads);
  TORCH_ARG(bool, rope) = false;  // the model supplies rotary tables (positions = rope)
  TORCH_ARG(CemRopeMode, rope_mode) = CemRopeMode::kExact;
  TORCH_ARG(CemDiagonal, dlr) = CemDiagonal::kNone;
  TORCH_ARG(bool, dlr_distance) = false;
  TORCH_ARG(CemRecursion, recursion) = CemRecursion::kAuto;
  TORCH_ARG(CemRecursionKeys, recursion_keys) = CemRecursionKeys::kFixed;
  TORCH_ARG(CemAttentionKernel, attention) = CemAttentionKernel::kSoftmax;  // kLinear: dlr none
  TORCH_ARG(CemStepOptions, step) = CemStepOptions();
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(torch::Device, device) = torch::kCPU;
};

// The keys one step conditions on, for every position seen so far.
struct CemKeyCache {
  KvCache k;  // (B, H, T, d_h) keys after RoPE (exact mode: also the values)
  KvCache v;  // (B, H, T, d_h) naive RoPE only: the unrotated keys, which are its values
  KvCache h;  // (B, T, D) D+LR only: the conditioning inputs
  int64_t bytes() const { return k.bytes() + v.bytes() + h.bytes(); }
};

// Fixed keys: one CemKeyCache (the base fields, from h). recursion_keys = iterate: step 0's keys
// are still those from h (the base fields); step t >= 1 conditions on the iterates x^(t), cached in
// iterate[t - 1], so the state holds T times the fixed-key cache.
struct CemAttentionState : MixerState, CemKeyCache {
  std::vector<CemKeyCache> iterate;
  int64_t cache_bytes() const override {
    int64_t n = bytes();
    for (const CemKeyCache& c : iterate) n += c.bytes();
    return n;
  }
};

// What one forward computes once from the fixed input h and reuses in every step.
struct CemAttentionCondition {
  int64_t offset = 0;  // absolute position of the first query
  torch::Tensor
      anchor;          // (B, N, D) the sub-layer input h of the queries: the proximal term's centre
  torch::Tensor k, v;  // (B, H, T, d_h) keys and values over all visible positions (v may == k)
  torch::Tensor h;     // (B, T, D) D+LR: conditioning inputs
  torch::Tensor k_aug;  // per-head distance-form D+LR over a full sequence: (B, H, T, d_h + D
                        // + 1) keys [W_K h; h; key bias] (undefined otherwise)
  torch::Tensor v_aug;  // the values beside k_aug, == k_aug except under naive RoPE
  bool per_head_fused = false;  // per-head bilinear D+LR over a full sequence:
                                // causal_attention_head_diag (no k_aug)
  torch::Tensor key_bias;       // distance form without k_aug: -1/2 sum_a delta_(k)a h_ja^2,
                                // (B, 1, 1, T) shared, (B, H, 1, T) per head
  torch::Tensor cos, sin;  // (N, d_h / 2) rotary tables of the query positions (undefined: none)
};

class CemAttentionImpl : public MixerImpl {
 public:
  explicit CemAttentionImpl(const CemAttentionOptions& options);

  // h (B, N, D) normalised input -> x^(T) - h (B, N, D).
  torch::Tensor forward(const torch::Tensor& h, const MixerContext& ctx) override;
  std::unique_ptr<MixerState> new_state() const override;
  double forward_flops_per_token(int64_t context) const override;

  // The pieces of forward, public for tests and diagnostics.
  // Keys (and values, h) from h at positions ctx.offset.., joined to and stored in ctx.state (in
  // the cache of step `step`: 0 = the base fields, t >= 1 = state->iterate[t - 1]). anchor = h.
  CemAttentionCondition condition(const torch::Tensor& h, const MixerContext& ctx,
                                  int64_t step = 0);
  // -P grad_x E(x; h) (the step's direction before eta) for the iterate x (B, N, D); with cem.prox
  // the gradient includes lambda (x - c.anchor).
  torch::Tensor direction(const torch::Tensor& x, const CemAttentionCondition& c) const;
  // One step x + eta (-P grad E).
  torch::Tensor step(const torch::Tensor& x, const CemAttentionCondition& c) const;
  // The closed-form energy E_i(x_i; h_1..i) per position, (B, N), for a full sequence (offset 0,
  // rotary tables of positions 0..N-1 in ctx when RoPE is on). Written with plain ops from the
  // formula (the slow twin of direction()); naive RoPE has no energy (its step is not a gradient)
  // and is given the exact mode's energy. With cem.prox, + 1/2 lambda |x - anchor|^2 (anchor
  // undefined: h), so recursion_keys = iterate's step t is the gradient of energy(x, x^(t)
  // detached, ctx, h).
  torch::Tensor energy(const torch::Tensor& x, const torch::Tensor& h, const MixerContext& ctx,
                       const torch::Tensor& anchor = torch::Tensor()) const;

  const CemAttentionOptions& options() const { return options_; }
  void set_steps(int64_t steps) { options_.step().steps(steps); }
  void set_recursion(CemRecursion r) { recursion_ = r; }
  // Whether forward takes the gram path for an input of this many tokens (B * N).
  bool uses_gram(int64_t tokens) const;
  double eta() const { return eta_.value(); }
  double prox_lambda() const { return prox_.value(); }  // 0 without cem.prox
  void set_recursion_keys(CemRecursionKeys k) { options_.recursion_keys(k); }
  void set_step_norm(bool on) { options_.step().step_norm(on); }
  int64_t key_projections() const { return key_projections_; }  // calls of h -> W_K h so far
  const CemPreconditionerImpl* preconditioner() const { return precond_.get(); }

  torch::Tensor w_q, w_k, delta;

 private:
  bool rotates() const { return options_.rope() && options_.rope_mode() != CemRopeMode::kNone; }
  // Causal attention read-out of merged queries q (B, N, H d_h), rotated back under exact RoPE.
  torch::Tensor readout(const torch::Tensor& q, const CemAttentionCondition& c) const;
  // x^(T) - h for T >= 2 without D+LR, moving the queries instead of the iterate (see the .cpp).
  torch::Tensor forward_gram(const torch::Tensor& h, const CemAttentionCondition& c) const;

  CemAttentionOptions options_;
  int64_t head_dim_;
  CemStepSize eta_;
  CemProx prox_;
  std::shared_ptr<CemPreconditionerImpl> precond_;
  int64_t key_projections_ = 0;
  CemRecursion recursion_;
};

}  // namespace cemfrac

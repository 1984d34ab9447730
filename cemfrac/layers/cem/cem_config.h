// Settings of the CEM sub-layers (mixer "cem_attention", FFN "cem_mlp"; docs/layers/cem.md), one
// nested table of the model config: `[model.cem]` or `model.cem = {steps = 2, ...}` in TOML,
// `"cem": {...}` in config.json, `--set model.cem.steps=4` on the command line. The fields are used
// only by layers of a CEM kind; a model without one ignores them.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "cemfrac/core/fields.h"

namespace cemfrac {

// The settings with a fixed set of names, as the sub-layers' options take them (cem_attention.h,
// cem_common.h). The name tables are the config's (TOML / config.json) spelling.

// RoPE in cem_attention (docs/layers/cem.md): exact = the step is the gradient of the rotated
// energy; naive = q and k rotated only, not a gradient (an ablation); none = the tables are
// ignored.
enum class CemRopeMode { kExact, kNaive, kNone };
// The D+LR interaction diagonal: none, one per head, or one shared by the heads.
enum class CemDiagonal { kNone, kPerHead, kShared };
// How forward runs T >= 2 steps (same function, different work; see forward_gram()):
// direct = project x^(t) -> queries and read-out -> displacement every step; gram = move the
// queries by a_t G, G = eta P(W_Q) W_Q^T, and project the summed read-outs once; auto = gram when
// it saves work (no D+LR, no observer, (T - 1) * tokens >= 2 D).
enum class CemRecursion { kAuto, kDirect, kGram };
// Where step t's keys (and tied values) come from: fixed = the input h at every step (the
// conditional energy E(x | h)); iterate = the current iterates x^(t) of the visible positions
// (docs/layers/cem.md §8.1).
enum class CemRecursionKeys { kFixed, kIterate };
// The proximal term 1/2 lambda |x - h|^2 (docs/layers/cem.md §8.2): none, lambda =
// softplus(lambda_raw) learnable (init 1), or lambda = 1 fixed.
enum class CemProxMode { kNone, kLearned, kFixed };
// The MLP energy: a = W_U tied to the read-out, gate W_G h; b = quadratic.
enum class CemMlpForm { kA, kB };
// rms: rescale the iterate to h's per-token RMS before steps 2..T (§8.3).
enum class CemStepNorm { kNone, kRms };
// The attention energy (docs/layers/cem.md §8.4): softmax = the log-sum-exp energy (the paper's;
// weights softmax(beta q.k)); linear = the quadratic energy -1/(2 n_i) sum_j beta (q_i.k_j)^2,
// whose gradient step is causal linear attention with weights beta q_i.k_j / n_i (n_i = the keys
// query i sees): the control of the in-context-regression theory, where attention steps are
// gradient-descent steps.
enum class CemAttentionKernel { kSoftmax, kLinear };

template <>
struct EnumNames<CemRopeMode> {
  static constexpr std::array<std::pair<CemRopeMode, const char*>, 3> kNames = {
      {{CemRopeMode::kExact, "exact"},
       {CemRopeMode::kNaive, "naive"},
       {CemRopeMode::kNone, "none"}}};
};
template <>
struct EnumNames<CemDiagonal> {
  static constexpr std::array<std::pair<CemDiagonal, const char*>, 3> kNames = {
      {{CemDiagonal::kNone, "none"},
       {CemDiagonal::kPerHead, "per_head"},
       {CemDiagonal::kShared, "shared"}}};
};
template <>
struct EnumNames<CemRecursion> {
  static constexpr std::array<std::pair<CemRecursion, const char*>, 3> kNames = {
      {{CemRecursion::kAuto, "auto"},
       {CemRecursion::kDirect, "direct"},
       {CemRecursion::kGram, "gram"}}};
};
template <>
struct EnumNames<CemRecursionKeys> {
  static constexpr std::array<std::pair<CemRecursionKeys, const char*>, 2> kNames = {
      {{CemRecursionKeys::kFixed, "fixed"}, {CemRecursionKeys::kIterate, "iterate"}}};
};
template <>
struct EnumNames<CemProxMode> {
  static constexpr std::array<std::pair<CemProxMode, const char*>, 3> kNames = {
      {{CemProxMode::kNone, "none"},
       {CemProxMode::kLearned, "learned"},
       {CemProxMode::kFixed, "fixed"}}};
};
template <>
struct EnumNames<CemMlpForm> {
  static constexpr std::array<std::pair<CemMlpForm, const char*>, 2> kNames = {
      {{CemMlpForm::kA, "a"}, {CemMlpForm::kB, "b"}}};
};
template <>
struct EnumNames<CemAttentionKernel> {
  static constexpr std::array<std::pair<CemAttentionKernel, const char*>, 2> kNames = {
      {{CemAttentionKernel::kSoftmax, "softmax"}, {CemAttentionKernel::kLinear, "linear"}}};
};
template <>
struct EnumNames<CemStepNorm> {
  static constexpr std::array<std::pair<CemStepNorm, const char*>, 2> kNames = {
      {{CemStepNorm::kNone, "none"}, {CemStepNorm::kRms, "rms"}}};
};

struct CemConfig {
  int64_t steps = 1;        // T: gradient steps per sub-layer (keys / gate computed once)
  bool freeze_eta = false;  // eta = 1 constant instead of the learnable softplus(eta_raw)
  double eta_init = 1.0;    // the learnable eta's value at init (shared over the T steps)
  CemRopeMode rope_mode = CemRopeMode::kExact;  // with positions = rope
  CemDiagonal dlr = CemDiagonal::kNone;         // D+LR interaction diagonal
  bool dlr_distance = false;  // distance form -1/2 (x - h)^T diag(delta) (x - h) of the diagonal
  bool precond = false;       // P = diag(softplus(p)) + U V^T + V U^T per sub-layer (eta = 1)
  int64_t precond_rank = 16;  // r
  bool precond_psd = false;   // P = diag(softplus(p)) + U U^T instead
  CemMlpForm mlp_form = CemMlpForm::kA;
  CemRecursion recursion = CemRecursion::kAuto;  // attention at T >= 2 (same function)
  CemRecursionKeys recursion_keys = CemRecursionKeys::kFixed;  // attention keys/values per step
  CemProxMode prox = CemProxMode::kNone;  // + 1/2 lambda |x - h|^2 in both energies
  CemStepNorm step_norm = CemStepNorm::kNone;
  CemAttentionKernel attention = CemAttentionKernel::kSoftmax;

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    // OnCheckpoint::kMayChange: changes no parameter's shape, so a checkpoint can be evaluated or
    // sampled with another value (test-time scaling: --set model.cem.steps=4).
    constexpr OnCheckpoint kMayChange = OnCheckpoint::kMayChange;
    v("steps", steps, "CEM: gradient steps T per sub-layer (can be changed on a checkpoint)",
      kMayChange);
    v("freeze_eta", freeze_eta, "CEM: fix the step size eta at 1 (no eta parameter)");
    v("eta_init", eta_init,
      "CEM: the learnable step size eta at init, > 0 (e.g. 1/T so that T * eta starts at 1)");
    v("rope_mode", rope_mode,
      "CEM attention with RoPE: exact | naive | none (can be changed on a checkpoint)", kMayChange);
    v("dlr", dlr, "CEM attention diagonal-plus-low-rank interaction: none | per_head | shared");
    v("dlr_distance", dlr_distance, "CEM attention: distance form of the D+LR diagonal",
      kMayChange);
    v("precond", precond,
      "CEM: learned preconditioner diag + low rank per sub-layer (fixes eta = 1)");
    v("precond_rank", precond_rank, "CEM: preconditioner rank r");
    v("precond_psd", precond_psd,
      "CEM: positive-definite preconditioner diag(softplus(p)) + U U^T");
    v("mlp_form", mlp_form, "CEM MLP energy: a (W_U tied to the read-out) | b (quadratic)",
      kMayChange);
    v("recursion", recursion, "CEM attention T >= 2 work plan: auto | direct | gram (same outputs)",
      kMayChange);
    v("recursion_keys", recursion_keys,
      "CEM attention keys/values at step t: fixed (from h) | iterate (from the iterates x^(t), "
      "causal)",
      kMayChange);
    v("prox", prox,
      "CEM proximal term 1/2 lambda |x - h|^2: none | learned (softplus, init 1) | fixed (lambda = "
      "1)");
    v("step_norm", step_norm,
      "CEM: none | rms (rescale the iterate to h's per-token RMS before steps 2..T)", kMayChange);
    v("attention", attention,
      "CEM attention energy: softmax (log-sum-exp) | linear (quadratic: weights beta q.k / n, a "
      "linear-attention control)");
  }

  // Whether a sub-layer has the learnable eta parameter (not frozen, no preconditioner).
  bool learn_eta() const { return !freeze_eta && !precond; }
};

// The first problem of a model's `cem` table, with keys "cem.<field>" (nullopt = valid); `d_model`
// is the model width. Called from ModelConfig::first_problem().
std::optional<ConfigProblem> cem_config_problem(const CemConfig& config, int64_t d_model);

}  // namespace cemfrac

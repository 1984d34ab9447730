// Settings of the CEM sub-layers (mixer "cem_attention", FFN "cem_mlp"; docs/layers/cem.md), one
// nested table of the model config: `[model.cem]` or `model.cem = {steps = 2, ...}` in TOML,
// `"cem": {...}` in config.json, `--set model.cem.steps=4` on the command line. The fields are used
// only by layers of a CEM kind; a model without one ignores them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/core/fields.h"

namespace cemfrac {

struct CemConfig {
  int64_t steps = 1;                // T: gradient steps per sub-layer (keys / gate computed once)
  bool freeze_eta = false;          // eta = 1 constant instead of the learnable softplus(eta_raw)
  std::string rope_mode = "exact";  // with positions = rope: exact | naive | none
  std::string dlr = "none";         // D+LR interaction diagonal: none | per_head | shared
  bool dlr_distance = false;   // distance form -1/2 (x - h)^T diag(delta) (x - h) of the diagonal
  bool precond = false;        // P = diag(softplus(p)) + U V^T + V U^T per sub-layer (eta = 1)
  int64_t precond_rank = 16;   // r
  bool precond_psd = false;    // P = diag(softplus(p)) + U U^T instead
  std::string mlp_form = "a";  // a: W_U tied to the read-out, gate W_G h | b: quadratic energy
  std::string recursion = "auto";  // attention at T >= 2: auto | direct | gram (same function)
  std::string recursion_keys =
      "fixed";  // attention keys/values per step: fixed (from h) | iterate (from x^(t))
  std::string prox =
      "none";  // + 1/2 lambda |x - h|^2 in both energies: none | learned | fixed (lambda = 1)
  std::string step_norm =
      "none";  // none | rms: rescale the iterate to h's per-token RMS before steps 2..T

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    // OnCheckpoint::kMayChange: changes no parameter's shape, so a checkpoint can be evaluated or
    // sampled with another value (test-time scaling: --set model.cem.steps=4).
    constexpr OnCheckpoint kMayChange = OnCheckpoint::kMayChange;
    v("steps", steps, "CEM: gradient steps T per sub-layer (can be changed on a checkpoint)",
      kMayChange);
    v("freeze_eta", freeze_eta, "CEM: fix the step size eta at 1 (no eta parameter)");
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
  }

  // Whether a sub-layer has the learnable eta parameter (not frozen, no preconditioner).
  bool learn_eta() const { return !freeze_eta && !precond; }
};

// The first problem of a model's `cem` table, with keys "cem.<field>" (nullopt = valid); `d_model`
// is the model width. Called from ModelConfig::first_problem().
std::optional<ConfigProblem> cem_config_problem(const CemConfig& config, int64_t d_model);

}  // namespace cemfrac

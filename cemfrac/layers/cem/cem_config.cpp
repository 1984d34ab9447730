#include "cemfrac/layers/cem/cem_config.h"

#include <fmt/format.h>

namespace cemfrac {

std::optional<ConfigProblem> cem_config_problem(const CemConfig& c, int64_t d_model) {
  auto problem = [](const char* field, std::string message) -> std::optional<ConfigProblem> {
    return ConfigProblem{std::string("cem.") + field, "cem." + message};
  };
  if (c.steps < 1 || c.steps > 64) {
    return problem(
        "steps",
        fmt::format("steps = {}: must be in 1..64 (gradient steps per sub-layer)", c.steps));
  }
  if (c.rope_mode != "exact" && c.rope_mode != "naive" && c.rope_mode != "none") {
    return problem(
        "rope_mode",
        fmt::format("rope_mode = \"{}\": unknown; valid: exact, naive, none", c.rope_mode));
  }
  if (c.dlr != "none" && c.dlr != "per_head" && c.dlr != "shared") {
    return problem("dlr",
                   fmt::format("dlr = \"{}\": unknown; valid: none, per_head, shared", c.dlr));
  }
  if (c.dlr_distance && c.dlr == "none") {
    return problem(
        "dlr_distance",
        "dlr_distance = true needs a diagonal: set cem.dlr = \"per_head\" or \"shared\"");
  }
  if (c.precond_rank < 1 || c.precond_rank > d_model) {
    return problem("precond_rank", fmt::format("precond_rank = {}: must be in 1..d_model = {}",
                                               c.precond_rank, d_model));
  }
  if (c.mlp_form != "a" && c.mlp_form != "b") {
    return problem("mlp_form", fmt::format("mlp_form = \"{}\": unknown; valid: a, b", c.mlp_form));
  }
  if (c.recursion != "auto" && c.recursion != "direct" && c.recursion != "gram") {
    return problem(
        "recursion",
        fmt::format("recursion = \"{}\": unknown; valid: auto, direct, gram", c.recursion));
  }
  if (c.recursion_keys != "fixed" && c.recursion_keys != "iterate") {
    return problem(
        "recursion_keys",
        fmt::format("recursion_keys = \"{}\": unknown; valid: fixed, iterate", c.recursion_keys));
  }
  if (c.prox != "none" && c.prox != "learned" && c.prox != "fixed") {
    return problem("prox",
                   fmt::format("prox = \"{}\": unknown; valid: none, learned, fixed", c.prox));
  }
  if (c.step_norm != "none" && c.step_norm != "rms") {
    return problem("step_norm",
                   fmt::format("step_norm = \"{}\": unknown; valid: none, rms", c.step_norm));
  }
  return std::nullopt;
}

}  // namespace cemfrac

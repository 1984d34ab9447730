#include "cemfrac/layers/cem/cem_config.h"

#include <fmt/format.h>

#include <cmath>

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
  if (!(c.eta_init > 0.0) || !std::isfinite(c.eta_init)) {
    return problem("eta_init",
                   fmt::format("eta_init = {}: must be a finite number > 0 (eta = softplus(raw) "
                               "starts there)",
                               c.eta_init));
  }
  if (c.eta_init != 1.0 && !c.learn_eta()) {
    return problem("eta_init",
                   fmt::format("eta_init = {} has no effect: eta is fixed at 1 ({})", c.eta_init,
                               c.precond ? "precond = true" : "freeze_eta = true"));
  }
  if (c.dlr_distance && c.dlr == CemDiagonal::kNone) {
    return problem(
        "dlr_distance",
        "dlr_distance = true needs a diagonal: set cem.dlr = \"per_head\" or \"shared\"");
  }
  if (c.attention == CemAttentionKernel::kLinear && c.dlr != CemDiagonal::kNone) {
    return problem("attention", "attention = \"linear\" has no D+LR form: set cem.dlr = \"none\"");
  }
  if (c.precond_rank < 1 || c.precond_rank > d_model) {
    return problem("precond_rank", fmt::format("precond_rank = {}: must be in 1..d_model = {}",
                                               c.precond_rank, d_model));
  }
  return std::nullopt;
}

}  // namespace cemfrac

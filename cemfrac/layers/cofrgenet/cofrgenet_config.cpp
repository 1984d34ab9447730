#include "cemfrac/layers/cofrgenet/cofrgenet_config.h"

#include <fmt/format.h>

#include <cmath>

namespace cemfrac {

int64_t CofrConfig::sparse_block_for(int64_t context) const {
  if (sparse_block > 0) return sparse_block;
  return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(context))));
}

std::optional<ConfigProblem> cofrgenet_config_problem(const CofrConfig& c, int64_t d_model,
                                                      int64_t n_heads, int64_t context) {
  auto problem = [](const char* field, std::string message) -> std::optional<ConfigProblem> {
    return ConfigProblem{std::string("cofrgenet.") + field, "cofrgenet." + message};
  };
  if (!std::isfinite(c.eps) || c.eps < 0) {
    return problem(
        "eps", fmt::format("eps = {}: must be a finite number >= 0 (0 = no pole guard)", c.eps));
  }
  auto in_range = [&](const char* field, int64_t v, int64_t lo, int64_t hi,
                      const char* what) -> std::optional<ConfigProblem> {
    if (v >= lo && v <= hi) return std::nullopt;
    return problem(field, fmt::format("{} = {}: must be in {}..{} ({})", field, v, lo, hi, what));
  };
  if (auto p = in_range("ladders", c.ladders, 1, 1 << 20, "cffn ladders L")) return p;
  if (auto p = in_range("depth", c.depth, 1, 62, "cffn ladder depth d")) return p;
  if (c.glu && c.direct_raw) {
    return problem("direct_raw",
                   "direct_raw = true needs the direct path U, which glu = true removes; set one");
  }
  if (c.length < 0) {
    return problem("length", fmt::format("length = {}: must be >= 0 (0 = model.context = {})",
                                         c.length, context));
  }
  if (c.length > 0 && c.length < context) {
    return problem("length",
                   fmt::format("length = {}: must be at least model.context = {} (or 0 = context), "
                               "the layers take sequences of up to context positions",
                               c.length, context));
  }
  if (auto p = in_range("u_depth", c.u_depth, 1, 63, "cattn_u: linear term + fraction levels"))
    return p;
  if (auto p = in_range("m_ladders", c.m_ladders, 1, 1 << 20, "cattn_m ladders L")) return p;
  if (auto p = in_range("m_depth", c.m_depth, 1, 62, "cattn_m ladder depth d")) return p;
  if (c.m_heads < 1 || d_model % c.m_heads != 0) {
    return problem("m_heads", fmt::format("m_heads = {}: must be >= 1 and divide d_model = {}",
                                          c.m_heads, d_model));
  }
  if (c.synth_hidden < 0) {
    return problem("synth_hidden",
                   fmt::format("synth_hidden = {}: must be >= 0 (0 = d_model)", c.synth_hidden));
  }
  const int64_t hidden = c.synth_hidden > 0 ? c.synth_hidden : d_model;
  if (hidden % n_heads != 0) {
    return problem(
        "synth_hidden",
        fmt::format("synth_hidden = {}: the hidden width {} must be a multiple of n_heads = "
                    "{} (each head reads its slice)",
                    c.synth_hidden, hidden, n_heads));
  }
  if (c.sparse_block < 0) {
    return problem(
        "sparse_block",
        fmt::format("sparse_block = {}: must be >= 0 (0 = sqrt(context))", c.sparse_block));
  }
  const int64_t block = c.sparse_block_for(context);
  if (c.sparse_summary < 1 || c.sparse_summary > block) {
    return problem("sparse_summary",
                   fmt::format("sparse_summary = {}: must be in 1..{} (the block length)",
                               c.sparse_summary, block));
  }
  return std::nullopt;
}

}  // namespace cemfrac

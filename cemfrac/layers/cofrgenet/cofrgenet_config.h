// Settings of the CoFrGeNet layers (FFN "cffn", mixers "cattn_u", "cattn_m") and of the paper's two
// baselines (mixers "synthesizer_dense", "sparse_attention"); docs/layers/cofrgenet.md. One nested
// table of the model config: `[model.cofrgenet]` in TOML, `"cofrgenet": {...}` in config.json,
// `--set model.cofrgenet.depth=7` on the command line. A model without one of these kinds ignores
// them.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "cemfrac/core/fields.h"
#include "cemfrac/ops/continuant_modes.h"

namespace cemfrac {

// cffn's gate activation: x̂ = x * act(G x).
enum class CffnGate { kSigmoid, kSilu };
// sparse_attention's pattern (layers/cofrgenet/sparse_attention.h).
enum class SparsePattern { kFixed, kStrided };

template <>
struct EnumNames<CffnGate> {
  static constexpr std::array<std::pair<CffnGate, const char*>, 2> kNames = {
      {{CffnGate::kSigmoid, "sigmoid"}, {CffnGate::kSilu, "silu"}}};
};
template <>
struct EnumNames<SparsePattern> {
  static constexpr std::array<std::pair<SparsePattern, const char*>, 2> kNames = {
      {{SparsePattern::kFixed, "fixed"}, {SparsePattern::kStrided, "strided"}}};
};

struct CofrConfig {
  // Ladders of every kind.
  double eps = 0.01;  // pole guard |K̂_d| >= eps
  // literal = the paper's CoFrGeNet-B
  ContinuantImpl impl = ContinuantImpl::kFused;
  // gradient inside the clamp
  ContinuantBackward backward = ContinuantBackward::kSurrogate;
  bool truncate = false;  // dyadic stage m evaluates ladders with a_1..a_m only
  bool eval_clip = true;  // eval mode: clip ladder outputs to the range seen in training

  // cffn
  int64_t ladders = 3;      // L
  int64_t depth = 5;        // d (partial denominators a_1..a_d)
  bool ladder_bias = true;  // b_k (init 1: no ladder starts on a pole); also cattn_m
  CffnGate gate = CffnGate::kSigmoid;
  bool glu = false;         // x̂ = act(G1 x) * (G2 x) and no direct path U
  bool direct_raw = false;  // the direct path U sees x instead of x̂
  bool univariate = false;  // element-wise ladders (p fractions per ladder), for comparison

  // cattn_u, cattn_m, synthesizer_dense: the longest sequence l the layer is built for (0 =
  // context)
  int64_t length = 0;

  // cattn_u
  int64_t u_depth = 5;  // d: the linear term w_0 plus d - 1 fraction levels
  bool u_bias = true;   // per-position ladder biases (init 1), outside the paper's count

  // cattn_m
  int64_t m_ladders = 3;    // L
  int64_t m_depth = 3;      // d
  int64_t m_heads = 1;      // H: separate logit maps F on d_model / H value slices
  bool m_out_proj = false;  // output projection W^o after the heads

  // synthesizer_dense: hidden width of the per-token MLP (0 = d_model); heads = model.n_heads
  int64_t synth_hidden = 0;

  // sparse_attention (Child et al., fixed pattern): block / stride length and summary columns
  SparsePattern sparse_pattern = SparsePattern::kFixed;
  int64_t sparse_block = 0;    // 0 = round(sqrt(context))
  int64_t sparse_summary = 1;  // fixed: last c positions of each block are seen by all later ones

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("eps", eps, "Ladders: pole guard epsilon (|K_d| clamped to at least eps)");
    v("impl", impl, "Ladders: fused | reference | literal (literal = CoFrGeNet-B)");
    v("backward", backward, "Ladders: gradient inside the clamp, surrogate | exact");
    v("truncate", truncate, "Dyadic schedule: evaluate only the active depths (default keeps all)");
    v("eval_clip", eval_clip, "Eval mode: clip ladder outputs to the range recorded in training");
    v("ladders", ladders, "cffn: number of ladders L");
    v("depth", depth, "cffn: ladder depth d");
    v("ladder_bias", ladder_bias, "cffn, cattn_m: ladder biases (init 1)");
    v("gate", gate, "cffn: gate activation, sigmoid | silu");
    v("glu", glu, "cffn: GLU-style gate act(G1 x) * G2 x and no direct path U");
    v("direct_raw", direct_raw, "cffn: direct path U on the raw input x instead of the gated one");
    v("univariate", univariate,
      "cffn: element-wise (univariate) ladders instead of p-variate ones");
    v("length", length, "cattn_u, cattn_m, synthesizer_dense: positions l (0 = context)");
    v("u_depth", u_depth, "cattn_u: depth d (linear term + d - 1 fraction levels)");
    v("u_bias", u_bias, "cattn_u: per-position ladder biases (init 1)");
    v("m_ladders", m_ladders, "cattn_m: number of ladders L");
    v("m_depth", m_depth, "cattn_m: ladder depth d");
    v("m_heads", m_heads, "cattn_m: heads H (divides d_model)");
    v("m_out_proj", m_out_proj, "cattn_m: output projection W^o");
    v("synth_hidden", synth_hidden, "synthesizer_dense: hidden width (0 = d_model)");
    v("sparse_pattern", sparse_pattern, "sparse_attention: fixed | strided");
    v("sparse_block", sparse_block, "sparse_attention: block/stride length (0 = sqrt(context))");
    v("sparse_summary", sparse_summary, "sparse_attention fixed: summary positions per block");
  }

  // l for a model of `context` positions.
  int64_t length_for(int64_t context) const { return length > 0 ? length : context; }
  // Block length of sparse_attention for `context` positions.
  int64_t sparse_block_for(int64_t context) const;
};

// The first problem of a model's `cofrgenet` table, with keys "cofrgenet.<field>" (nullopt =
// valid), for a model of width `d_model`, `n_heads` heads and `context` positions. Called from
// ModelConfig::first_problem().
std::optional<ConfigProblem> cofrgenet_config_problem(const CofrConfig& config, int64_t d_model,
                                                      int64_t n_heads, int64_t context);

}  // namespace cemfrac

// The architecture of a language model. It travels with every checkpoint as config.json and is the
// only source of truth when a checkpoint is loaded. Every field is declared once, in
// visit_fields(): that one line gives its TOML/JSON key, its default (the initialiser here), its
// help text, and through it parsing, printing, serialisation and equality.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/core/fields.h"
#include "cemfrac/layers/base/rope_scaling.h"
#include "cemfrac/layers/cem/cem_config.h"
#include "cemfrac/layers/cofrgenet/cofrgenet_config.h"
#include "cemfrac/layers/registry.h"

namespace cemfrac {

// How token positions enter the model: a learned table added to the embedding, rotary
// embeddings inside the mixers, or none.
enum class Positions { kLearned, kRope, kNone };
template <>
struct EnumNames<Positions> {
  static constexpr std::array<std::pair<Positions, const char*>, 3> kNames = {
      {{Positions::kLearned, "learned"}, {Positions::kRope, "rope"}, {Positions::kNone, "none"}}};
};

// Per-layer replacement of the mixer and/or FFN kind ("" = keep the model-wide kind).
struct LayerOverride {
  int64_t layer = 0;
  std::string mixer;
  std::string ffn;

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("layer", layer, "Layer index (0-based)");
    v("mixer", mixer, "Mixer kind of this layer (\"\" = model.mixer)");
    v("ffn", ffn, "FFN kind of this layer (\"\" = model.ffn)");
  }
};

struct ModelConfig {
  // Shapes. Letters as in docs/glossary.md: V vocab, D width, L layers, H heads, M MLP width.
  int64_t vocab_size = 4096;  // V; the tokenizer's vocabulary (may be padded up, never down)
  int64_t d_model = 128;      // D
  int64_t n_layers = 2;       // L
  int64_t n_heads = 4;        // H; d_h = D / H
  int64_t n_kv_heads = 0;     // grouped-query attention: key/value heads (0 = n_heads)
  int64_t d_ff = 512;         // M; hidden width of the FFN
  int64_t context = 128;      // N_max; longest sequence (learned positions are this long)

  // Block kinds, chosen independently (layers may override). Mixers: "mha", "cem_attention",
  // "cattn_u", "cattn_m", "synthesizer_dense", "sparse_attention". FFNs: "gelu_mlp", "swiglu",
  // "cem_mlp", "cffn" (layers/registry.h lists them), or "none": no FFN sub-layer, the block is
  // z += mixer(norm1(z)) alone (attention-only models, as in the in-context regression theory).
  std::string mixer = "mha";
  std::string ffn = "swiglu";
  std::vector<LayerOverride> layer_overrides;

  // Flavour. GPT-2: norm=layernorm, positions=learned, bias=true, tie_embeddings=true.
  //          Llama: norm=rmsnorm, positions=rope, bias=false, tie_embeddings=false.
  NormKind norm = NormKind::kRmsNorm;
  double norm_eps = 1e-5;
  Positions positions = Positions::kRope;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;     // long-context frequency scaling (Llama 3.1+: type = "llama3")
  bool bias = false;            // biases in linear layers and LayerNorm
  bool tie_embeddings = false;  // head weight == token embedding (one tensor)
  double init_std = 0.02;       // N(0, std) for matrices; residual projections scaled by 1/sqrt(2L)
  CemConfig cem;  // cem_attention / cem_mlp settings (cemfrac/layers/cem/cem_config.h)
  CofrConfig
      cofrgenet;  // cffn / cattn_u / cattn_m / baselines (layers/cofrgenet/cofrgenet_config.h)

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("vocab_size", vocab_size, "Vocabulary size V (>= the tokenizer's)");
    v("d_model", d_model, "Model width D");
    v("n_layers", n_layers, "Number of blocks L");
    v("n_heads", n_heads, "Attention heads H (D must be divisible by H)");
    v("n_kv_heads", n_kv_heads, "Key/value heads for grouped-query attention (0 = n_heads)");
    v("d_ff", d_ff, "FFN hidden width M");
    v("context", context, "Maximum sequence length");
    v("mixer", mixer, "Token mixer kind of every layer (mha, ...)");
    v("ffn", ffn, "FFN kind of every layer (gelu_mlp, swiglu, ..., none: no FFN)");
    v("layer_overrides", layer_overrides,
      "Per-layer mixer/ffn kinds: [{layer=0, mixer=..., ffn=...}]");
    v("norm", norm, "layernorm | rmsnorm");
    v("norm_eps", norm_eps, "Epsilon of the norms");
    v("positions", positions, "learned | rope | none");
    v("rope_theta", rope_theta, "RoPE base");
    v("rope_scaling", rope_scaling,
      "RoPE frequency scaling: { type = \"none\" | \"llama3\", factor, ... }");
    v("bias", bias, "Biases in linear layers and norms");
    v("tie_embeddings", tie_embeddings, "Share the token embedding and the output head");
    v("init_std", init_std, "Standard deviation of the initial weights");
    v("cem", cem, "CEM sub-layer settings: {steps, freeze_eta, rope_mode, dlr, ...}");
    v("cofrgenet", cofrgenet,
      "CoFrGeNet layer settings: {ladders, depth, u_depth, m_ladders, ...}");
  }

  // Throws cemfrac::Error naming the field, the value and what is allowed.
  void validate() const;
  // The same checks, without throwing (nullopt = valid).
  std::optional<ConfigProblem> first_problem() const;

  std::string mixer_of(int64_t layer) const;  // applies layer_overrides
  std::string ffn_of(int64_t layer) const;
  bool has_ffn(int64_t layer) const;  // false where ffn_of(layer) is "none"
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return d_model / n_heads; }
};

bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) {
  return !(a == b);
}

// config.json of a checkpoint: every field, by its visit_fields key.
nlohmann::json to_json(const ModelConfig& config);
// Reads what to_json wrote. Unknown keys and wrong types throw cemfrac::Error naming the key and
// the value; missing keys keep their defaults (so configs written before a field existed still
// load); the result is validated. `source` names the document in messages (e.g. the config.json
// path).
ModelConfig model_config_from_json(const nlohmann::json& j,
                                   const std::string& source = "config.json");

}  // namespace cemfrac

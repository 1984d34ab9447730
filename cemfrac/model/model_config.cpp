#include "cemfrac/model/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "cemfrac/core/check.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/layers/registry.h"

namespace cemfrac {

using nlohmann::json;

namespace {

// ---- JSON write: one visitor for every visit_fields struct ----
struct JsonWriter {
  json out = json::object();

  template <typename T>
  static json value(const T& field) {
    if constexpr (HasVisitFields<T>::value) {
      JsonWriter nested;
      T copy = field;
      copy.visit_fields(nested);
      return nested.out;
    } else if constexpr (HasEnumNames<T>::value) {
      return json(enum_name(field));  // json(field) would write the number
    } else {
      return json(field);
    }
  }
  template <typename T>
  static json value(const std::vector<T>& items) {
    json array = json::array();
    for (const T& item : items) array.push_back(value(item));
    return array;
  }
  template <typename T>
  void operator()(const char* key, T& field, const char*, OnCheckpoint = OnCheckpoint::kFixed) {
    out[key] = value(field);
  }
};

// ---- JSON read: rejects unknown keys and wrong types, names the key and the value ----
struct JsonReader {
  const json& in;
  std::string where;  // "config.json: model" etc., for messages

  [[noreturn]] void wrong_type(const std::string& key, const json& v, const char* expected) const {
    // Strings from --set may be any bytes: dump() must not throw on invalid UTF-8 (U+FFFD instead).
    fail("{}: {} = {}: expected {}", where, key,
         v.dump(-1, ' ', false, json::error_handler_t::replace), expected);
  }
  void read(const std::string& key, const json& v, int64_t& out) const {
    if (!v.is_number_integer()) wrong_type(key, v, "an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) {
      wrong_type(key, v, "an integer below 2^63");
    }
    out = v.get<int64_t>();
  }
  void read(const std::string& key, const json& v, uint64_t& out) const {
    if (!v.is_number_unsigned()) wrong_type(key, v, "a non-negative integer");
    out = v.get<uint64_t>();
  }
  void read(const std::string& key, const json& v, double& out) const {
    if (!v.is_number()) wrong_type(key, v, "a number");
    out = v.get<double>();
  }
  void read(const std::string& key, const json& v, bool& out) const {
    if (!v.is_boolean()) wrong_type(key, v, "true or false");
    out = v.get<bool>();
  }
  void read(const std::string& key, const json& v, std::string& out) const {
    if (!v.is_string()) wrong_type(key, v, "a string");
    out = v.get<std::string>();
  }
  template <typename E, std::enable_if_t<HasEnumNames<E>::value, int> = 0>
  void read(const std::string& key, const json& v, E& out) const {
    if (!v.is_string()) wrong_type(key, v, "a string");
    const std::optional<E> value = enum_from_name<E>(v.get<std::string>());
    if (!value) {
      fail("{}: {} = {}: unknown; valid: {}", where, key,
           v.dump(-1, ' ', false, json::error_handler_t::replace), enum_names_text<E>());
    }
    out = *value;
  }
  template <typename T>
  void read(const std::string& key, const json& v, std::vector<T>& out) const {
    if (!v.is_array()) wrong_type(key, v, "an array");
    out.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      T item{};
      read(fmt::format("{}[{}]", key, i), v[i], item);
      out.push_back(std::move(item));
    }
  }
  template <typename T, typename = std::enable_if_t<HasVisitFields<T>::value>>
  void read(const std::string& key, const json& v, T& out) const {
    if (!v.is_object()) wrong_type(key, v, "an object");
    read_fields(v, out, where, key + ".");
  }

  template <typename T>
  void operator()(const char* key, T& field, const char*, OnCheckpoint = OnCheckpoint::kFixed) {
    auto it = in.find(key);
    if (it != in.end()) read(prefix + key, *it, field);
  }

  std::string prefix;

  template <typename T>
  static void read_fields(const json& obj, T& out, const std::string& where,
                          const std::string& prefix) {
    const std::vector<std::string> known = field_names<T>();
    const std::set<std::string> known_set(known.begin(), known.end());
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      CEMFRAC_CHECK(known_set.count(it.key()), "{}: unknown key '{}{}'; known keys: {}", where,
                    prefix, it.key(), fmt::join(known, ", "));
    }
    JsonReader reader{obj, where, prefix};
    out.visit_fields(reader);
  }
};

std::optional<ConfigProblem> problem(const std::string& key, std::string message) {
  return ConfigProblem{key, std::move(message)};
}

// The message of the Error a parse_*_kind throws, as a problem of `key`.
template <typename Parse>
std::optional<ConfigProblem> kind_problem(const std::string& key, Parse parse) {
  try {
    parse();
  } catch (const Error& e) {
    return problem(key, e.what());
  }
  return std::nullopt;
}

bool positive_finite(double x) {
  return std::isfinite(x) && x > 0;
}

// Upper bounds of the shape fields: far above any model this engine is meant for (Llama-3.1-405B
// has 126 layers, D = 16384, M = 53248, 128K context, 128K vocabulary), low enough that a typo such
// as n_layers = 100000000 is one clear error, not gigabytes of module objects (`cemfrac params`
// builds every layer on the meta device). What a config needs in memory is a separate check.
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;  // 16777216
constexpr int64_t kMaxDModel = int64_t{1} << 17;     // 131072
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxDff = int64_t{1} << 20;      // 1048576
constexpr int64_t kMaxContext = int64_t{1} << 20;  // 1048576

}  // namespace

namespace {

// The sizes: each at least 1 and at most the engine's bound; heads dividing the width.
std::optional<ConfigProblem> shapes_problem(const ModelConfig& c) {
  auto at_least_one = [](const char* key, int64_t v) -> std::optional<ConfigProblem> {
    if (v >= 1) return std::nullopt;
    return problem(key, fmt::format("{} = {}: must be at least 1", key, v));
  };
  for (auto [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                        {"d_model", c.d_model},
                        {"n_layers", c.n_layers},
                        {"n_heads", c.n_heads},
                        {"d_ff", c.d_ff},
                        {"context", c.context}}) {
    if (auto p = at_least_one(key, v)) return p;
  }
  for (auto [key, v, most] :
       {std::tuple<const char*, int64_t, int64_t>{"vocab_size", c.vocab_size, kMaxVocabSize},
        {"d_model", c.d_model, kMaxDModel},
        {"n_layers", c.n_layers, kMaxLayers},
        {"n_heads", c.n_heads, kMaxHeads},
        {"d_ff", c.d_ff, kMaxDff},
        {"context", c.context, kMaxContext}}) {
    if (v > most)
      return problem(
          key, fmt::format("{} = {}: must be at most {} (the bound of this engine)", key, v, most));
  }
  if (c.d_model % c.n_heads != 0) {
    return problem("n_heads", fmt::format("n_heads = {}: must divide d_model = {} (d_h = D / H)",
                                          c.n_heads, c.d_model));
  }
  if (c.n_kv_heads < 0 || (c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads != 0)) {
    return problem("n_kv_heads",
                   fmt::format("n_kv_heads = {}: must divide n_heads = {} (0 = n_heads)",
                               c.n_kv_heads, c.n_heads));
  }
  return std::nullopt;
}

// layer_overrides: layers in range, each once, each setting a known mixer or FFN.
std::optional<ConfigProblem> overrides_problem(const ModelConfig& c) {
  std::set<int64_t> seen;
  for (size_t i = 0; i < c.layer_overrides.size(); ++i) {
    const LayerOverride& o = c.layer_overrides[i];
    const std::string at = fmt::format("layer_overrides[{}]", i);
    if (o.layer < 0 || o.layer >= c.n_layers) {
      return problem("layer_overrides",
                     fmt::format("{}.layer = {}: must be in 0..{} (n_layers = {})", at, o.layer,
                                 c.n_layers - 1, c.n_layers));
    }
    if (!seen.insert(o.layer).second) {
      return problem(
          "layer_overrides",
          fmt::format("{}.layer = {}: layer overridden twice; merge the entries", at, o.layer));
    }
    if (o.mixer.empty() && o.ffn.empty()) {
      return problem("layer_overrides",
                     fmt::format("{} (layer {}) sets neither mixer nor ffn; set one or remove it",
                                 at, o.layer));
    }
    if (!o.mixer.empty()) {
      if (auto p =
              kind_problem("layer_overrides", [&] { parse_mixer_kind(o.mixer, at + ".mixer"); }))
        return p;
    }
    if (!o.ffn.empty()) {
      if (auto p = kind_problem("layer_overrides", [&] { parse_block_ffn(o.ffn, at + ".ffn"); }))
        return p;
    }
  }
  return std::nullopt;
}

// Rotary positions need an even head width; rope_theta and rope_scaling their ranges.
std::optional<ConfigProblem> rope_problem(const ModelConfig& c) {
  if (c.positions == Positions::kRope && c.head_dim() % 2 != 0) {
    return problem(
        "positions",
        fmt::format("positions = \"rope\" needs an even head width, but d_model / n_heads = "
                    "{} / {} = {}; change n_heads or d_model",
                    c.d_model, c.n_heads, c.head_dim()));
  }
  if (!positive_finite(c.rope_theta)) {
    return problem("rope_theta",
                   fmt::format("rope_theta = {}: must be a positive number", c.rope_theta));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScalingType::kLlama3) {
    if (!(std::isfinite(rs.factor) && rs.factor >= 1)) {
      return problem("rope_scaling.factor",
                     fmt::format("rope_scaling.factor = {}: must be at least 1", rs.factor));
    }
    if (!(positive_finite(rs.low_freq_factor) && positive_finite(rs.high_freq_factor) &&
          rs.low_freq_factor < rs.high_freq_factor)) {
      return problem(
          "rope_scaling.high_freq_factor",
          fmt::format("rope_scaling: low_freq_factor = {} and high_freq_factor = {} must be "
                      "positive with low < high",
                      rs.low_freq_factor, rs.high_freq_factor));
    }
    if (rs.original_context < 1) {
      return problem("rope_scaling.original_context",
                     fmt::format("rope_scaling.original_context = {}: must be at least 1",
                                 rs.original_context));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ConfigProblem> ModelConfig::first_problem() const {
  if (auto p = shapes_problem(*this)) return p;
  if (auto p = kind_problem("mixer", [&] { parse_mixer_kind(mixer, "mixer"); })) return p;
  if (auto p = kind_problem("ffn", [&] { parse_block_ffn(ffn, "ffn"); })) return p;
  if (auto p = overrides_problem(*this)) return p;
  if (!positive_finite(norm_eps)) {
    return problem("norm_eps", fmt::format("norm_eps = {}: must be a positive number", norm_eps));
  }
  if (auto p = rope_problem(*this)) return p;
  if (!positive_finite(init_std)) {
    return problem("init_std", fmt::format("init_std = {}: must be a positive number", init_std));
  }
  if (auto p = cem_config_problem(cem, d_model)) return p;
  for (int64_t layer = 0; layer < n_layers; ++layer) {
    if (mixer_of(layer) == "cem_attention" && kv_heads() != n_heads) {
      return problem("n_kv_heads",
                     fmt::format("n_kv_heads = {}: cem_attention (layer {}) has no grouped-query "
                                 "form (its values are its keys); set n_kv_heads = 0",
                                 n_kv_heads, layer));
    }
  }
  if (auto p = cofrgenet_config_problem(cofrgenet, d_model, n_heads, context)) return p;
  return std::nullopt;
}

void ModelConfig::validate() const {
  if (auto p = first_problem()) fail("model config: {}", p->message);
}

std::string ModelConfig::mixer_of(int64_t layer) const {
  for (const LayerOverride& o : layer_overrides) {
    if (o.layer == layer && !o.mixer.empty()) return o.mixer;
  }
  return mixer;
}

std::string ModelConfig::ffn_of(int64_t layer) const {
  for (const LayerOverride& o : layer_overrides) {
    if (o.layer == layer && !o.ffn.empty()) return o.ffn;
  }
  return ffn;
}

bool ModelConfig::has_ffn(int64_t layer) const {
  return ffn_of(layer) != kNoFfn;
}

// Every field through visit_fields: two configs are equal when their JSON documents are (doubles
// are written with round-trip precision, so this is exact).
bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return to_json(a) == to_json(b);
}

json to_json(const ModelConfig& config) {
  return JsonWriter::value(config);
}

ModelConfig model_config_from_json(const json& j, const std::string& source) {
  CEMFRAC_CHECK(j.is_object(), "{}: expected a JSON object with the model config, got {}", source,
                j.type_name());
  ModelConfig config;
  JsonReader::read_fields(j, config, source, "");
  if (auto p = config.first_problem()) fail("{}: {}", source, p->message);
  return config;
}

}  // namespace cemfrac

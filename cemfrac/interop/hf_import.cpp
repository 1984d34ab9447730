// transformers -> cemfrac: a GPT-2 or Llama directory as a cemfrac checkpoint (interop/hf.h).
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>
#include <system_error>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/data/byte_tokenizer.h"
#include "cemfrac/data/gpt2_tokenizer.h"
#include "cemfrac/data/sentencepiece_tokenizer.h"
#include "cemfrac/interop/hf.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/run_dir.h"

namespace cemfrac {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads config.json fields with one-line errors naming the key.
class HfConfig {
 public:
  HfConfig(const json& j, std::string source) : j_(j), source_(std::move(source)) {
    CEMFRAC_CHECK(j_.is_object(), "{}: config.json is not a JSON object", source_);
  }
  int64_t integer(const char* key) const {
    CEMFRAC_CHECK(j_.contains(key), "{}: config.json has no '{}'", source_, key);
    return integer_of(key, j_.at(key));
  }
  int64_t integer(const char* key, int64_t fallback) const {
    return j_.contains(key) && !j_.at(key).is_null() ? integer_of(key, j_.at(key)) : fallback;
  }
  double number(const char* key, double fallback) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return fallback;
    CEMFRAC_CHECK(j_.at(key).is_number(), "{}: config.json '{}' is {}, not a number", source_, key,
                  j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return fallback;
    CEMFRAC_CHECK(j_.at(key).is_boolean(), "{}: config.json '{}' is {}, not true or false", source_,
                  key, j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!j_.contains(key) || j_.at(key).is_null()) return fallback;
    CEMFRAC_CHECK(j_.at(key).is_string(), "{}: config.json '{}' is {}, not a string", source_, key,
                  j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  // Refuses a setting whose value changes the math into something cemfrac does not compute.
  template <typename T>
  void require(const char* key, const T& wanted, const T& fallback, const char* why) const {
    if (!j_.contains(key) || j_.at(key).is_null()) {
      CEMFRAC_CHECK(fallback == wanted, "{}: config.json '{}' defaults to a value {}", source_, key,
                    why);
      return;
    }
    CEMFRAC_CHECK(j_.at(key) == json(wanted), "{}: config.json '{}' = {}: {}", source_, key,
                  j_.at(key).dump(), why);
  }
  const json& raw() const { return j_; }
  const std::string& source() const { return source_; }

 private:
  int64_t integer_of(const char* key, const json& v) const {
    CEMFRAC_CHECK(v.is_number_integer(), "{}: config.json '{}' is {}, not an integer", source_, key,
                  v.dump());
    return v.get<int64_t>();
  }
  const json& j_;
  std::string source_;
};

// Takes tensors out of a transformers map by name, counting what is left over.
class Taker {
 public:
  Taker(const TensorMap& in, std::string source) : in_(in), source_(std::move(source)) {}
  torch::Tensor take(const std::string& name) {
    auto it = in_.find(name);
    CEMFRAC_CHECK(it != in_.end(), "{}: model.safetensors has no tensor '{}'", source_, name);
    used_.insert(name);
    return it->second;
  }
  bool has(const std::string& name) const { return in_.count(name) > 0; }
  // Tensors never taken, less buffers transformers itself ignores on load.
  void check_all_used() const {
    std::vector<std::string> extra;
    for (const auto& [name, t] : in_) {
      if (used_.count(name)) continue;
      const bool buffer =
          name.find("rotary_emb.inv_freq") != std::string::npos ||
          name.find(".attn.masked_bias") != std::string::npos ||
          (name.size() > 10 && name.compare(name.size() - 10, 10, ".attn.bias") == 0);
      if (!buffer) extra.push_back(name);
    }
    if (extra.empty()) return;
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
    fail("{}: {} tensor(s) with no place in the model: {}{}", source_, extra.size(), list,
         extra.size() > 5 ? ", ..." : "");
  }

 private:
  const TensorMap& in_;
  std::string source_;
  std::set<std::string> used_;
};

bool all_zero(const TensorMap& t, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    auto it = t.find(n);
    if (it != t.end() && it->second.ne(0).any().item<bool>()) return false;
  }
  return true;
}

void drop(TensorMap& t, const std::vector<std::string>& names) {
  for (const std::string& n : names) t.erase(n);
}

HfImported from_gpt2(const HfConfig& j, Taker& in) {
  HfImported r;
  ModelConfig& c = r.config;
  c.vocab_size = j.integer("vocab_size");
  c.d_model = j.integer("n_embd");
  c.n_layers = j.integer("n_layer");
  c.n_heads = j.integer("n_head");
  c.d_ff = j.integer("n_inner", 4 * c.d_model);
  c.context = j.integer("n_positions");
  c.mixer = "mha";
  c.ffn = "gelu_mlp";
  c.norm = NormKind::kLayerNorm;
  c.norm_eps = j.number("layer_norm_epsilon", 1e-5);
  c.positions = Positions::kLearned;
  c.bias = true;
  c.tie_embeddings = j.flag("tie_word_embeddings", true);
  c.init_std = j.number("initializer_range", 0.02);
  const std::string act = j.text("activation_function", "gelu_new");
  CEMFRAC_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                "{}: config.json 'activation_function' = \"{}\": cemfrac's GPT-2 MLP is the tanh "
                "GELU (gelu_new)",
                j.source(), act);
  j.require("scale_attn_weights", true, true, "cemfrac scales attention by 1/sqrt(d_h)");
  j.require("scale_attn_by_inverse_layer_idx", false, false,
            "cemfrac does not scale attention by the layer index");
  j.require("add_cross_attention", false, false, "cemfrac models are decoder-only");

  TensorMap& t = r.tensors;
  std::vector<std::string> biases;
  t["wte.weight"] = in.take("transformer.wte.weight");
  t["wpe.weight"] = in.take("transformer.wpe.weight");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("transformer.h.{}.", l);
    t[b + "norm1.weight"] = in.take(h + "ln_1.weight");
    t[b + "norm1.bias"] = in.take(h + "ln_1.bias");
    t[b + "attn.w_qkv"] = in.take(h + "attn.c_attn.weight").t().contiguous();
    t[b + "attn.b_qkv"] = in.take(h + "attn.c_attn.bias");
    t[b + "attn.w_o"] = in.take(h + "attn.c_proj.weight").t().contiguous();
    t[b + "attn.b_o"] = in.take(h + "attn.c_proj.bias");
    t[b + "norm2.weight"] = in.take(h + "ln_2.weight");
    t[b + "norm2.bias"] = in.take(h + "ln_2.bias");
    t[b + "mlp.w_fc"] = in.take(h + "mlp.c_fc.weight").t().contiguous();
    t[b + "mlp.b_fc"] = in.take(h + "mlp.c_fc.bias");
    t[b + "mlp.w_proj"] = in.take(h + "mlp.c_proj.weight").t().contiguous();
    t[b + "mlp.b_proj"] = in.take(h + "mlp.c_proj.bias");
    for (const char* n :
         {"norm1.bias", "attn.b_qkv", "attn.b_o", "norm2.bias", "mlp.b_fc", "mlp.b_proj"})
      biases.push_back(b + n);
  }
  t["norm_f.weight"] = in.take("transformer.ln_f.weight");
  t["norm_f.bias"] = in.take("transformer.ln_f.bias");
  biases.push_back("norm_f.bias");
  if (!c.tie_embeddings)
    t["head.weight"] = in.take("lm_head.weight");
  else if (in.has("lm_head.weight"))
    in.take("lm_head.weight");  // a tied copy some files carry
  if (all_zero(t, biases)) {
    drop(t, biases);
    c.bias = false;
    r.notes.push_back("every bias and LayerNorm shift is exactly 0: imported with bias = false");
  }
  return r;
}

RopeScaling rope_scaling_of(const HfConfig& j) {
  RopeScaling s;
  const json& raw = j.raw();
  const json* p = nullptr;
  if (raw.contains("rope_scaling") && !raw["rope_scaling"].is_null())
    p = &raw["rope_scaling"];
  else if (raw.contains("rope_parameters") && raw["rope_parameters"].is_object())
    p = &raw["rope_parameters"];
  if (!p) return s;
  CEMFRAC_CHECK(p->is_object(), "{}: config.json rope scaling is {}, not an object", j.source(),
                p->dump());
  const HfConfig r(*p, j.source());
  const std::string type = r.text("rope_type", r.text("type", "default"));
  if (type == "default") return s;
  CEMFRAC_CHECK(type == "llama3",
                "{}: config.json rope_type \"{}\": cemfrac computes default and llama3 RoPE only",
                j.source(), type);
  s.type = RopeScalingType::kLlama3;
  s.factor = r.number("factor", s.factor);
  s.low_freq_factor = r.number("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.number("high_freq_factor", s.high_freq_factor);
  s.original_context = r.integer("original_max_position_embeddings", s.original_context);
  return s;
}

// The ModelConfig of a Llama config.json (every field cemfrac cannot honour refused).
ModelConfig llama_config(const HfConfig& j) {
  ModelConfig c;
  c.vocab_size = j.integer("vocab_size");
  c.d_model = j.integer("hidden_size");
  c.n_layers = j.integer("num_hidden_layers");
  c.n_heads = j.integer("num_attention_heads");
  const int64_t kv = j.integer("num_key_value_heads", c.n_heads);
  c.n_kv_heads = kv == c.n_heads ? 0 : kv;
  c.d_ff = j.integer("intermediate_size");
  c.context = j.integer("max_position_embeddings");
  c.mixer = "mha";
  c.ffn = "swiglu";
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = j.number("rms_norm_eps", 1e-6);
  c.positions = Positions::kRope;
  const json& raw = j.raw();
  double theta = j.number("rope_theta", 10000.0);
  if (raw.contains("rope_parameters") && raw["rope_parameters"].is_object())
    theta = HfConfig(raw["rope_parameters"], j.source()).number("rope_theta", theta);
  c.rope_theta = theta;
  c.rope_scaling = rope_scaling_of(j);
  c.tie_embeddings = j.flag("tie_word_embeddings", false);
  c.init_std = j.number("initializer_range", 0.02);
  const std::string act = j.text("hidden_act", "silu");
  CEMFRAC_CHECK(act == "silu",
                "{}: config.json 'hidden_act' = \"{}\": cemfrac's SwiGLU gates with silu",
                j.source(), act);
  CEMFRAC_CHECK(c.n_heads > 0 && c.d_model % c.n_heads == 0 &&
                    j.integer("head_dim", c.d_model / std::max<int64_t>(c.n_heads, 1)) ==
                        c.d_model / c.n_heads,
                "{}: config.json 'head_dim' differs from hidden_size / num_attention_heads, which "
                "cemfrac's attention requires",
                j.source());
  c.bias = j.flag("attention_bias", false) || j.flag("mlp_bias", false);
  return c;
}

HfImported from_llama(const HfConfig& j, Taker& in) {
  HfImported r;
  r.config = llama_config(j);
  ModelConfig& c = r.config;
  const bool attn_bias = j.flag("attention_bias", false), mlp_bias = j.flag("mlp_bias", false);

  const int64_t D = c.d_model, M = c.d_ff, dh = D / c.n_heads;
  const int64_t qkv = (c.n_heads + 2 * c.kv_heads()) * dh;
  TensorMap& t = r.tensors;
  std::vector<std::string> biases;
  auto bias_or_zeros = [&](bool has, const std::string& name, int64_t size) {
    return has ? in.take(name) : torch::zeros({size}, torch::kFloat32);
  };
  t["wte.weight"] = in.take("model.embed_tokens.weight");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("model.layers.{}.", l);
    const std::string a = h + "self_attn.", m = h + "mlp.";
    t[b + "norm1.weight"] = in.take(h + "input_layernorm.weight");
    t[b + "norm2.weight"] = in.take(h + "post_attention_layernorm.weight");
    t[b + "attn.w_qkv"] = torch::cat(
        {in.take(a + "q_proj.weight"), in.take(a + "k_proj.weight"), in.take(a + "v_proj.weight")});
    t[b + "attn.w_o"] = in.take(a + "o_proj.weight");
    t[b + "mlp.w_gate"] = in.take(m + "gate_proj.weight");
    t[b + "mlp.w_up"] = in.take(m + "up_proj.weight");
    t[b + "mlp.w_down"] = in.take(m + "down_proj.weight");
    if (c.bias) {
      t[b + "attn.b_qkv"] =
          attn_bias ? torch::cat({in.take(a + "q_proj.bias"), in.take(a + "k_proj.bias"),
                                  in.take(a + "v_proj.bias")})
                    : torch::zeros({qkv}, torch::kFloat32);
      t[b + "attn.b_o"] = bias_or_zeros(attn_bias, a + "o_proj.bias", D);
      t[b + "mlp.b_gate"] = bias_or_zeros(mlp_bias, m + "gate_proj.bias", M);
      t[b + "mlp.b_up"] = bias_or_zeros(mlp_bias, m + "up_proj.bias", M);
      t[b + "mlp.b_down"] = bias_or_zeros(mlp_bias, m + "down_proj.bias", D);
      for (const char* n : {"attn.b_qkv", "attn.b_o", "mlp.b_gate", "mlp.b_up", "mlp.b_down"})
        biases.push_back(b + n);
    }
  }
  t["norm_f.weight"] = in.take("model.norm.weight");
  if (!c.tie_embeddings)
    t["head.weight"] = in.take("lm_head.weight");
  else if (in.has("lm_head.weight"))
    in.take("lm_head.weight");
  if (c.bias && all_zero(t, biases)) {
    drop(t, biases);
    c.bias = false;
    r.notes.push_back("every bias is exactly 0: imported with bias = false");
  }
  return r;
}

}  // namespace

HfImported from_hf(const json& hf_config, const TensorMap& hf_tensors, const std::string& source) {
  const HfConfig j(hf_config, source);
  // transformers stores float16 / bfloat16 checkpoints too: widened to float32 (exact). float32 and
  // float64 stay as they are (import_hf refuses float64, which a cemfrac checkpoint cannot hold).
  TensorMap widened;
  std::set<std::string> dtypes;
  for (const auto& [name, t] : hf_tensors) {
    CEMFRAC_CHECK(t.is_floating_point(), "{}: tensor '{}' is {}, not floating point", source, name,
                  c10::toString(t.scalar_type()));
    const bool keep = t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kFloat64;
    if (!keep) dtypes.insert(c10::toString(t.scalar_type()));
    widened[name] = keep ? t.contiguous() : t.to(torch::kFloat32).contiguous();
  }
  Taker in(widened, source + "/model.safetensors");
  const std::string type = j.text("model_type", "");
  HfImported r;
  if (type == "gpt2")
    r = from_gpt2(j, in);
  else if (type == "llama")
    r = from_llama(j, in);
  else
    fail("{}: config.json model_type \"{}\": cemfrac imports gpt2 and llama", source, type);
  in.check_all_used();
  for (const std::string& d : dtypes)
    r.notes.push_back(fmt::format("{} tensors widened to float32 (exact)", d));
  r.config.validate();
  // Every tensor has the name and shape the model gives it, and nothing is missing.
  LmModel meta(r.config, torch::kMeta);
  for (const ParamInfo& p : meta->parameter_table()) {
    auto it = r.tensors.find(p.name);
    CEMFRAC_CHECK(it != r.tensors.end(), "{}: no tensor for the model's '{}'", source, p.name);
    CEMFRAC_CHECK(it->second.sizes().vec() == p.shape,
                  "{}: '{}' has shape {} but config.json gives the model {}", source, p.name,
                  fmt::format("{}", fmt::join(it->second.sizes(), "x")),
                  fmt::format("{}", fmt::join(p.shape, "x")));
  }
  CEMFRAC_CHECK(meta->parameter_table().size() == r.tensors.size(),
                "internal: import made {} tensors for a model of {}", r.tensors.size(),
                meta->parameter_table().size());
  return r;
}

std::unique_ptr<Tokenizer> tokenizer_from_hf(const std::string& dir, std::string* why) {
  const fs::path d(dir);
  std::error_code ec;
  auto here = [&](const char* name) { return fs::is_regular_file(d / name, ec); };
  try {
    if (here("tokenizer.model"))
      return std::make_unique<SentencePieceTokenizer>(read_file((d / "tokenizer.model").string()),
                                                      (d / "tokenizer.model").string());
    if (here("vocab.json") && here("merges.txt"))
      return std::make_unique<Gpt2Tokenizer>(read_file((d / "vocab.json").string()),
                                             read_file((d / "merges.txt").string()),
                                             (d / "vocab.json").string());
    if (here("tokenizer.json")) {
      const json j = json::parse(read_file((d / "tokenizer.json").string()), nullptr, false);
      const json& model = j.is_object() && j.contains("model") ? j["model"] : json();
      bool is_byte = model.is_object() && model.value("byte_fallback", false) &&
                     model.contains("vocab") && model["vocab"].is_object() &&
                     model["vocab"].size() == 257 && model.contains("merges") &&
                     model["merges"].empty();
      for (int b = 0; is_byte && b < 256; ++b)
        is_byte = model["vocab"].value(fmt::format("<0x{:02X}>", b), -1) == b;
      if (is_byte && model["vocab"].value(kEndOfText, -1) == ByteTokenizer::kEotId)
        return make_tokenizer("byte");
      *why =
          "tokenizer.json is not a vocabulary cemfrac has a kind for (byte, gpt2, or a "
          "SentencePiece model it trained)";
      return nullptr;
    }
  } catch (const Error& e) {
    *why = fmt::format(
        "{} (cemfrac's tokenizers: byte, GPT-2's own BPE, SentencePiece models "
        "that cemfrac prepare trained)",
        e.what());
    return nullptr;
  }
  *why = "no tokenizer files (tokenizer.model, vocab.json + merges.txt, tokenizer.json)";
  return nullptr;
}

namespace {

TensorMap read_hf_tensors(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir / "model.safetensors", ec))
    return load_safetensors((dir / "model.safetensors").string()).tensors;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    const json j = json::parse(read_file(index.string()), nullptr, false);
    CEMFRAC_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                  "{}: not a safetensors index (no weight_map object)", index.string());
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      CEMFRAC_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos,
                    "{}: weight_map entry '{}' is not a file name in the directory", index.string(),
                    name);
      files.insert(file.get<std::string>());
    }
    TensorMap all;
    for (const std::string& f : files) {
      for (auto& [name, t] : load_safetensors((dir / f).string()).tensors) {
        CEMFRAC_CHECK(all.emplace(name, t).second, "{}: tensor '{}' appears in two shards",
                      dir.string(), name);
      }
    }
    return all;
  }
  CEMFRAC_CHECK(!fs::exists(dir / "pytorch_model.bin", ec),
                "{}: only pytorch_model.bin (pickle); cemfrac reads safetensors: load it in "
                "transformers and save_pretrained() it again",
                dir.string());
  fail("{}: no model.safetensors or model.safetensors.index.json", dir.string());
}

}  // namespace

HfImportResult import_hf(const std::string& hf_dir, const std::string& out) {
  const fs::path dir(hf_dir);
  std::error_code ec;
  CEMFRAC_CHECK(fs::is_directory(dir, ec), "{}: not a directory", hf_dir);
  check_new_run_dir(out, "--out");
  const fs::path config_path = dir / "config.json";
  CEMFRAC_CHECK(fs::is_regular_file(config_path, ec), "{}: no config.json", hf_dir);
  const json hf_config = json::parse(read_file(config_path.string()), nullptr, false);
  CEMFRAC_CHECK(!hf_config.is_discarded(), "{}: not valid JSON", config_path.string());
  HfImported imported = from_hf(hf_config, read_hf_tensors(dir), hf_dir);
  for (const auto& [name, t] : imported.tensors)
    CEMFRAC_CHECK(t.scalar_type() == torch::kFloat32,
                  "{}: tensor '{}' is float64: cemfrac's weights are float32 and it would round "
                  "them; save the model in float32",
                  hf_dir, name);
  check_finite(imported.tensors, hf_dir);

  HfImportResult result;
  result.config = imported.config;
  result.notes = imported.notes;
  std::string why;
  std::unique_ptr<Tokenizer> tokenizer = tokenizer_from_hf(hf_dir, &why);
  if (tokenizer && tokenizer->vocab_size() > imported.config.vocab_size) {
    why = fmt::format("the tokenizer has {} ids but the model only {} rows",
                      tokenizer->vocab_size(), imported.config.vocab_size);
    tokenizer.reset();
  }
  if (tokenizer)
    result.tokenizer = tokenizer->id();
  else
    result.notes.push_back("no tokenizer imported: " + why);

  CheckpointContents contents;
  contents.model = imported.tensors;
  contents.config = to_json(imported.config);
  contents.tokenizer = tokenizer.get();
  contents.optimizer_metadata = {{"imported_from", fs::absolute(dir).lexically_normal().string()}};
  fs::create_directories(checkpoints_dir(out));
  const DirLock lock = DirLock::acquire(out, "import");
  result.checkpoint_dir = save_checkpoint(out, contents, /*keep=*/0);
  return result;
}

}  // namespace cemfrac

// cemfrac -> transformers: which configs a stock class holds, its config.json, the tensor mapping,
// the tokenizer files and `cemfrac export` (interop/hf.h).
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <system_error>

#include <unistd.h>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/byte_tokenizer.h"
#include "cemfrac/data/gpt2_tokenizer.h"
#include "cemfrac/data/sentencepiece_tokenizer.h"
#include "cemfrac/interop/hf.h"
#include "cemfrac/layers/registry.h"
#include "cemfrac/train/checkpoint.h"

namespace cemfrac {

namespace fs = std::filesystem;
using nlohmann::json;

const char* hf_class_name(HfArch arch) {
  return arch == HfArch::kGpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
}

namespace {

// Why a CEM sub-layer is not a stock one ("" = it is, at T = 1 with the tied tensors written out).
std::string cem_problem(const ModelConfig& c, bool attention) {
  const CemConfig& cem = c.cem;
  if (cem.steps != 1)
    return fmt::format("cem.steps = {}: T > 1 recursive steps are not one attention/MLP pass",
                       cem.steps);
  if (cem.precond) return "cem.precond: a learned preconditioner has no stock counterpart";
  if (cem.prox != CemProxMode::kNone) return "cem.prox: the proximal term has no stock counterpart";
  if (!attention) return "";
  if (cem.dlr != CemDiagonal::kNone)
    return "cem.dlr: the D+LR diagonal term has no stock counterpart";
  if (cem.attention == CemAttentionKernel::kLinear)
    return "cem.attention = linear: linear attention has no stock counterpart";
  if (c.positions == Positions::kRope && cem.rope_mode == CemRopeMode::kExact)
    return "cem.rope_mode = exact rotates each read-out back by its query's angle, which Llama's "
           "attention does not (cem.rope_mode = naive is Llama attention with tied weights)";
  if (c.positions == Positions::kRope && cem.rope_mode == CemRopeMode::kNone)
    return "cem.rope_mode = none leaves the CEM layers unrotated beside RoPE, which no stock class "
           "mixes";
  return "";
}

}  // namespace

std::string hf_export_problem(const ModelConfig& c, HfArch* arch_out) {
  bool any_cem = false, all_gpt2 = true, all_llama = true;
  std::string first_problem;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const MixerKind mixer = parse_mixer_kind(c.mixer_of(l));
    auto refuse = [&](const std::string& why) {
      if (first_problem.empty()) first_problem = fmt::format("layer {} {}", l, why);
    };
    if (!c.has_ffn(l)) {
      refuse("has no FFN (ffn = none): every transformers decoder block has an MLP");
      continue;
    }
    const FfnKind ffn = parse_ffn_kind(c.ffn_of(l));
    if (mixer != MixerKind::kMha && mixer != MixerKind::kCemAttention)
      refuse(fmt::format("mixer {}: no transformers class computes it", to_string(mixer)));
    if (ffn != FfnKind::kGeluMlp && ffn != FfnKind::kSwiGlu && ffn != FfnKind::kCemMlp)
      refuse(fmt::format("FFN {}: no transformers class computes it", to_string(ffn)));
    if (mixer == MixerKind::kCemAttention) {
      any_cem = true;
      if (const std::string p = cem_problem(c, true); !p.empty()) refuse("cem_attention: " + p);
    }
    if (ffn == FfnKind::kCemMlp) {
      any_cem = true;
      if (const std::string p = cem_problem(c, false); !p.empty()) refuse("cem_mlp: " + p);
    }
    all_gpt2 = all_gpt2 && mixer == MixerKind::kMha && ffn == FfnKind::kGeluMlp;
    all_llama = all_llama && ffn != FfnKind::kGeluMlp;
  }
  if (!first_problem.empty()) return first_problem;
  if (all_gpt2) {
    if (c.norm != NormKind::kLayerNorm || c.positions != Positions::kLearned ||
        c.kv_heads() != c.n_heads)
      return "a GELU MLP model is GPT-2 only with norm = layernorm, positions = learned and no "
             "grouped-query attention";
    if (arch_out) *arch_out = HfArch::kGpt2;
    return "";
  }
  if (!all_llama) return "GELU MLP layers mixed with gated ones: no stock class mixes them";
  if (c.norm != NormKind::kRmsNorm) return "a gated-MLP model is Llama only with norm = rmsnorm";
  if (c.positions != Positions::kRope)
    return fmt::format("positions = {}: Llama always rotates queries and keys (positions = rope)",
                       enum_name(c.positions));
  if (c.kv_heads() != c.n_heads && any_cem)
    return "grouped-query attention beside CEM layers";  // cem_attention has no GQA of its own
  if (arch_out) *arch_out = HfArch::kLlama;
  return "";
}

json hf_config_json(const ModelConfig& c, const Tokenizer* tokenizer) {
  HfArch arch = HfArch::kLlama;
  const std::string problem = hf_export_problem(c, &arch);
  CEMFRAC_CHECK(problem.empty(), "export: {}", problem);
  const json eot = tokenizer ? json(tokenizer->eot_id()) : json(nullptr);
  json j;
  j["architectures"] = {hf_class_name(arch)};
  if (arch == HfArch::kGpt2) {
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.context;
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layers;
    j["n_head"] = c.n_heads;
    j["n_inner"] = c.d_ff;
    j["activation_function"] = "gelu_new";  // GPT-2's tanh approximation, as gelu_mlp computes
    j["layer_norm_epsilon"] = c.norm_eps;
    j["resid_pdrop"] = j["embd_pdrop"] = j["attn_pdrop"] = 0.0;  // cemfrac trains without dropout
    j["scale_attn_weights"] = true;
  } else {
    j["model_type"] = "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layers;
    j["num_attention_heads"] = c.n_heads;
    j["num_key_value_heads"] = c.kv_heads();
    j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.context;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.rope_scaling.type == RopeScalingType::kLlama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_context}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["attention_bias"] = j["mlp_bias"] = c.bias;
    j["attention_dropout"] = 0.0;
  }
  j["initializer_range"] = c.init_std;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["bos_token_id"] = eot;
  j["eos_token_id"] = eot;
  j["torch_dtype"] = "float32";
  return j;
}

namespace {

class Mapper {
 public:
  Mapper(const ModelConfig& c, const TensorMap& in) : c_(c), in_(in) {}

  const torch::Tensor& get(const std::string& name) const {
    auto it = in_.find(name);
    CEMFRAC_CHECK(it != in_.end(), "export: the checkpoint has no tensor '{}'", name);
    return it->second;
  }
  // The tensor, or zeros of `size` when the model has none (a bias-free layer in a biased class).
  torch::Tensor get_or_zeros(const std::string& name, int64_t size) const {
    auto it = in_.find(name);
    if (it != in_.end()) return it->second;
    return torch::zeros({size}, torch::kFloat32);
  }
  // eta = softplus(eta_raw) of a CEM sub-layer, 1 when frozen or preconditioned.
  torch::Tensor eta(const std::string& prefix) const {
    if (!c_.cem.learn_eta()) return torch::ones({}, torch::kFloat32);
    return torch::softplus(get(prefix + "eta_raw")).reshape({});
  }

  TensorMap gpt2() const {
    TensorMap out;
    const int64_t D = c_.d_model, M = c_.d_ff;
    out["transformer.wte.weight"] = get("wte.weight");
    out["transformer.wpe.weight"] = get("wpe.weight");
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("transformer.h.{}.", l);
      // transformers' GPT-2 keeps Conv1D weights as (in, out): ours transposed.
      out[h + "ln_1.weight"] = get(b + "norm1.weight");
      out[h + "ln_1.bias"] = get_or_zeros(b + "norm1.bias", D);
      out[h + "attn.c_attn.weight"] = get(b + "attn.w_qkv").t();
      out[h + "attn.c_attn.bias"] = get_or_zeros(b + "attn.b_qkv", 3 * D);
      out[h + "attn.c_proj.weight"] = get(b + "attn.w_o").t();
      out[h + "attn.c_proj.bias"] = get_or_zeros(b + "attn.b_o", D);
      out[h + "ln_2.weight"] = get(b + "norm2.weight");
      out[h + "ln_2.bias"] = get_or_zeros(b + "norm2.bias", D);
      out[h + "mlp.c_fc.weight"] = get(b + "mlp.w_fc").t();
      out[h + "mlp.c_fc.bias"] = get_or_zeros(b + "mlp.b_fc", M);
      out[h + "mlp.c_proj.weight"] = get(b + "mlp.w_proj").t();
      out[h + "mlp.c_proj.bias"] = get_or_zeros(b + "mlp.b_proj", D);
    }
    out["transformer.ln_f.weight"] = get("norm_f.weight");
    out["transformer.ln_f.bias"] = get_or_zeros("norm_f.bias", D);
    if (!c_.tie_embeddings) out["lm_head.weight"] = get("head.weight");
    return out;
  }

  TensorMap llama() const {
    TensorMap out;
    const int64_t D = c_.d_model, M = c_.d_ff, dh = c_.head_dim();
    const int64_t H = c_.n_heads, Hkv = c_.kv_heads();
    out["model.embed_tokens.weight"] = get("wte.weight");
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("model.layers.{}.", l);
      out[h + "input_layernorm.weight"] = get(b + "norm1.weight");
      out[h + "post_attention_layernorm.weight"] = get(b + "norm2.weight");
      const std::string a = h + "self_attn.", m = h + "mlp.";
      if (parse_mixer_kind(c_.mixer_of(l)) == MixerKind::kMha) {
        const std::vector<torch::Tensor> w =
            get(b + "attn.w_qkv").split_with_sizes({H * dh, Hkv * dh, Hkv * dh}, 0);
        out[a + "q_proj.weight"] = w[0];
        out[a + "k_proj.weight"] = w[1];
        out[a + "v_proj.weight"] = w[2];
        out[a + "o_proj.weight"] = get(b + "attn.w_o");
        if (c_.bias) {
          const std::vector<torch::Tensor> bias =
              get(b + "attn.b_qkv").split_with_sizes({H * dh, Hkv * dh, Hkv * dh}, 0);
          out[a + "q_proj.bias"] = bias[0];
          out[a + "k_proj.bias"] = bias[1];
          out[a + "v_proj.bias"] = bias[2];
          out[a + "o_proj.bias"] = get(b + "attn.b_o");
        }
      } else {  // cem_attention at T = 1: values = keys, output = eta * queries^T
        const torch::Tensor& wq = get(b + "attn.w_q");
        out[a + "q_proj.weight"] = wq;
        out[a + "k_proj.weight"] = get(b + "attn.w_k");
        out[a + "v_proj.weight"] = get(b + "attn.w_k");
        out[a + "o_proj.weight"] = (wq.t() * eta(b + "attn.")).contiguous();
        if (c_.bias) {
          for (const char* p : {"q_proj.bias", "k_proj.bias", "v_proj.bias"})
            out[a + p] = torch::zeros({H * dh}, torch::kFloat32);
          out[a + "o_proj.bias"] = torch::zeros({D}, torch::kFloat32);
        }
      }
      if (parse_ffn_kind(c_.ffn_of(l)) == FfnKind::kSwiGlu) {
        out[m + "gate_proj.weight"] = get(b + "mlp.w_gate");
        out[m + "up_proj.weight"] = get(b + "mlp.w_up");
        out[m + "down_proj.weight"] = get(b + "mlp.w_down");
        if (c_.bias) {
          out[m + "gate_proj.bias"] = get(b + "mlp.b_gate");
          out[m + "up_proj.bias"] = get(b + "mlp.b_up");
          out[m + "down_proj.bias"] = get(b + "mlp.b_down");
        }
      } else {  // cem_mlp at T = 1: form a is SwiGLU(gate W_U, up W_G), form b (gate W_G, up W_U)
        const torch::Tensor& wu = get(b + "mlp.w_u");
        const torch::Tensor& wg = get(b + "mlp.w_g");
        const bool form_a = c_.cem.mlp_form == CemMlpForm::kA;
        out[m + "gate_proj.weight"] = form_a ? wu : wg;
        out[m + "up_proj.weight"] = form_a ? wg : wu;
        out[m + "down_proj.weight"] = (wu.t() * eta(b + "mlp.")).contiguous();
        if (c_.bias) {
          out[m + "gate_proj.bias"] = torch::zeros({M}, torch::kFloat32);
          out[m + "up_proj.bias"] = torch::zeros({M}, torch::kFloat32);
          out[m + "down_proj.bias"] = torch::zeros({D}, torch::kFloat32);
        }
      }
    }
    out["model.norm.weight"] = get("norm_f.weight");
    if (!c_.tie_embeddings) out["lm_head.weight"] = get("head.weight");
    return out;
  }

 private:
  const ModelConfig& c_;
  const TensorMap& in_;
};

// transformers' tokenizer.json (the `tokenizers` library's format) for the byte tokenizer: pieces
// <0x00>..<0xFF> with byte fallback (every character falls back to its UTF-8 bytes, so each id is
// the byte's value) and <|endoftext|> = 256 as a special token.
std::string byte_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = b;
  vocab[kEndOfText] = ByteTokenizer::kEotId;
  json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", ByteTokenizer::kEotId},
         {"content", kEndOfText},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}}};
  return j.dump(2) + "\n";
}

}  // namespace

TensorMap to_hf_tensors(const ModelConfig& config, const TensorMap& tensors) {
  HfArch arch = HfArch::kLlama;
  const std::string problem = hf_export_problem(config, &arch);
  CEMFRAC_CHECK(problem.empty(), "export: {}", problem);
  const Mapper mapper(config, tensors);
  return arch == HfArch::kGpt2 ? mapper.gpt2() : mapper.llama();
}

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const Tokenizer& tokenizer,
                                                                    int64_t context) {
  json cfg = {{"model_max_length", context}, {"eos_token", kEndOfText},
              {"bos_token", kEndOfText},     {"add_bos_token", false},
              {"add_eos_token", false},      {"clean_up_tokenization_spaces", false}};
  std::vector<std::pair<std::string, std::string>> files;
  if (const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tokenizer)) {
    // SentencePiece trained without a dummy prefix: transformers must not add one either.
    cfg["tokenizer_class"] = "LlamaTokenizer";
    cfg["unk_token"] = "<unk>";
    cfg["bos_token"] = nullptr;  // the model has no BOS piece; documents end with the eos
    cfg["add_prefix_space"] = false;
    cfg["legacy"] = false;
    files.emplace_back("tokenizer.model", sp->model_bytes());
  } else if (dynamic_cast<const Gpt2Tokenizer*>(&tokenizer)) {
    // The tokenizer's own save() gives its two files verbatim under cemfrac's names.
    const fs::path tmp = fs::temp_directory_path() /
                         fmt::format("cemfrac-export-{}", static_cast<long long>(::getpid()));
    tokenizer.save(tmp.string());
    files.emplace_back("vocab.json", read_file((tmp / Gpt2Tokenizer::kEncoderFile).string()));
    files.emplace_back("merges.txt", read_file((tmp / Gpt2Tokenizer::kMergesFile).string()));
    std::error_code ec;
    fs::remove_all(tmp, ec);
    cfg["tokenizer_class"] = "GPT2Tokenizer";
    cfg["unk_token"] = kEndOfText;
    cfg["add_prefix_space"] = false;
  } else if (dynamic_cast<const ByteTokenizer*>(&tokenizer)) {
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
    files.emplace_back("tokenizer.json", byte_tokenizer_json());
  } else {
    fail("export: tokenizer '{}' has no transformers form", tokenizer.id());
  }
  files.emplace_back("tokenizer_config.json", cfg.dump(2) + "\n");
  return files;
}

HfExportResult export_hf(const std::string& checkpoint, const std::string& out) {
  HfExportResult result;
  result.checkpoint = resolve_checkpoint(checkpoint);
  LoadOptions options;
  options.optimizer = false;
  const Checkpoint ck = load_checkpoint(result.checkpoint, options);
  const std::string config_path = (fs::path(result.checkpoint) / kCheckpointConfigFile).string();
  const ModelConfig config = model_config_from_json(ck.config, config_path);
  for (const auto& [name, t] : ck.model.tensors)
    CEMFRAC_CHECK(name.rfind("cls.", 0) != 0,
                  "{}: a fine-tuned classifier checkpoint (tensor '{}'): export the language model "
                  "it was fine-tuned from",
                  result.checkpoint, name);
  const std::string problem = hf_export_problem(config, &result.arch);
  CEMFRAC_CHECK(problem.empty(), "{}: cannot export to a stock transformers class: {}",
                result.checkpoint, problem);
  check_finite(ck.model.tensors, result.checkpoint);
  std::unique_ptr<Tokenizer> tokenizer;
  if (ck.has_tokenizer)
    tokenizer = load_tokenizer((fs::path(result.checkpoint) / kCheckpointTokenizerDir).string());

  const TensorMap tensors = to_hf_tensors(config, ck.model.tensors);
  result.tensors = static_cast<int64_t>(tensors.size());
  const json hf_config = hf_config_json(config, tokenizer.get());
  std::vector<std::pair<std::string, std::string>> tok_files;
  if (tokenizer) tok_files = hf_tokenizer_files(*tokenizer, config.context);
  for (const auto& f : tok_files) result.tokenizer_files.push_back(f.first);

  std::error_code ec;
  const fs::path o(out);
  CEMFRAC_CHECK(
      !fs::exists(fs::symlink_status(o, ec)) || (fs::is_directory(o, ec) && fs::is_empty(o, ec)),
      "--out {}: exists and is not an empty directory (export writes a new one)", out);
  write_dir_atomic(out, [&](const std::string& tmp) {
    const fs::path t(tmp);
    save_safetensors((t / "model.safetensors").string(), tensors,
                     {{"format", "pt"}, {"producer", "cemfrac " CEMFRAC_VERSION}});
    write_file_atomic((t / "config.json").string(), hf_config.dump(2) + "\n");
    json gen = {{"eos_token_id", hf_config["eos_token_id"]},
                {"bos_token_id", hf_config["bos_token_id"]}};
    write_file_atomic((t / "generation_config.json").string(), gen.dump(2) + "\n");
    for (const auto& [name, contents] : tok_files) write_file_atomic((t / name).string(), contents);
  });
  return result;
}

}  // namespace cemfrac

// Hugging Face `transformers` checkpoints in and out (docs/interop.md).
//
// Export: a cemfrac checkpoint whose math a stock `transformers` class computes exactly becomes a
// directory that `from_pretrained` loads: model.safetensors (transformers' names and layouts),
// config.json and the tokenizer it was trained with.
//   GPT2LMHeadModel   mixer mha, FFN gelu_mlp, LayerNorm, learned positions, no GQA (biases and
//                     LayerNorm shifts written as zeros when the model has none; tied or untied).
//   LlamaForCausalLM  mixer mha or cem_attention, FFN swiglu or cem_mlp, RMSNorm, RoPE (with its
//                     llama3 scaling), GQA, biases, tied or untied. A CEM layer qualifies at T = 1
//                     without D+LR, preconditioner or proximal term, and (attention) with
//                     cem.rope_mode = naive: its tied tensors are written out as separate ones
//                     (v = k, o = eta q^T, down = eta u^T, cem_layers.md) and eta is folded in.
// Everything else is refused in one line saying what no stock class holds (hf_export_problem).
//
// Import: a GPT-2 or Llama directory (config.json + model.safetensors, or shards with
// model.safetensors.index.json; float16/bfloat16 widened to float32) becomes a cemfrac checkpoint
// that eval, generate, finetune and cemfrac.load read. Biases that are all exactly zero are dropped
// (bias = false), which changes no logit.
//
// Tokenizers: gpt2 <-> vocab.json + merges.txt (GPT2Tokenizer); sp:N <-> tokenizer.model
// (LlamaTokenizer with add_prefix_space = false, no BOS); byte <-> a `tokenizers` tokenizer.json of
// 256 byte-fallback pieces + <|endoftext|> (PreTrainedTokenizerFast).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

enum class HfArch { kGpt2, kLlama };
const char* hf_class_name(HfArch arch);  // "GPT2LMHeadModel", "LlamaForCausalLM"

// "" when a stock class holds `config` exactly (then *arch says which), else one sentence naming
// the first feature none holds, e.g. "layer 0 FFN cffn: no transformers class computes continued
// fractions".
std::string hf_export_problem(const ModelConfig& config, HfArch* arch = nullptr);

// transformers' config.json for `config` (hf_export_problem must be ""); `tokenizer` (may be null)
// gives the end-of-text id as eos/bos.
nlohmann::json hf_config_json(const ModelConfig& config, const Tokenizer* tokenizer);

// cemfrac's tensors (model.safetensors names) -> transformers' names and layouts. Throws when a
// tensor the mapping needs is missing or has another shape.
TensorMap to_hf_tensors(const ModelConfig& config, const TensorMap& tensors);

// The inverse for a model that came from transformers: the cemfrac config and tensors of a GPT-2 or
// Llama config.json + tensors. `source` names the directory in errors.
struct HfImported {
  ModelConfig config;
  TensorMap tensors;
  std::vector<std::string> notes;  // what was decided, one line each (dropped zero biases, ...)
};
HfImported from_hf(const nlohmann::json& hf_config, const TensorMap& hf_tensors,
                   const std::string& source);

// The files of `tokenizer` in transformers' form, name -> contents.
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const Tokenizer& tokenizer,
                                                                    int64_t context);
// A cemfrac tokenizer from a transformers directory's files, or null with *why set (no files, or a
// vocabulary cemfrac has no kind for).
std::unique_ptr<Tokenizer> tokenizer_from_hf(const std::string& dir, std::string* why);

// `cemfrac export`: the checkpoint (or a run directory's newest) -> `out`, a new or empty directory
// written atomically. Returns the arch written.
struct HfExportResult {
  HfArch arch = HfArch::kLlama;
  std::string checkpoint;                    // resolved
  int64_t tensors = 0;                       // written
  std::vector<std::string> tokenizer_files;  // empty: the checkpoint has no tokenizer
};
HfExportResult export_hf(const std::string& checkpoint, const std::string& out);

// `cemfrac import`: a transformers directory -> <out>/checkpoints/step-000000 (a new run
// directory).
struct HfImportResult {
  std::string checkpoint_dir;
  ModelConfig config;
  std::vector<std::string> notes;
  std::string tokenizer;  // the cemfrac tokenizer id, or "" (then notes say why)
};
HfImportResult import_hf(const std::string& hf_dir, const std::string& out);

}  // namespace cemfrac

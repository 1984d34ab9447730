// Tiny models and trainer settings shared by the tests of several folders, and the relative error
// the float64 reference comparisons use. Header-only: each folder's binary includes what it needs.
#pragma once
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/model/model_config.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/trainer.h"
#include "tests/test_util.h"

namespace cemfrac::test {

// D = 16, L = 2, H = 2 and the given vocabulary, FFN width and context; otherwise ModelConfig's
// defaults (the Llama flavour: rmsnorm, rope, no biases, untied head).
inline ModelConfig tiny_model(int64_t vocab_size, int64_t d_ff, int64_t context) {
  ModelConfig c;
  c.vocab_size = vocab_size;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = d_ff;
  c.context = context;
  return c;
}

// The GPT-2 flavour of a config: LayerNorm, learned positions, biases, tied head.
inline ModelConfig gpt2_flavour(ModelConfig c) {
  c.norm = NormKind::kLayerNorm;
  c.positions = Positions::kLearned;
  c.bias = true;
  c.tie_embeddings = true;
  return c;
}

// A short run on a small dataset: micro-batches of 2 x 16 tokens, `tokens_per_step` tokens per
// step, lr 1e-2 -> 1e-3 after 2 warmup steps, a metrics line every step, checkpoints only at the
// end, no progress output. Evaluation cadence and size are left at their defaults for the caller to
// set.
inline TrainerOptions tiny_trainer_options(const std::string& out, const std::string& data_dir,
                                           int64_t steps, int64_t tokens_per_step) {
  TrainerOptions o;
  o.train.steps = steps;
  o.train.micro_batch = 2;
  o.train.seq_len = 16;
  o.train.tokens_per_step = tokens_per_step;
  o.train.lr_max = 1e-2;
  o.train.lr_min = 1e-3;
  o.train.warmup_steps = 2;
  o.train.log_every = 1;
  o.train.checkpoint_every = 0;
  o.train.out = out;
  o.data_dir = data_dir;
  o.progress = false;
  return o;
}

// max |a - b| / max |b| (b = the reference).
inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

// A checkpoint of `model` as a training run would leave it at step 1 (its weights and config.json,
// the byte tokenizer, the RNG state), written in process under a new temporary folder named after
// `tag`; returns the checkpoint's directory.
inline std::string save_byte_checkpoint(LmModel& model, const std::string& tag) {
  auto tok = make_tokenizer("byte");
  CheckpointContents contents;
  for (const auto& p : model->named_parameters())
    contents.model[p.key()] = p.value().detach().contiguous();
  contents.config = to_json(model->config());
  contents.tokenizer = tok.get();
  contents.trainer.step = 1;
  contents.trainer.torch_rng = torch_rng_state();
  return save_checkpoint(temp_dir(tag), contents, 0);
}

}  // namespace cemfrac::test

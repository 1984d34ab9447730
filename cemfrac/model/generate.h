// Sampling from an LmModel with incremental decoding: the prompt goes through one forward that
// fills the decode state, then one token per forward. Sampling: temperature (0 = greedy), top-k,
// top-p (nucleus), from a generator of its own seeded by `seed`, so the same seed gives the same
// text.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "cemfrac/model/lm_model.h"

namespace cemfrac {

struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy (argmax; top_k and top_p then do not matter)
  int64_t top_k = 0;         // keep the k most likely tokens (0 = all)
  double top_p = 1.0;        // keep the smallest set whose probability reaches top_p (1 = all)
};

struct GenerateOptions {
  SamplingOptions sampling;
  uint64_t seed = 0;
  int64_t max_new_tokens = 64;
  int64_t eos_id = -1;  // stop when this token is drawn (it is not returned); -1 = never
  // Only ids below this are ever drawn (greedy or sampled): the tokenizer's vocabulary when the
  // model's vocab_size is padded beyond it (257 byte ids in a 512-row model, 50257 in 50304). The
  // padding rows are dropped from the logits before temperature, top-k and top-p, so the sampling
  // distribution is a softmax over the tokenizer's ids only. -1 = the model's vocab_size.
  int64_t vocab_limit = -1;
};

enum class StopReason { kMaxNewTokens, kEndOfText, kContext, kCallback };
const char* to_string(StopReason reason);

struct GenerateResult {
  std::vector<int64_t> tokens;  // the new tokens only (without the prompt and the end-of-text id)
  StopReason stop = StopReason::kMaxNewTokens;
};

// Called with each new token as it is drawn (not the end-of-text id); return false to stop early.
using TokenCallback = std::function<bool(int64_t token)>;

// Generates after `prompt` (at least one token; at most the model's context). Stops after
// max_new_tokens, at eos_id, or when the context is full. Runs without gradients.
GenerateResult generate(LmModelImpl& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options, const TokenCallback& on_token = {});

// logits (B, V) -> logits / temperature with the tokens outside top-k / top-p set to -inf.
// Requires temperature > 0.
torch::Tensor filter_logits(const torch::Tensor& logits, const SamplingOptions& options);

// logits (B, V) -> the next token of each row, (B) int64 on the CPU: argmax when temperature = 0,
// else a draw from softmax(filter_logits(logits)) with `generator`.
torch::Tensor sample_next(const torch::Tensor& logits, const SamplingOptions& options,
                          torch::Generator& generator);

// A CPU generator seeded with `seed`.
torch::Generator make_sampling_generator(uint64_t seed);

}  // namespace cemfrac

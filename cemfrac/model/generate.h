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

// Where the time of one generate_batch call went (what `cemfrac bench generate` reports).
struct GenerateTimings {
  double prefill_s = 0;           // the first forward (every prompt's first prefill_positions)
  double decode_s = 0;            // everything after it: sampling and the one-position forwards
  int64_t prefill_positions = 0;  // positions of the first forward: the shortest prompt's length
  int64_t decode_steps = 0;       // forwards of one position (per row) after the first
  int64_t cache_bytes = 0;        // the decode state's caches at the end (decode_state_bytes)
};

// Generates after every prompt of `prompts` as one batch (rows in the given order) and returns one
// result per prompt. Each row computes what generate() computes for that prompt alone with the
// same options, at the same positions, with the same stops; sampled, each row draws from a
// generator of its own seeded with options.seed, as generate() does, so a prompt's text does not
// depend on the prompts beside it. The math is the same; the rounding of a batched forward (other
// GEMM shapes, a prompt's tail fed one position at a time) may differ in the last bits, so what
// tests/model/generate_test.cpp (GenerateBatch) pins is the result: the same tokens and stop
// reasons as generate(), greedy and sampled, for every mixer kind. No on_token callback: rows
// finish at different steps.
//
// Prompts of different lengths: no padding token ever enters the model. The first forward takes the
// first min_len positions of every prompt (min_len = the shortest prompt's length); after it every
// row advances one position per forward, and a row whose prompt is longer feeds its own next prompt
// token at that position instead of a drawn one, until its prompt is used up (the scheme of Llama's
// reference generate.py). So every token sits at the position it has when its prompt is generated
// alone, for every mixer kind (position-indexed logits, learned positions, RoPE, sparse patterns)
// without an attention mask; the cost is that the longer prompts' tails go through one position per
// forward. A row that has stopped keeps riding along (its outputs are ignored) until every row has.
std::vector<GenerateResult> generate_batch(LmModelImpl& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options,
                                           GenerateTimings* timings = nullptr);

// Bytes of every cache a decode state holds (the sum of its layers' MixerState::cache_bytes()).
int64_t decode_state_bytes(const DecodeState& state);

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

// Sliding-window perplexity over one token sequence (the protocol `cemfrac eval` states).
//
// A model of context C reads at most C tokens. Over tokens t_0 .. t_{n-1}, target i (predicting
// t_i from t_0 .. t_{i-1}) exists for i = 1 .. n-1; t_0 has no history and is context only (callers
// that want a text's first token scored prepend the end-of-text id, which in our shards precedes
// every document). Windows cover tokens [begin, end), at most C + 1 of them (C inputs, C targets):
//   window 0: [0, min(n, C+1)), scores all its targets;
//   window k: end grows by the stride S (to at most n), begin = max(0, end - C - 1), and it scores
//             only the targets after the previous window's end, each with at least C - S + 1 tokens
//             of history.
// So every target is scored exactly once, with as much history as the window allows. S = C gives
// disjoint windows (cheapest, least history); S = 1 gives every target C tokens of history (one
// forward per token).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace cemfrac {

// (B, N) int64 tokens -> (B, N, V) logits.
using LogitsFn = std::function<torch::Tensor(const torch::Tensor&)>;

struct ScoreWindow {
  int64_t begin = 0;       // first token of the window (its first input)
  int64_t end = 0;         // one past its last token (its last target)
  int64_t score_from = 0;  // targets with token index >= score_from are scored in this window
};

// The windows for n tokens (see the file comment). stride 0 means C / 2 (at least 1). Throws
// cemfrac::Error for n < 2, C < 1 or a stride outside [1, C].
std::vector<ScoreWindow> plan_windows(int64_t n_tokens, int64_t context, int64_t stride);

struct PerplexityOptions {
  int64_t context = 0;     // C: the model's context length
  int64_t stride = 0;      // S (0 = C / 2)
  int64_t batch_size = 8;  // windows per forward
  // Where the windows, targets and mask are built (the model's device); the loss is summed there
  // and read once per batch.
  torch::Device device = torch::kCPU;
};

struct PerplexityResult {
  double mean_loss = 0;   // nats per scored token
  double perplexity = 0;  // exp(mean_loss)
  double total_nats = 0;
  double total_bits = 0;  // total_nats / ln 2
  int64_t tokens_scored = 0;
  int64_t windows = 0;
  int64_t context = 0;
  int64_t stride = 0;
  int64_t bytes = 0;                    // UTF-8 bytes of the text, when the caller gave them
  std::optional<double> bits_per_byte;  // total_bits / bytes
  std::string protocol;                 // one sentence describing the windows
};

// Scores tokens (1-D int64) with the model under torch::NoGradGuard; the caller puts the module in
// eval mode. utf8_bytes > 0 adds bits per byte (the bytes the scored tokens decode to).
PerplexityResult evaluate_perplexity(const LogitsFn& logits, const torch::Tensor& tokens,
                                     const PerplexityOptions& options, int64_t utf8_bytes = 0);

nlohmann::json to_json(const PerplexityResult& result);

}  // namespace cemfrac

// Zero-shot scoring of task files (eval/task_file.h) with lm-evaluation-harness's request types and
// metrics (docs/evaluation.md states each definition):
//   multiple_choice  each choice's summed log-likelihood given the context (loglikelihood
//                    requests); acc = argmax is gold; acc_norm = argmax of log-likelihood over the
//                    choice's length in characters is gold (Python's len, as the harness);
//                    acc_bytes the same over its UTF-8 bytes; each with its standard error.
//   cloze            the target's log-likelihood given the context and whether greedy decoding
//                    (argmax at every target position) reproduces all of it: acc (exact match, with
//                    stderr), perplexity = exp(-mean target log-likelihood) as the harness's
//                    lambada reports it, and the per-token perplexity.
//   rolling          loglikelihood_rolling: each document on its own, the end-of-text id in front,
//                    cut into non-overlapping windows of the model's context (every token scored
//                    once; stride = context, the harness's windows); word_perplexity,
//                    byte_perplexity and bits_per_byte over the whole set, and token perplexity.
// Tokenisation follows the harness's loglikelihood: trailing whitespace of the context moves to the
// front of the continuation, the whole string is encoded and the continuation is the tokens after
// the context's own encoding (when the whole encoding does not begin with the context's, the two
// are encoded apart). Unlike the harness (which adds it only to an empty context) every context
// starts with the end-of-text id, because cemfrac's shards put one before every document.
// Contexts longer than the model's are cut from the left; a continuation longer than the context is
// scored in rolling pieces (score_requests).
//
// Batching: requests are sorted by length (longest first) and scored `batch` at a time, padded on
// the right to the longest of the batch: one forward per batch. Padding after the scored positions
// cannot change them in a causal model; a test checks that scores do not depend on the batching.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/eval/perplexity.h"  // LogitsFn
#include "cemfrac/eval/task_file.h"

namespace cemfrac {

// One scoring request: targets tokens[score_from], ..., tokens.back(), each predicted from the
// tokens before it (score_from >= 1).
struct ScoreRequest {
  std::vector<int64_t> tokens;
  int64_t score_from = 1;
};
struct ScoreResult {
  double loglik = 0;   // summed log-probability of the targets (nats, <= 0)
  int64_t tokens = 0;  // targets scored
  bool greedy = true;  // every target is the argmax of its position's logits
};

struct ScoreOptions {
  int64_t context = 0;  // the model's context: at most this many inputs per row
  int64_t batch = 8;    // rows per forward
  // Called after each batch with (requests done, requests in all).
  std::function<void(int64_t, int64_t)> progress;
};

// Scores every request (results in request order) under torch::NoGradGuard. A request longer than
// context + 1 tokens keeps its last context + 1. One whose targets alone exceed the context (the
// harness refuses it) is scored in consecutive pieces of `context` targets, each read with the
// `context` tokens before its last target, as rolling windows read a document: every target once.
std::vector<ScoreResult> score_requests(const LogitsFn& logits,
                                        const std::vector<ScoreRequest>& requests,
                                        const ScoreOptions& options);

// The request for `continuation` after `context` (see the file comment).
ScoreRequest loglikelihood_request(const Tokenizer& tokenizer, const std::string& context,
                                   const std::string& continuation);

// The requests of loglikelihood_rolling for one document: the end-of-text id, then `text`'s tokens,
// in windows of at most `context` inputs that score every token once (stride 0 = context: the
// harness's disjoint windows; a smaller stride rescored with more history). Empty when `text`
// encodes to no tokens.
std::vector<ScoreRequest> rolling_requests(const Tokenizer& tokenizer, const std::string& text,
                                           int64_t context, int64_t stride = 0);

struct TaskOptions {
  int64_t context = 0;  // the model's context
  int64_t batch = 8;
  int64_t stride = 0;   // rolling: window stride (0 = context: the harness's windows)
  std::function<void(int64_t, int64_t)> progress;
};

// Scores a task set; returns {"task", "request", "examples", "requests", "metrics": {...},
// "protocol"}. Metric keys: multiple_choice acc, acc_stderr, acc_norm, acc_norm_stderr, acc_bytes,
// acc_bytes_stderr, chance;
// cloze acc, acc_stderr, perplexity, token_perplexity, mean_loglik; rolling word_perplexity,
// byte_perplexity, bits_per_byte, token_perplexity, words, bytes, tokens, documents.
nlohmann::json evaluate_task(const TaskSet& task, const Tokenizer& tokenizer,
                             const LogitsFn& logits, const TaskOptions& options);

}  // namespace cemfrac

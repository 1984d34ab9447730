#include "cemfrac/eval/tasks.h"

#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include "cemfrac/core/check.h"
#include "cemfrac/eval/metrics.h"

namespace cemfrac {

namespace {

// score_requests for requests whose targets fit the context.
std::vector<ScoreResult> score_pieces(const LogitsFn& logits,
                                      const std::vector<ScoreRequest>& requests,
                                      const ScoreOptions& options) {
  CEMFRAC_CHECK(options.batch >= 1, "task: --batch {} must be >= 1", options.batch);
  const int64_t n = static_cast<int64_t>(requests.size());
  // Each row after left truncation: at most context + 1 tokens (context inputs).
  std::vector<int64_t> first(n), length(n);
  for (int64_t r = 0; r < n; ++r) {
    const ScoreRequest& q = requests[r];
    const int64_t len = static_cast<int64_t>(q.tokens.size());
    CEMFRAC_CHECK(q.score_from >= 1 && q.score_from < len,
                  "task: request {} scores tokens {}..{} of {}: needs at least one context token "
                  "and one target",
                  r, q.score_from, len - 1, len);
    TORCH_INTERNAL_ASSERT(len - q.score_from <= options.context, "a piece longer than the context");
    first[r] = std::max<int64_t>(0, len - options.context - 1);
    length[r] = len - first[r];
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Longest first (so a slow batch shows early and the ETA is an upper bound), ties in file order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return length[a] > length[b]; });

  torch::NoGradGuard no_grad;
  std::vector<ScoreResult> results(n);
  for (int64_t start = 0; start < n; start += options.batch) {
    const int64_t b = std::min(options.batch, n - start);
    const int64_t L = length[order[start]] - 1;  // inputs of the longest row
    torch::Tensor input = torch::zeros({b, L}, torch::kInt64);
    torch::Tensor target = torch::zeros({b, L}, torch::kInt64);
    torch::Tensor mask = torch::zeros({b, L}, torch::kBool);
    auto in_a = input.accessor<int64_t, 2>();
    auto tg_a = target.accessor<int64_t, 2>();
    auto mk_a = mask.accessor<bool, 2>();
    for (int64_t i = 0; i < b; ++i) {
      const int64_t r = order[start + i];
      const auto& t = requests[r].tokens;
      const int64_t f = first[r];
      // Input position j holds token f + j and predicts token f + j + 1.
      for (int64_t j = 0; j + 1 < length[r]; ++j) {
        in_a[i][j] = t[f + j];
        tg_a[i][j] = t[f + j + 1];
        mk_a[i][j] = f + j + 1 >= requests[r].score_from;
      }
    }
    const torch::Tensor out = logits(input);
    CEMFRAC_CHECK(out.dim() == 3 && out.size(0) == b && out.size(1) == L,
                  "task: the model returned logits of {} dims for inputs ({}, {})", out.dim(), b,
                  L);
    const torch::Tensor logp = torch::log_softmax(out.to(torch::kCPU, torch::kFloat32), -1);
    const torch::Tensor picked = logp.gather(2, target.unsqueeze(2)).squeeze(2).to(torch::kFloat64);
    const torch::Tensor greedy = logp.argmax(2).eq(target);
    auto pk_a = picked.accessor<double, 2>();
    auto gr_a = greedy.accessor<bool, 2>();
    for (int64_t i = 0; i < b; ++i) {
      ScoreResult& res = results[order[start + i]];
      for (int64_t j = 0; j < L; ++j) {
        if (!mk_a[i][j]) continue;
        res.loglik += pk_a[i][j];
        res.tokens += 1;
        res.greedy = res.greedy && gr_a[i][j];
      }
    }
    if (options.progress) options.progress(start + b, n);
  }
  return results;
}

}  // namespace

std::vector<ScoreResult> score_requests(const LogitsFn& logits,
                                        const std::vector<ScoreRequest>& requests,
                                        const ScoreOptions& options) {
  CEMFRAC_CHECK(options.context >= 1, "task: the model's context {} must be >= 1",
                options.context);
  const int64_t C = options.context;
  // A request with more targets than the context is cut into pieces that each score the next C
  // targets (or fewer, at the end) with the C tokens before their last one as input: the rolling
  // windows of a document, starting at the first target. Every target is scored once.
  std::vector<ScoreRequest> pieces;
  std::vector<size_t> owner;
  for (size_t r = 0; r < requests.size(); ++r) {
    const ScoreRequest& q = requests[r];
    const int64_t len = static_cast<int64_t>(q.tokens.size());
    CEMFRAC_CHECK(q.score_from >= 1 && q.score_from < len,
                  "task: request {} scores tokens {}..{} of {}: needs at least one context token "
                  "and one target",
                  r, q.score_from, len - 1, len);
    if (len - q.score_from <= C) {
      pieces.push_back(q);
      owner.push_back(r);
      continue;
    }
    for (int64_t from = q.score_from; from < len; from += C) {
      const int64_t end = std::min(len, from + C);
      const int64_t begin = std::max<int64_t>(0, end - C - 1);
      ScoreRequest piece;
      piece.tokens.assign(q.tokens.begin() + begin, q.tokens.begin() + end);
      piece.score_from = from - begin;
      pieces.push_back(std::move(piece));
      owner.push_back(r);
    }
  }
  const std::vector<ScoreResult> scored = score_pieces(logits, pieces, options);
  std::vector<ScoreResult> results(requests.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    ScoreResult& res = results[owner[k]];
    res.loglik += scored[k].loglik;
    res.tokens += scored[k].tokens;
    res.greedy = res.greedy && scored[k].greedy;
  }
  return results;
}

namespace {

std::vector<int64_t> widen(const std::vector<TokenId>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

ScoreOptions score_options(const TaskOptions& o) {
  ScoreOptions s;
  s.context = o.context;
  s.batch = o.batch;
  s.progress = o.progress;
  return s;
}

}  // namespace

ScoreRequest loglikelihood_request(const Tokenizer& tokenizer, const std::string& context_in,
                                   const std::string& continuation_in) {
  std::string context = context_in, continuation = continuation_in;
  size_t keep = context.size();
  while (keep > 0 && std::isspace(static_cast<unsigned char>(context[keep - 1]))) --keep;
  continuation = context.substr(keep) + continuation;
  context.resize(keep);
  const std::vector<TokenId> ctx = tokenizer.encode(context);
  std::vector<TokenId> whole = tokenizer.encode(context + continuation);
  ScoreRequest q;
  q.tokens.push_back(tokenizer.eot_id());
  if (whole.size() > ctx.size() && std::equal(ctx.begin(), ctx.end(), whole.begin())) {
    q.tokens.insert(q.tokens.end(), whole.begin(), whole.end());
  } else {
    const std::vector<TokenId> cont = tokenizer.encode(continuation);
    q.tokens.insert(q.tokens.end(), ctx.begin(), ctx.end());
    q.tokens.insert(q.tokens.end(), cont.begin(), cont.end());
  }
  q.score_from = 1 + static_cast<int64_t>(ctx.size());
  CEMFRAC_CHECK(static_cast<int64_t>(q.tokens.size()) > q.score_from,
                "task: the continuation '{}' encodes to no tokens", continuation_in);
  return q;
}

std::vector<ScoreRequest> rolling_requests(const Tokenizer& tokenizer, const std::string& text,
                                           int64_t context, int64_t stride) {
  std::vector<int64_t> ids{tokenizer.eot_id()};
  const auto body = widen(tokenizer.encode(text));
  ids.insert(ids.end(), body.begin(), body.end());
  std::vector<ScoreRequest> out;
  if (ids.size() < 2) return out;
  for (const ScoreWindow& w :
       plan_windows(static_cast<int64_t>(ids.size()), context, stride > 0 ? stride : context)) {
    ScoreRequest q;
    q.tokens.assign(ids.begin() + w.begin, ids.begin() + w.end);
    q.score_from = w.score_from - w.begin;
    out.push_back(std::move(q));
  }
  return out;
}

namespace {

// Each request type's scoring: its requests (appended to `requests`), then out["metrics"] and
// out["protocol"].
void score_choice(const TaskSet& task, const Tokenizer& tokenizer, const LogitsFn& logits,
                  const TaskOptions& options, std::vector<ScoreRequest>& requests,
                  nlohmann::json& out) {
  nlohmann::json& m = out["metrics"];
  std::vector<size_t> first_request;
  double chance = 0;
  for (const ChoiceExample& ex : task.choice) {
    first_request.push_back(requests.size());
    for (const std::string& c : ex.choices)
      requests.push_back(loglikelihood_request(tokenizer, ex.context, c));
    chance += 1.0 / static_cast<double>(ex.choices.size());
  }
  const auto res = score_requests(logits, requests, score_options(options));
  std::vector<double> acc, acc_norm, acc_bytes;
  for (size_t e = 0; e < task.choice.size(); ++e) {
    const ChoiceExample& ex = task.choice[e];
    // The harness's three readings, each the first maximum on ties (as np.argmax): the summed
    // log-likelihood; over the choice's length in characters (acc_norm, len(choice) in
    // Python); over its UTF-8 bytes (acc_bytes). The choice as written, its leading space
    // included; never over its tokens.
    size_t best[3] = {0, 0, 0};
    double best_ll[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (size_t c = 0; c < ex.choices.size(); ++c) {
      const double ll = res[first_request[e] + c].loglik;
      const double v[3] = {ll, ll / static_cast<double>(utf8_characters(ex.choices[c])),
                           ll / static_cast<double>(ex.choices[c].size())};
      for (int k = 0; k < 3; ++k)
        if (v[k] > best_ll[k]) best_ll[k] = v[k], best[k] = c;
    }
    acc.push_back(static_cast<int64_t>(best[0]) == ex.gold ? 1.0 : 0.0);
    acc_norm.push_back(static_cast<int64_t>(best[1]) == ex.gold ? 1.0 : 0.0);
    acc_bytes.push_back(static_cast<int64_t>(best[2]) == ex.gold ? 1.0 : 0.0);
  }
  const MeanStderr a = mean_stderr(acc), an = mean_stderr(acc_norm), ab = mean_stderr(acc_bytes);
  m["acc"] = a.mean;
  m["acc_stderr"] = a.stderr_;
  m["acc_norm"] = an.mean;
  m["acc_norm_stderr"] = an.stderr_;
  m["acc_bytes"] = ab.mean;
  m["acc_bytes_stderr"] = ab.stderr_;
  m["chance"] = chance / static_cast<double>(task.choice.size());
  out["protocol"] =
      "multiple choice: each choice's summed log-likelihood given the context; acc = "
      "argmax is gold, acc_norm = argmax of log-likelihood / characters of the choice is gold, "
      "acc_bytes = the same over its UTF-8 bytes";
}

void score_cloze(const TaskSet& task, const Tokenizer& tokenizer, const LogitsFn& logits,
                 const TaskOptions& options, std::vector<ScoreRequest>& requests,
                 nlohmann::json& out) {
  nlohmann::json& m = out["metrics"];
  for (const ClozeExample& ex : task.cloze)
    requests.push_back(loglikelihood_request(tokenizer, ex.context, ex.target));
  const auto res = score_requests(logits, requests, score_options(options));
  std::vector<double> acc;
  double sum_ll = 0;
  int64_t tokens = 0;
  for (const ScoreResult& r : res) {
    acc.push_back(r.greedy ? 1.0 : 0.0);
    sum_ll += r.loglik;
    tokens += r.tokens;
  }
  const MeanStderr a = mean_stderr(acc);
  const double n = static_cast<double>(res.size());
  m["acc"] = a.mean;
  m["acc_stderr"] = a.stderr_;
  m["mean_loglik"] = sum_ll / n;
  m["perplexity"] = std::exp(-sum_ll / n);
  m["token_perplexity"] = weighted_perplexity(sum_ll, static_cast<double>(tokens));
  m["target_tokens"] = tokens;
  out["protocol"] =
      "cloze: acc = greedy decoding reproduces every target token; perplexity = exp(-mean "
      "target log-likelihood) (the harness's lambada), token_perplexity = exp(-sum / target "
      "tokens)";
}

void score_rolling(const TaskSet& task, const Tokenizer& tokenizer, const LogitsFn& logits,
                   const TaskOptions& options, std::vector<ScoreRequest>& requests,
                   nlohmann::json& out) {
  nlohmann::json& m = out["metrics"];
  const int64_t stride = options.stride > 0 ? options.stride : options.context;
  std::vector<size_t> doc_of;
  double words = 0, bytes = 0;
  for (size_t d = 0; d < task.rolling.size(); ++d) {
    const std::string& text = task.rolling[d].text;
    std::vector<ScoreRequest> doc = rolling_requests(tokenizer, text, options.context, stride);
    CEMFRAC_CHECK(!doc.empty(), "{}: document {} encodes to no tokens", task.name, d + 1);
    for (ScoreRequest& q : doc) {
      requests.push_back(std::move(q));
      doc_of.push_back(d);
    }
    words += static_cast<double>(harness_word_count(text));
    bytes += static_cast<double>(text.size());
  }
  const auto res = score_requests(logits, requests, score_options(options));
  double sum_ll = 0;
  int64_t tokens = 0;
  for (const ScoreResult& r : res) sum_ll += r.loglik, tokens += r.tokens;
  m["word_perplexity"] = weighted_perplexity(sum_ll, words);
  m["byte_perplexity"] = weighted_perplexity(sum_ll, bytes);
  m["bits_per_byte"] = bits_per_byte(sum_ll, bytes);
  m["token_perplexity"] = weighted_perplexity(sum_ll, static_cast<double>(tokens));
  m["words"] = static_cast<int64_t>(words);
  m["bytes"] = static_cast<int64_t>(bytes);
  m["tokens"] = tokens;
  m["documents"] = task.rolling.size();
  m["stride"] = stride;
  out["protocol"] = fmt::format(
      "rolling log-likelihood: each document after an end-of-text id, windows of up to {} "
      "inputs at stride {} (every token scored once{}); word_perplexity = exp(-sum loglik / "
      "words), byte_perplexity = exp(-sum / bytes), bits_per_byte = -sum / bytes / ln 2",
      options.context, stride,
      stride == options.context ? ", the harness's non-overlapping windows" : "");
}

}  // namespace

nlohmann::json evaluate_task(const TaskSet& task, const Tokenizer& tokenizer,
                             const LogitsFn& logits, const TaskOptions& options) {
  nlohmann::json out;
  out["task"] = task.name;
  out["request"] = to_string(task.type);
  out["examples"] = task.size();
  out["metrics"] = nlohmann::json::object();
  std::vector<ScoreRequest> requests;
  switch (task.type) {
    case RequestType::kMultipleChoice:
      score_choice(task, tokenizer, logits, options, requests, out);
      break;
    case RequestType::kCloze: score_cloze(task, tokenizer, logits, options, requests, out); break;
    case RequestType::kRolling:
      score_rolling(task, tokenizer, logits, options, requests, out);
      break;
    case RequestType::kAuto: fail("{}: the task's request type is not set", task.name);
  }
  out["requests"] = requests.size();
  return out;
}

}  // namespace cemfrac

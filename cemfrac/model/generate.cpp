#include "cemfrac/model/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"

namespace cemfrac {

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxNewTokens: return "max_new_tokens";
    case StopReason::kEndOfText: return "end_of_text";
    case StopReason::kContext: return "context_full";
    case StopReason::kCallback: return "stopped_by_caller";
  }
  return "?";
}

torch::Generator make_sampling_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

namespace {

void check_sampling(const SamplingOptions& o) {
  CEMFRAC_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
                "temperature = {}: must be a number >= 0 (0 = greedy)", o.temperature);
  CEMFRAC_CHECK(o.top_k >= 0, "top_k = {}: must be >= 0 (0 = off)", o.top_k);
  CEMFRAC_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p = {}: must be in (0, 1] (1 = off)", o.top_p);
}

// The checks generate() and generate_batch() share; returns the vocabulary limit.
int64_t check_request(const LmModelImpl& model, const std::vector<int64_t>& prompt,
                      const GenerateOptions& options) {
  check_sampling(options.sampling);
  const int64_t context = model.config().context;
  const int64_t vocab = model.config().vocab_size;
  CEMFRAC_CHECK(!prompt.empty(), "the prompt is empty; give at least one token (e.g. end-of-text)");
  CEMFRAC_CHECK(static_cast<int64_t>(prompt.size()) <= context,
                "the prompt has {} tokens but the model's context is {}; shorten the prompt",
                prompt.size(), context);
  CEMFRAC_CHECK(options.max_new_tokens >= 0, "max_new_tokens = {}: must be >= 0",
                options.max_new_tokens);
  const int64_t limit = options.vocab_limit < 0 ? vocab : options.vocab_limit;
  CEMFRAC_CHECK(limit >= 1 && limit <= vocab,
                "vocab_limit = {}: must be in 1..{} (the model's vocab_size)", limit, vocab);
  for (int64_t id : prompt) {
    CEMFRAC_CHECK(id >= 0 && id < limit, "prompt token id {} is outside the vocabulary 0..{}", id,
                  limit - 1);
  }
  return limit;
}

}  // namespace

int64_t decode_state_bytes(const DecodeState& state) {
  int64_t n = 0;
  for (const auto& layer : state.layers) n += layer ? layer->cache_bytes() : 0;
  return n;
}

torch::Tensor filter_logits(const torch::Tensor& logits, const SamplingOptions& o) {
  check_sampling(o);
  CEMFRAC_CHECK(o.temperature > 0, "filter_logits needs temperature > 0 (0 means greedy)");
  const double neg_inf = -std::numeric_limits<double>::infinity();
  torch::Tensor scaled = logits / o.temperature;  // (B, V)
  const int64_t V = scaled.size(-1);
  if (o.top_k > 0 && o.top_k < V) {
    // Everything below the k-th largest logit goes (ties with it stay).
    torch::Tensor kth = std::get<0>(scaled.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);  // (B, 1)
    scaled = scaled.masked_fill(scaled < kth, neg_inf);
  }
  if (o.top_p < 1.0) {
    // Sorted by probability, keep a token while the mass before it is still below top_p; the most
    // likely token always stays.
    auto [sorted, order] = scaled.sort(-1, /*descending=*/true);  // (B, V)
    torch::Tensor probs = torch::softmax(sorted, -1);
    torch::Tensor mass_before = probs.cumsum(-1) - probs;
    torch::Tensor drop_sorted = mass_before >= o.top_p;  // (B, V) in sorted order
    torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    scaled = scaled.masked_fill(drop, neg_inf);
  }
  return scaled;
}

torch::Tensor sample_next(const torch::Tensor& logits, const SamplingOptions& o,
                          torch::Generator& generator) {
  check_sampling(o);
  torch::Tensor cpu = logits.detach().to(torch::kCPU, torch::kFloat64);  // (B, V)
  if (o.temperature == 0) return cpu.argmax(-1);
  torch::Tensor probs = torch::softmax(filter_logits(cpu, o), -1);                    // (B, V)
  return torch::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1);  // (B)
}

GenerateResult generate(LmModelImpl& model, const std::vector<int64_t>& prompt,
                        const GenerateOptions& options, const TokenCallback& on_token) {
  const int64_t limit = check_request(model, prompt, options);
  const int64_t context = model.config().context;

  torch::NoGradGuard no_grad;
  torch::Generator generator = make_sampling_generator(options.seed);
  const torch::Device device = model.head_weight().device();
  DecodeState state = model.new_decode_state();
  GenerateResult result;

  // 1. The whole prompt in one forward; the next-token logits are those of its last position.
  torch::Tensor input = torch::tensor(prompt, torch::kInt64).view({1, -1}).to(device);  // (1, N)
  // Padding rows (ids >= limit) are cut off before sampling: they can never be drawn.
  torch::Tensor logits =
      model.forward(input, &state).select(1, -1).narrow(-1, 0, limit);  // (1, limit)
  // 2. One token per step, through the decode state.
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const int64_t token = sample_next(logits, options.sampling, generator).item<int64_t>();
    if (token == options.eos_id) {
      result.stop = StopReason::kEndOfText;
      return result;
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.stop = StopReason::kCallback;
      return result;
    }
    if (step + 1 == options.max_new_tokens) break;
    if (state.position >= context) {
      result.stop = StopReason::kContext;
      return result;
    }
    input = torch::full({1, 1}, token, torch::TensorOptions().dtype(torch::kInt64).device(device));
    logits = model.forward(input, &state).select(1, -1).narrow(-1, 0, limit);  // (1, limit)
  }
  result.stop = StopReason::kMaxNewTokens;
  return result;
}

namespace {

// The rows of one generate_batch: each row's prompt, drawn tokens, stop reason and generator.
class BatchRows {
 public:
  BatchRows(const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& options,
            int64_t context)
      : prompts_(prompts), o_(options), context_(context),
        greedy_(options.sampling.temperature == 0), results_(prompts.size()),
        done_(prompts.size(), options.max_new_tokens == 0) {
    // One generator per row, seeded alike: row i draws exactly the numbers generate() draws for
    // its prompt alone (a shared generator would make a prompt's text depend on its neighbours).
    if (!greedy_)
      for (size_t i = 0; i < prompts.size(); ++i)
        generators_.push_back(make_sampling_generator(o_.seed));
  }

  // Every row's token at `position` into `next`: its own prompt token while it lasts, then the
  // token drawn from its logits (the same stops, in the same order, as generate()). Returns
  // whether any row needs another forward.
  bool choose(int64_t position, const torch::Tensor& logits, std::vector<int64_t>& next) {
    torch::Tensor drawn;  // (B) greedy: every row's argmax at once
    if (greedy_) drawn = sample_next(logits, o_.sampling, unused_);
    bool any = false;
    for (size_t row = 0; row < prompts_.size(); ++row) {
      const auto& prompt = prompts_[row];
      if (position < static_cast<int64_t>(prompt.size())) {
        next[row] = prompt[static_cast<size_t>(position)];  // still reading its prompt
        any = any || !done_[row];
        continue;
      }
      if (done_[row]) {
        next[row] = prompt.back();  // any id: this row's outputs are no longer read
        continue;
      }
      const auto i = static_cast<int64_t>(row);
      next[row] =
          greedy_
              ? drawn[i].item<int64_t>()
              : sample_next(logits.narrow(0, i, 1), o_.sampling, generators_[row]).item<int64_t>();
      any = take(row, next[row], position) || any;
    }
    return any;
  }

  std::vector<GenerateResult> take_results() { return std::move(results_); }

 private:
  // Row `row` drew `token` at `position`: kept, or the row stops. Whether it goes on.
  bool take(size_t row, int64_t token, int64_t position) {
    GenerateResult& r = results_[row];
    if (token == o_.eos_id) {
      r.stop = StopReason::kEndOfText;
      done_[row] = true;
      return false;
    }
    r.tokens.push_back(token);
    if (static_cast<int64_t>(r.tokens.size()) == o_.max_new_tokens) {
      r.stop = StopReason::kMaxNewTokens;
    } else if (position >= context_) {
      r.stop = StopReason::kContext;
    } else {
      return true;
    }
    done_[row] = true;
    return false;
  }

  const std::vector<std::vector<int64_t>>& prompts_;
  const GenerateOptions& o_;
  const int64_t context_;
  const bool greedy_;
  std::vector<torch::Generator> generators_;
  torch::Generator unused_ = make_sampling_generator(0);  // greedy draws nothing
  std::vector<GenerateResult> results_;
  std::vector<bool> done_;
};

}  // namespace

std::vector<GenerateResult> generate_batch(LmModelImpl& model,
                                           const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options,
                                           GenerateTimings* timings) {
  CEMFRAC_CHECK(!prompts.empty(), "generate_batch needs at least one prompt");
  int64_t limit = 0;
  for (const auto& prompt : prompts) limit = check_request(model, prompt, options);
  const int64_t B = static_cast<int64_t>(prompts.size());
  size_t min_len = prompts[0].size();
  for (const auto& prompt : prompts) min_len = std::min(min_len, prompt.size());

  torch::NoGradGuard no_grad;
  const torch::Device device = model.head_weight().device();
  BatchRows rows(prompts, options, model.config().context);
  DecodeState state = model.new_decode_state();

  // 1. Every prompt's first min_len tokens in one forward.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> first;
  first.reserve(static_cast<size_t>(B) * min_len);
  for (const auto& prompt : prompts)
    first.insert(first.end(), prompt.begin(), prompt.begin() + min_len);
  torch::Tensor input = torch::tensor(first, torch::kInt64).view({B, -1}).to(device);  // (B, N)
  torch::Tensor logits =
      model.forward(input, &state).select(1, -1).narrow(-1, 0, limit);  // (B, limit)
  if (timings) {
    logits = logits.to(torch::kCPU);  // wait for the forward before the clock stops
    timings->prefill_s = seconds_since(t0);
    timings->prefill_positions = static_cast<int64_t>(min_len);
    timings->decode_steps = 0;
  }
  const auto t1 = std::chrono::steady_clock::now();

  // 2. One position per forward for every row.
  std::vector<int64_t> next(static_cast<size_t>(B));
  while (rows.choose(state.position, logits, next)) {
    input = torch::tensor(next, torch::kInt64).view({B, 1}).to(device);
    logits = model.forward(input, &state).select(1, -1).narrow(-1, 0, limit);  // (B, limit)
    if (timings) ++timings->decode_steps;
  }
  if (timings) {
    timings->decode_s = seconds_since(t1);
    timings->cache_bytes = decode_state_bytes(state);
  }
  return rows.take_results();
}

}  // namespace cemfrac

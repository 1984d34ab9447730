#include "cemfrac/eval/perplexity.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>

#include "cemfrac/core/check.h"

namespace cemfrac {

std::vector<ScoreWindow> plan_windows(int64_t n_tokens, int64_t context, int64_t stride) {
  CEMFRAC_CHECK(context >= 1, "eval: context {} must be at least 1", context);
  if (stride == 0) stride = std::max<int64_t>(context / 2, 1);
  CEMFRAC_CHECK(stride >= 1 && stride <= context,
                "eval: --stride {} must be between 1 and the model's context {}", stride, context);
  CEMFRAC_CHECK(n_tokens >= 2, "eval: {} token(s) is too short; at least 2 are needed to score one",
                n_tokens);
  std::vector<ScoreWindow> windows;
  int64_t end = std::min(n_tokens, context + 1);
  windows.push_back({0, end, 1});
  while (end < n_tokens) {
    const int64_t next_end = std::min(end + stride, n_tokens);
    windows.push_back({std::max<int64_t>(0, next_end - context - 1), next_end, end});
    end = next_end;
  }
  return windows;
}

PerplexityResult evaluate_perplexity(const LogitsFn& logits, const torch::Tensor& tokens,
                                     const PerplexityOptions& options, int64_t utf8_bytes) {
  CEMFRAC_CHECK(tokens.dim() == 1, "eval: tokens must be 1-D, got {} dims", tokens.dim());
  CEMFRAC_CHECK(options.batch_size >= 1, "eval: batch size {} must be at least 1",
                options.batch_size);
  const torch::Tensor ids = tokens.to(options.device, torch::kInt64).contiguous();
  const int64_t n = ids.size(0);
  // 0 = the default; a negative stride is refused by plan_windows, not replaced by the default.
  const int64_t stride =
      options.stride != 0 ? options.stride : std::max<int64_t>(options.context / 2, 1);
  const std::vector<ScoreWindow> windows = plan_windows(n, options.context, stride);
  // Every window has the same length (min(C, n - 1) inputs): the first is [0, min(n, C+1)) and each
  // later one ends at most at n and reaches back C + 1 tokens, which exist because the first window
  // was full. So windows batch without padding.
  const int64_t L = windows.front().end - windows.front().begin - 1;

  torch::NoGradGuard no_grad;
  double total = 0;
  int64_t scored = 0;
  for (size_t first = 0; first < windows.size(); first += options.batch_size) {
    const int64_t b = std::min<int64_t>(options.batch_size, windows.size() - first);
    std::vector<torch::Tensor> rows;
    torch::Tensor mask =
        torch::zeros({b, L}, torch::TensorOptions(torch::kBool).device(options.device));
    for (int64_t i = 0; i < b; ++i) {
      const ScoreWindow& w = windows[first + i];
      TORCH_INTERNAL_ASSERT(w.end - w.begin - 1 == L);
      rows.push_back(ids.narrow(0, w.begin, L + 1));
      // Position j predicts token begin + 1 + j; it is scored when that index >= score_from.
      const int64_t from = w.score_from - w.begin - 1;
      mask[i].narrow(0, from, L - from).fill_(true);
      scored += L - from;
    }
    const torch::Tensor window = torch::stack(rows);                        // (b, L + 1)
    const torch::Tensor out = logits(window.narrow(1, 0, L).contiguous());  // (b, L, V)
    CEMFRAC_CHECK(out.dim() == 3 && out.size(0) == b && out.size(1) == L,
                  "eval: the model returned logits of shape {} for inputs ({}, {})",
                  fmt::format("[{}]", fmt::join(out.sizes(), ", ")), b, L);
    const torch::Tensor losses =
        torch::cross_entropy_loss(out.reshape({b * L, -1}).to(torch::kFloat32),
                                  window.narrow(1, 1, L).reshape({b * L}), /*weight=*/{},
                                  at::Reduction::None, /*ignore_index=*/-100,
                                  /*label_smoothing=*/0.0)
            .reshape({b, L});
    total += losses.masked_select(mask).to(torch::kFloat64).sum().item<double>();
  }

  PerplexityResult r;
  r.tokens_scored = scored;
  r.windows = static_cast<int64_t>(windows.size());
  r.context = options.context;
  r.stride = stride;
  r.total_nats = total;
  r.total_bits = total / std::log(2.0);
  r.mean_loss = total / static_cast<double>(scored);
  r.perplexity = std::exp(r.mean_loss);
  if (utf8_bytes > 0) {
    r.bytes = utf8_bytes;
    r.bits_per_byte = r.total_bits / static_cast<double>(utf8_bytes);
  }
  r.protocol = fmt::format(
      "sliding windows of up to {} tokens at stride {}: each of the {} tokens after the first is "
      "scored exactly once, with at least {} tokens of history once the first window is full; "
      "the first token is context only",
      options.context, stride, scored, options.context - stride + 1);
  return r;
}

nlohmann::json to_json(const PerplexityResult& r) {
  nlohmann::json j = nlohmann::json::object();
  j["mean_loss"] = r.mean_loss;
  j["perplexity"] = r.perplexity;
  j["total_nats"] = r.total_nats;
  j["total_bits"] = r.total_bits;
  j["tokens_scored"] = r.tokens_scored;
  j["bytes"] = r.bytes > 0 ? nlohmann::json(r.bytes) : nlohmann::json(nullptr);
  j["bits_per_byte"] = r.bits_per_byte ? nlohmann::json(*r.bits_per_byte) : nlohmann::json(nullptr);
  j["windows"] = r.windows;
  j["context"] = r.context;
  j["stride"] = r.stride;
  j["protocol"] = r.protocol;
  return j;
}

}  // namespace cemfrac

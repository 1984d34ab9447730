// Sliding-window evaluation: each token is scored exactly once with the history the protocol
// promises, and the loss equals the analytic value for models with known logits.
#include "cemfrac/eval/perplexity.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <vector>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

// Counts, for each target index 1..n-1, how often the plan scores it, and checks the windows.
std::vector<int> score_counts(int64_t n, int64_t C, int64_t S) {
  const auto windows = plan_windows(n, C, S);
  std::vector<int> count(n, 0);
  for (size_t k = 0; k < windows.size(); ++k) {
    const ScoreWindow& w = windows[k];
    EXPECT_LE(w.end - w.begin - 1, C) << "at most C inputs";
    EXPECT_GE(w.begin, 0);
    EXPECT_LE(w.end, n);
    EXPECT_LT(w.score_from, w.end);
    if (k == 0) {
      EXPECT_EQ(w.score_from, 1) << "the first window scores all its targets";
    } else {
      EXPECT_GE(w.score_from - w.begin, std::min(C - S + 1, w.score_from))
          << "history of the first scored target of window " << k;
      EXPECT_EQ(w.end - w.begin - 1, C) << "later windows are full";
    }
    for (int64_t i = w.score_from; i < w.end; ++i) ++count[i];
  }
  return count;
}

TEST(Perplexity, EveryTokenScoredExactlyOnce) {
  for (int64_t n : {2, 5, 7, 8, 20, 23}) {
    for (int64_t C : {1, 3, 6}) {
      for (int64_t S = 1; S <= C; ++S) {
        SCOPED_TRACE(fmt::format("n {} C {} S {}", n, C, S));
        const auto count = score_counts(n, C, S);
        EXPECT_EQ(count[0], 0) << "the first token is context only";
        for (int64_t i = 1; i < n; ++i) EXPECT_EQ(count[i], 1) << "token " << i;
      }
    }
  }
}

TEST(Perplexity, WindowCountsForStrideOneAndStrideC) {
  // n = 20 tokens, C = 6: 19 targets; the first window scores 6.
  EXPECT_EQ(plan_windows(20, 6, 6).size(), 4u) << "stride C: disjoint windows, ceil(19 / 6)";
  EXPECT_EQ(plan_windows(20, 6, 1).size(), 14u) << "stride 1: one window per remaining target";
  EXPECT_EQ(plan_windows(20, 6, 4).size(), 1u + 4u) << "1 + ceil(13 / 4)";
  EXPECT_EQ(plan_windows(20, 6, 0).size(), plan_windows(20, 6, 3).size()) << "0 means C / 2";
  EXPECT_EQ(plan_windows(5, 6, 2).size(), 1u) << "a text shorter than the context: one window";
  // Stride 1: every window's single scored target sees the C tokens before it.
  for (const ScoreWindow& w : plan_windows(20, 6, 1)) {
    if (w.begin == 0) continue;
    EXPECT_EQ(w.score_from, w.end - 1);
    EXPECT_EQ(w.end - 1 - w.begin, 6);
  }
}

TEST(Perplexity, RejectsBadArguments) {
  EXPECT_THROW(plan_windows(1, 4, 1), Error);
  EXPECT_THROW(plan_windows(10, 4, 5), Error);
  EXPECT_THROW(plan_windows(10, 0, 1), Error);
  try {
    plan_windows(10, 4, 9);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--stride 9"), std::string::npos) << e.what();
  }
}

TEST(Perplexity, UniformLogitsGiveLogV) {
  const int64_t V = 50;
  int64_t rows = 0;
  LogitsFn uniform = [&](const torch::Tensor& x) {
    rows += x.size(0);
    EXPECT_LE(x.size(1), 8);
    return torch::zeros({x.size(0), x.size(1), V});
  };
  const torch::Tensor tokens = torch::randint(0, V, {101}, torch::kInt64);
  PerplexityOptions o;
  o.context = 8;
  o.stride = 3;
  o.batch_size = 4;
  const PerplexityResult r = evaluate_perplexity(uniform, tokens, o, /*utf8_bytes=*/400);
  EXPECT_EQ(r.tokens_scored, 100);
  EXPECT_EQ(r.windows, 1 + (100 - 8 + 2) / 3);
  EXPECT_EQ(rows, r.windows) << "every window evaluated once";
  EXPECT_NEAR(r.mean_loss, std::log(50.0), 1e-6);
  EXPECT_NEAR(r.perplexity, 50.0, 1e-4);
  EXPECT_NEAR(r.total_nats, 100 * std::log(50.0), 1e-4);
  EXPECT_NEAR(r.total_bits, 100 * std::log2(50.0), 1e-4);
  ASSERT_TRUE(r.bits_per_byte.has_value());
  EXPECT_NEAR(*r.bits_per_byte, 100 * std::log2(50.0) / 400, 1e-6);
  EXPECT_EQ(to_json(r)["tokens_scored"], 100);
  EXPECT_FALSE(r.protocol.empty());
}

// The documented decision (docs/formats.md, "Padding rows"): eval's softmax spans every row of the
// model's vocabulary, padding rows (ids the tokenizer never produces) included, exactly as the
// training loss and the trainer's val_loss do. Tokens come from 6 tokenizer ids; the model has 10
// rows with equal logits, so each token costs log 10, not log 6.
TEST(Perplexity, PaddingRowsAreInTheSoftmax) {
  LogitsFn flat = [](const torch::Tensor& x) { return torch::zeros({x.size(0), x.size(1), 10}); };
  const torch::Tensor tokens = torch::randint(0, 6, {41}, torch::kInt64);
  PerplexityOptions o;
  o.context = 8;
  const PerplexityResult r = evaluate_perplexity(flat, tokens, o, /*utf8_bytes=*/0);
  EXPECT_NEAR(r.mean_loss, std::log(10.0), 1e-6);
}

// A negative stride is refused, not replaced by the default (0 is the default).
TEST(Perplexity, NegativeStrideIsRefused) {
  LogitsFn flat = [](const torch::Tensor& x) { return torch::zeros({x.size(0), x.size(1), 4}); };
  const torch::Tensor tokens = torch::randint(0, 4, {20}, torch::kInt64);
  PerplexityOptions o;
  o.context = 8;
  o.stride = -5;
  try {
    evaluate_perplexity(flat, tokens, o, 0);
    FAIL() << "stride -5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--stride -5"), std::string::npos) << e.what();
  }
}

TEST(Perplexity, BigramModelGivesTheAnalyticLoss) {
  // logits at a position depend only on the input token there: loss = mean over i >= 1 of
  // -log softmax(table[t_{i-1}])[t_i], whatever the windows. Computed here in double.
  const int64_t V = 11;
  torch::manual_seed(3);
  const torch::Tensor table = torch::randn({V, V}, torch::kFloat64);
  LogitsFn bigram = [&](const torch::Tensor& x) {
    return table.index_select(0, x.reshape({-1}))
        .reshape({x.size(0), x.size(1), V})
        .to(torch::kFloat32);
  };
  const torch::Tensor tokens = torch::randint(0, V, {57}, torch::kInt64);
  const torch::Tensor logp = torch::log_softmax(table.to(torch::kFloat32).to(torch::kFloat64), 1);
  double expected = 0;
  for (int64_t i = 1; i < 57; ++i)
    expected -= logp[tokens[i - 1].item<int64_t>()][tokens[i].item<int64_t>()].item<double>();
  for (int64_t stride : {1, 4, 10}) {
    PerplexityOptions o;
    o.context = 10;
    o.stride = stride;
    o.batch_size = 3;
    const PerplexityResult r = evaluate_perplexity(bigram, tokens, o);
    EXPECT_EQ(r.tokens_scored, 56) << stride;
    EXPECT_NEAR(r.total_nats, expected, 1e-4) << stride;
    EXPECT_NEAR(r.mean_loss, expected / 56, 1e-6) << stride;
    EXPECT_FALSE(r.bits_per_byte.has_value());
  }
}

TEST(Perplexity, HistoryReachesTheModel) {
  // A model whose logit for the target depends on how many tokens it sees: position j of a window
  // (j + 1 tokens of history) puts logit j on token 0 and 0 elsewhere. With all tokens 0 the loss
  // of position j is log(V - 1 + e^j) - j, so the total reveals the history every target had.
  const int64_t V = 4, n = 30, C = 6;
  LogitsFn counting = [&](const torch::Tensor& x) {
    torch::Tensor out = torch::zeros({x.size(0), x.size(1), V}, torch::kFloat64);
    for (int64_t j = 0; j < x.size(1); ++j)
      out.select(1, j).select(1, 0).fill_(static_cast<double>(j));
    return out;
  };
  const torch::Tensor tokens = torch::zeros({n}, torch::kInt64);
  for (int64_t S : {1, 3, 6}) {
    double expected = 0;
    for (const ScoreWindow& w : plan_windows(n, C, S))
      for (int64_t i = w.score_from; i < w.end; ++i) {
        const double j = static_cast<double>(i - 1 - w.begin);  // position of target i
        expected += std::log(V - 1 + std::exp(j)) - j;
      }
    PerplexityOptions o;
    o.context = C;
    o.stride = S;
    EXPECT_NEAR(evaluate_perplexity(counting, tokens, o).total_nats, expected, 1e-4) << S;
  }
  // Stride 1 gives every target after the first window the full C tokens of history (j = C - 1).
  PerplexityOptions o;
  o.context = C;
  o.stride = 1;
  double full = 0;
  for (int64_t j = 0; j < C; ++j) full += std::log(V - 1 + std::exp(double(j))) - j;
  full += (n - 1 - C) * (std::log(V - 1 + std::exp(double(C - 1))) - (C - 1));
  EXPECT_NEAR(evaluate_perplexity(counting, tokens, o).total_nats, full, 1e-4);
}

}  // namespace
}  // namespace cemfrac

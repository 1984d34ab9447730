// Metric definitions (eval/metrics.h) on cases worked out by hand in the comments.
#include "cemfrac/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cemfrac {
namespace {

TEST(Metrics, MeanStderrUsesTheSampleStandardDeviation) {
  // {1, 0, 1, 1}: mean 3/4; sample variance (3 (1/4)^2 + (3/4)^2) / 3 = 1/4; stderr 1/2 / 2.
  const MeanStderr m = mean_stderr({1, 0, 1, 1});
  EXPECT_DOUBLE_EQ(m.mean, 0.75);
  EXPECT_DOUBLE_EQ(m.stderr_, 0.25);
  EXPECT_DOUBLE_EQ(mean_stderr({1}).stderr_, 0.0);
}

TEST(Metrics, MatthewsFromAConfusionMatrixByHand) {
  // Predicted / gold pairs: 6 (1,1), 2 (1,0), 1 (0,1), 3 (0,0): tp 6, fp 2, fn 1, tn 3.
  std::vector<int64_t> pred, gold;
  auto add = [&](int64_t p, int64_t g, int n) {
    for (int i = 0; i < n; ++i) pred.push_back(p), gold.push_back(g);
  };
  add(1, 1, 6);
  add(1, 0, 2);
  add(0, 1, 1);
  add(0, 0, 3);
  const Confusion c = confusion(pred, gold);
  EXPECT_EQ(c.tp, 6);
  EXPECT_EQ(c.fp, 2);
  EXPECT_EQ(c.fn, 1);
  EXPECT_EQ(c.tn, 3);
  // (6 * 3 - 2 * 1) / sqrt(8 * 7 * 5 * 4) = 16 / sqrt(1120) = 0.4780914437...
  EXPECT_NEAR(matthews_corrcoef(c), 16 / std::sqrt(1120.0), 1e-15);
  EXPECT_NEAR(matthews_corrcoef(c), 0.47809144373375745, 1e-15);
  // F1 = 2 tp / (2 tp + fp + fn) = 12 / 15; accuracy = 9 / 12.
  EXPECT_DOUBLE_EQ(f1_score(c), 0.8);
  EXPECT_DOUBLE_EQ(accuracy(pred, gold), 0.75);
  // A classifier that always says 1: a marginal is empty, MCC 0 (as scikit-learn).
  EXPECT_EQ(matthews_corrcoef(Confusion{7, 5, 0, 0}), 0.0);
  // Swapping the labels' roles flips the sign of nothing but keeps |MCC|; perfect is 1, inverse -1.
  EXPECT_DOUBLE_EQ(matthews_corrcoef(Confusion{3, 0, 0, 4}), 1.0);
  EXPECT_DOUBLE_EQ(matthews_corrcoef(Confusion{0, 3, 4, 0}), -1.0);
}

TEST(Metrics, PearsonAndSpearmanWithTies) {
  // x = 1..5, y = 2 1 4 3 5: deviations (-2 -1 0 1 2), (-1 -2 1 0 2): sxy 8, sxx 10, syy 10.
  EXPECT_NEAR(pearson({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5}), 0.8, 1e-15);
  // Ranks of (1 2 2 3) are (1 2.5 2.5 4); of (1 3 2 4) are (1 3 2 4): sxy 4.5, sxx 4.5, syy 5,
  // rho = 4.5 / sqrt(22.5) = 3 / sqrt(10).
  EXPECT_EQ(average_ranks({1, 2, 2, 3}), (std::vector<double>{1, 2.5, 2.5, 4}));
  EXPECT_NEAR(spearman({1, 2, 2, 3}, {1, 3, 2, 4}), 3 / std::sqrt(10.0), 1e-15);
  // Spearman sees only order: a monotone transform changes Pearson but not Spearman.
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {1, 8, 27, 64}), 1.0);
  EXPECT_LT(pearson({1, 2, 3, 4}, {1, 8, 27, 64}), 1.0);
}

TEST(Metrics, PerplexitiesAndBitsPerByte) {
  EXPECT_NEAR(weighted_perplexity(-std::log(4.0) * 3, 3), 4.0, 1e-12);
  EXPECT_NEAR(bits_per_byte(-std::log(2.0) * 10, 5), 2.0, 1e-12);
}

}  // namespace
}  // namespace cemfrac

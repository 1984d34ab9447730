// The comparison statistics (compare/stats.h): Student's t quantiles against tables, the paired
// interval by hand, the verdict rules; and the progress line's time left (compare/progress.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cemfrac/compare/progress.h"
#include "cemfrac/compare/stats.h"
#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

TEST(CompareStats, StudentTQuantileMatchesTables) {
  // Reference values: t_{0.975, df} to 9 digits (any statistics table / scipy.stats.t.ppf). The
  // bisection runs 200 halvings of [-1e4, 1e4] and the continued fraction to 1e-15 relative, so
  // 1e-7 is far above the method's error and far below a wrong df (t_{.975,2} - t_{.975,3} = 1.1).
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.706204736, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.302652730, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.776445105, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.975, 9), 2.262157163, 1e-7);
  EXPECT_NEAR(student_t_quantile(0.025, 9), -2.262157163, 1e-7);
  EXPECT_NEAR(student_t_cdf(0, 3), 0.5, 1e-12);
}

TEST(CompareStats, PairedIntervalByHand) {
  // d = a - b = {-0.1, -0.05, -0.15}: mean -0.1, sd 0.05, half-width t_{.975,2} * 0.05 / sqrt(3).
  const PairedDiff d = paired_difference({1.0, 1.2, 0.9}, {1.1, 1.25, 1.05});
  EXPECT_EQ(d.diff.n, 3);
  EXPECT_NEAR(d.diff.mean, -0.1, 1e-12);
  EXPECT_NEAR(d.diff.sd, 0.05, 1e-12);
  const double half = 4.302652730 * 0.05 / std::sqrt(3.0);  // 0.12420686...
  EXPECT_NEAR(d.lo, -0.1 - half, 1e-8);
  EXPECT_NEAR(d.hi, -0.1 + half, 1e-8);
  EXPECT_TRUE(d.has_interval);
  // Pairing matters: the same values unpaired would give a far wider spread.
  const PairedDiff tight = paired_difference({2.0, 3.0, 4.0, 5.0}, {2.1, 3.1, 4.1, 5.1});
  EXPECT_NEAR(tight.diff.sd, 0, 1e-12);
  EXPECT_NEAR(tight.lo, -0.1, 1e-12);
  // One seed: no interval.
  const PairedDiff one = paired_difference({1.0}, {2.0});
  EXPECT_FALSE(one.has_interval);
  EXPECT_EQ(verdict(one, ClaimTest::kBetter, 0), Verdict::kInconclusive);
  EXPECT_THROW(paired_difference({1.0, 2.0}, {1.0}), Error);
}

TEST(CompareStats, Verdicts) {
  auto diff = [](double lo, double hi) {
    PairedDiff d;
    d.lo = lo;
    d.hi = hi;
    d.diff.n = 3;
    d.has_interval = true;
    return d;
  };
  EXPECT_EQ(verdict(diff(-0.3, -0.1), ClaimTest::kBetter, 0), Verdict::kSupported);
  EXPECT_EQ(verdict(diff(0.1, 0.3), ClaimTest::kBetter, 0), Verdict::kContradicted);
  EXPECT_EQ(verdict(diff(-0.1, 0.1), ClaimTest::kBetter, 0), Verdict::kInconclusive);
  // not_worse with margin 0.05: a may trail b by less than 0.05 nats.
  EXPECT_EQ(verdict(diff(0.01, 0.04), ClaimTest::kNotWorse, 0.05), Verdict::kSupported);
  EXPECT_EQ(verdict(diff(0.06, 0.09), ClaimTest::kNotWorse, 0.05), Verdict::kContradicted);
  EXPECT_EQ(verdict(diff(0.01, 0.09), ClaimTest::kNotWorse, 0.05), Verdict::kInconclusive);
  EXPECT_EQ(verdict(diff(0.01, 0.04), ClaimTest::kBetter, 0), Verdict::kContradicted);
  using V = Verdict;
  EXPECT_EQ(combine({V::kSupported, V::kSupported}), V::kSupported);
  EXPECT_EQ(combine({V::kSupported, V::kInconclusive}), V::kInconclusive);
  EXPECT_EQ(combine({V::kSupported, V::kContradicted, V::kInconclusive}), V::kContradicted);
  EXPECT_EQ(combine({}), V::kInconclusive);
}

// ---- plots
// -----------------------------------------------------------------------------------------

// The progress line's time left: the plan's figure before anything is measured, the measured rate
// once a tenth of the phase (or ten minutes per job slot) is done, and between the two a blend
// that one coarse early report cannot blow up (a resumed gp suite once read 67h against 2h44m).
TEST(CompareProgress, EtaBlendsThePlanIntoTheMeasuredRate) {
  const double total = 20000;  // job-seconds, two jobs at a time: the plan says 10,000 s
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 0, 2), 10000);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 60, 2), 10000);
  // 1,200 job-seconds (ten minutes per slot, below a tenth of 20,000) done in 900 s: trusted.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 1200, 900, 2), (total - 1200) * 900 / 1200);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 5000, 2000, 2), (total - 5000) * 2000 / 5000);
  // A minute in with 5 job-seconds reported, the measured rate alone would say
  // (20,000 - 5) * 60 / 5 s, about 66h; the blend stays within 10% of the plan.
  const double early = phase_eta_seconds(total, 5, 60, 2);
  EXPECT_GT(early, (total - 5) / 2);
  EXPECT_LT(early, 1.1 * 10000);
  // Halfway to trusted: the mean of the two figures.
  const double half = phase_eta_seconds(total, 600, 600, 2);
  EXPECT_DOUBLE_EQ(half, 0.5 * (total - 600) * 600 / 600 + 0.5 * (total - 600) / 2);
  // A small phase: a tenth of it is the threshold.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(100, 10, 20, 1), 90.0 * 20 / 10);
  // Done (or past the estimate): nothing left; one job at a time when 0 is passed.
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, total, 500, 2), 0);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 2 * total, 500, 2), 0);
  EXPECT_DOUBLE_EQ(phase_eta_seconds(total, 0, 0, 0), total);
}

}  // namespace
}  // namespace cemfrac

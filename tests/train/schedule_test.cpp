// Warmup + cosine schedule at its key steps.
#include "cemfrac/train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cemfrac {
namespace {

TEST(Schedule, WarmupThenCosineToTheFloor) {
  const CosineSchedule s{/*lr_max=*/1.0, /*lr_min=*/0.1, /*warmup_steps=*/10, /*total_steps=*/110};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1) << "lr at step 0 = lr_max / warmup";
  EXPECT_DOUBLE_EQ(s.lr(4), 0.5) << "lr halfway through warmup";
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0) << "lr at warmup end = lr_max";
  // Decay runs from step 9 (p = 0) to step 109 (p = 1); step 59 is its middle.
  EXPECT_DOUBLE_EQ(s.lr(59), 0.55) << "lr mid-decay = (lr_max + lr_min) / 2";
  EXPECT_NEAR(s.lr(34), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15) << "quarter decay";
  EXPECT_DOUBLE_EQ(s.lr(109), 0.1) << "lr at the last step = lr_min";
  EXPECT_DOUBLE_EQ(s.lr(110), 0.1) << "lr beyond the last step = lr_min";
  EXPECT_DOUBLE_EQ(s.lr(100000), 0.1);
  for (int64_t t = 9; t < 109; ++t) EXPECT_GE(s.lr(t), s.lr(t + 1)) << "monotone decay at " << t;
  for (int64_t t = 0; t < 9; ++t) EXPECT_LT(s.lr(t), s.lr(t + 1)) << "monotone warmup at " << t;
}

TEST(Schedule, NoWarmupStartsAtThePeak) {
  const CosineSchedule s{2.0, 0.0, 0, 5};
  EXPECT_DOUBLE_EQ(s.lr(0), 2.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 0.0);
}

TEST(Schedule, WarmupLongerThanTheRun) {
  const CosineSchedule s{1.0, 0.5, 10, 4};
  EXPECT_DOUBLE_EQ(s.lr(3), 0.4) << "still warming up at the last step";
  const CosineSchedule one{1.0, 0.5, 1, 1};
  EXPECT_DOUBLE_EQ(one.lr(0), 1.0);
}

TEST(Schedule, ConstantWhenMinEqualsMax) {
  const CosineSchedule s{0.3, 0.3, 0, 50};
  for (int64_t t = 0; t < 60; ++t) EXPECT_DOUBLE_EQ(s.lr(t), 0.3);
}

}  // namespace
}  // namespace cemfrac

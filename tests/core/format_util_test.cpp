// with_commas: groups of three digits, the sign outside the groups, the int64 extremes.
#include "cemfrac/core/format_util.h"

#include <gtest/gtest.h>

#include <limits>

namespace cemfrac {
namespace {

TEST(FormatUtil, WithCommas) {
  EXPECT_EQ(with_commas(0), "0");
  EXPECT_EQ(with_commas(999), "999");
  EXPECT_EQ(with_commas(1000), "1,000");
  EXPECT_EQ(with_commas(124439808), "124,439,808");
  EXPECT_EQ(with_commas(-5), "-5");
  EXPECT_EQ(with_commas(-1234), "-1,234");
  EXPECT_EQ(with_commas(-123456), "-123,456");  // compare's old copy wrote "-,123,456"
  EXPECT_EQ(with_commas(std::numeric_limits<int64_t>::max()), "9,223,372,036,854,775,807");
  EXPECT_EQ(with_commas(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

}  // namespace
}  // namespace cemfrac

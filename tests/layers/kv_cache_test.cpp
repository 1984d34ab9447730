// KvCache (cemfrac/layers/kv_cache.h), the decode cache every mixer kind keeps: appends land in one
// buffer allocated for the capacity, the result is every position held, bad appends are refused
// with one clear error. (Decoding through each kind's state against its full forward is the
// contract suite's DecodingThroughTheStateEqualsTheFullForward.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/kv_cache.h"

namespace cemfrac {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KvCache, AppendsIntoOneBufferOfTheCapacity) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({2, 3, 10, 4}, torch::kFloat64);  // (B, H, T, d_h)
  KvCache cache;
  EXPECT_FALSE(cache.defined());
  EXPECT_EQ(cache.capacity(), 0);
  // The first chunk comes back as it is (the stateless path's own tensor).
  const torch::Tensor first = cache.append(x.narrow(2, 0, 4), 0, 10, 2, "test");
  EXPECT_TRUE(first.is_same(x.narrow(2, 0, 4)) || torch::equal(first, x.narrow(2, 0, 4)));
  EXPECT_EQ(cache.size(), 4);
  EXPECT_EQ(cache.capacity(), 10);
  const void* buffer = cache.values().data_ptr();
  for (int64_t t = 4; t < 10; ++t) {
    const torch::Tensor all = cache.append(x.narrow(2, t, 1), t, 10, 2, "test");
    EXPECT_TRUE(torch::equal(all, x.narrow(2, 0, t + 1))) << t;
    EXPECT_EQ(all.data_ptr(), buffer) << "no reallocation within the capacity";
  }
  EXPECT_EQ(cache.size(), 10);
  EXPECT_EQ(cache.capacity(), 10);
}

TEST(KvCache, RefusesOverflowBatchAndOffsetMismatches) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({2, 5, 3});  // (B, T, D), time along dimension 1
  KvCache cache;
  cache.append(x.narrow(1, 0, 4), 0, 4, 1, "test_kind");
  const std::string overflow =
      error_of([&] { cache.append(x.narrow(1, 4, 1), 4, 4, 1, "test_kind"); });
  EXPECT_NE(overflow.find("test_kind"), std::string::npos) << overflow;
  EXPECT_NE(overflow.find("capacity of 4"), std::string::npos) << overflow;
  EXPECT_EQ(cache.size(), 4) << "a refused append leaves the cache as it was";

  KvCache other;
  other.append(x.narrow(1, 0, 2), 0, 5, 1, "test_kind");
  const std::string batch =
      error_of([&] { other.append(x.narrow(0, 0, 1).narrow(1, 2, 1), 2, 5, 1, "test_kind"); });
  EXPECT_NE(batch.find("batch 2"), std::string::npos) << batch;
  const std::string offset =
      error_of([&] { other.append(x.narrow(1, 3, 1), 3, 5, 1, "test_kind"); });
  EXPECT_NE(offset.find("2 positions"), std::string::npos) << offset;
  EXPECT_NE(offset.find("position 3"), std::string::npos) << offset;
}

TEST(KvCache, WithoutACapacityGrowsByDoubling) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({1, 2, 40, 2});
  KvCache cache;
  int reallocations = 0;
  const void* last = nullptr;
  for (int64_t t = 0; t < 40; ++t) {
    const torch::Tensor all = cache.append(x.narrow(2, t, 1), t, 0, 2, "test");
    EXPECT_TRUE(torch::equal(all, x.narrow(2, 0, t + 1))) << t;
    if (cache.values().data_ptr() != last) ++reallocations;
    last = cache.values().data_ptr();
  }
  EXPECT_LE(reallocations, 4);  // room for 16, 34, 70 positions
}

TEST(KvCache, KeepsAutogradThroughTheCache) {
  const torch::Tensor x = torch::randn({1, 1, 3, 2}, torch::kFloat64).requires_grad_();
  KvCache cache;
  cache.append(x.narrow(2, 0, 2), 0, 3, 2, "test");
  const torch::Tensor all = cache.append(x.narrow(2, 2, 1), 2, 3, 2, "test");
  all.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones_like(x)));
}

}  // namespace
}  // namespace cemfrac

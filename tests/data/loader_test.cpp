// The data loader on shards of consecutive integers (llm.c's test_dataloader trick): token k has
// value k, so every window's expected contents are a known range, for every rank, epoch and resume.
#include "cemfrac/data/loader.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include "cemfrac/core/check.h"
#include "cemfrac/data/shard.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

// A shard whose tokens are 0, 1, ..., T-1 (one document 0..T-2, then end-of-text id T-1).
std::shared_ptr<const ShardReader> iota_shard(int64_t T) {
  const std::string path = test::temp_dir("loader") + "/iota.bin";
  std::vector<TokenId> doc(T - 1);
  std::iota(doc.begin(), doc.end(), 0);
  ShardInfo info;
  info.vocab_size = T;
  info.eot_id = static_cast<TokenId>(T - 1);
  info.tokenizer_id = "iota";
  write_shard(path, info, std::vector<std::vector<TokenId>>{doc});
  return std::make_shared<const ShardReader>(path);
}

LoaderOptions options(int64_t B, int64_t S, uint64_t seed = 7, bool shuffle = true,
                      int64_t rank = 0, int64_t world = 1) {
  LoaderOptions o;
  o.batch_size = B;
  o.seq_len = S;
  o.seed = seed;
  o.shuffle = shuffle;
  o.rank = rank;
  o.world_size = world;
  return o;
}

// Checks every row is a consecutive range starting at a multiple of S with targets = inputs + 1,
// and returns the rows' window indices.
std::vector<int64_t> window_indices(const Batch& batch, int64_t S) {
  std::vector<int64_t> out;
  EXPECT_EQ(batch.inputs.scalar_type(), torch::kInt64);
  EXPECT_EQ(batch.inputs.sizes(), batch.targets.sizes());
  for (int64_t b = 0; b < batch.inputs.size(0); ++b) {
    const int64_t start = batch.inputs[b][0].item<int64_t>();
    EXPECT_EQ(start % S, 0) << "window starts at a multiple of seq_len";
    const torch::Tensor expect = torch::arange(start, start + S, torch::kInt64);
    EXPECT_TRUE(torch::equal(batch.inputs[b], expect)) << "row " << b;
    EXPECT_TRUE(torch::equal(batch.targets[b], expect + 1)) << "row " << b;
    out.push_back(start / S);
  }
  return out;
}

TEST(Loader, PermutationIsAPermutationAndDependsOnSeedAndEpoch) {
  const auto p = window_permutation(1000, 42, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(p, window_permutation(1000, 42, 0)) << "reproducible";
  EXPECT_NE(p, window_permutation(1000, 42, 1)) << "epoch changes the order";
  EXPECT_NE(p, window_permutation(1000, 43, 0)) << "seed changes the order";
  // Frozen values: the data order must not change across platforms or releases (it would break
  // resuming runs written by another build).
  EXPECT_EQ(window_permutation(8, 1234, 0), (std::vector<int64_t>{4, 0, 2, 7, 1, 3, 6, 5}))
      << "also computed by an independent Python splitmix64 + Fisher-Yates";
}

TEST(Loader, UnshuffledWindowsAreConsecutiveRanges) {
  // T = 41, S = 4: windows [0..4], [4..8], ..., [36..40]: W = (41 - 1) / 4 = 10.
  TokenLoader loader(iota_shard(41), options(3, 4, 0, /*shuffle=*/false));
  EXPECT_EQ(loader.windows(), 10);
  EXPECT_EQ(window_indices(loader.next(), 4), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(window_indices(loader.next(), 4), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(window_indices(loader.next(), 4), (std::vector<int64_t>{6, 7, 8}));
  // The batch runs across the end of the epoch.
  const Batch b = loader.next();
  EXPECT_EQ(window_indices(b, 4), (std::vector<int64_t>{9, 0, 1}));
  EXPECT_EQ(b.position, (LoaderState{0, 9}));
  EXPECT_EQ(loader.state(), (LoaderState{1, 2}));
}

TEST(Loader, EveryWindowOncePerEpoch) {
  const int64_t S = 8, W = 37;
  TokenLoader loader(iota_shard(W * S + 1 + 3), options(1, S));  // 3 spare tokens: no extra window
  ASSERT_EQ(loader.windows(), W);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t i = 0; i < W; ++i) epoch0.push_back(window_indices(loader.next(), S)[0]);
  EXPECT_EQ(loader.state(), (LoaderState{1, 0}));
  for (int64_t i = 0; i < W; ++i) epoch1.push_back(window_indices(loader.next(), S)[0]);
  for (auto* e : {&epoch0, &epoch1}) {
    std::vector<int64_t> sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(W);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "each window exactly once";
  }
  EXPECT_NE(epoch0, epoch1) << "each epoch is reshuffled";
  EXPECT_EQ(epoch0, window_permutation(W, 7, 0));
}

TEST(Loader, TwoRanksPartitionAnEpoch) {
  const int64_t S = 5, W = 24;
  auto shard = iota_shard(W * S + 1);
  TokenLoader r0(shard, options(4, S, 9, true, 0, 2));
  TokenLoader r1(shard, options(4, S, 9, true, 1, 2));
  EXPECT_EQ(r0.windows_per_rank(), 12);
  std::vector<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    for (int64_t w : window_indices(r0.next(), S)) seen.push_back(w);
    for (int64_t w : window_indices(r1.next(), S)) seen.push_back(w);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> all(W);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(seen, all) << "the ranks' windows are disjoint and cover the epoch";
  // Rank r takes positions r, r + 2, ... of the epoch's permutation.
  const auto perm = window_permutation(W, 9, 0);
  TokenLoader again(shard, options(1, S, 9, true, 1, 2));
  EXPECT_EQ(window_indices(again.next(), S)[0], perm[1]);
  EXPECT_EQ(window_indices(again.next(), S)[0], perm[3]);
}

TEST(Loader, UnevenWindowCountGivesEveryRankTheSameSteps) {
  const int64_t S = 3, W = 7;
  auto shard = iota_shard(W * S + 1);
  TokenLoader r0(shard, options(1, S, 1, true, 0, 2));
  TokenLoader r1(shard, options(1, S, 1, true, 1, 2));
  EXPECT_EQ(r0.windows_per_rank(), 3);
  EXPECT_EQ(r1.windows_per_rank(), 3);
  std::set<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    seen.insert(window_indices(r0.next(), S)[0]);
    seen.insert(window_indices(r1.next(), S)[0]);
  }
  EXPECT_EQ(seen.size(), 6u) << "disjoint; the permutation's last window is skipped this epoch";
  EXPECT_EQ(seen.count(window_permutation(W, 1, 0)[6]), 0u);
}

TEST(Loader, ResumeMidEpochEqualsUninterrupted) {
  const int64_t S = 4;
  auto shard = iota_shard(23 * S + 1);
  TokenLoader a(shard, options(5, S, 3));
  for (int i = 0; i < 3; ++i) a.next();  // 15 of 23 windows: mid-epoch
  const LoaderState cursor = a.state();
  EXPECT_EQ(cursor, (LoaderState{0, 15}));
  TokenLoader b(shard, options(5, S, 3));
  b.restore(cursor);
  for (int i = 0; i < 12; ++i) {  // crosses two epoch boundaries
    const Batch x = a.next(), y = b.next();
    ASSERT_TRUE(torch::equal(x.inputs, y.inputs)) << "batch " << i;
    ASSERT_TRUE(torch::equal(x.targets, y.targets)) << "batch " << i;
    ASSERT_EQ(x.position, y.position);
  }
  EXPECT_EQ(a.state(), b.state());
}

// skip(n) leaves the cursor where reading n windows would, across epoch ends (data parallel: a rank
// skips the other ranks' windows of the global batch).
TEST(Loader, SkipEqualsReadingThatManyWindows) {
  const int64_t S = 4;
  auto shard = iota_shard(23 * S + 1);
  for (int64_t n : {0, 1, 7, 22, 23, 24, 50, 69}) {
    TokenLoader read(shard, options(1, S, 3)), skipped(shard, options(1, S, 3));
    read.restore({0, 5});
    skipped.restore({0, 5});
    for (int64_t i = 0; i < n; ++i) read.next();
    skipped.skip(n);
    EXPECT_EQ(read.state(), skipped.state()) << "n = " << n;
    EXPECT_TRUE(torch::equal(read.next().inputs, skipped.next().inputs)) << "n = " << n;
  }
}

TEST(Loader, RejectsTooLittleDataAndBadCursors) {
  auto shard = iota_shard(9);
  EXPECT_EQ(TokenLoader(shard, options(1, 8)).windows(), 1) << "9 tokens make one window of 8 + 1";
  try {
    TokenLoader(shard, options(1, 9));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iota.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenLoader(shard, options(1, 4, 0, true, 0, 3)), Error);  // 2 windows, 3 ranks
  EXPECT_THROW(TokenLoader(shard, options(1, 4, 0, true, 2, 2)), Error);  // rank out of range
  TokenLoader loader(shard, options(1, 4));
  EXPECT_THROW(loader.restore({0, 2}), Error);
  EXPECT_THROW(loader.restore({-1, 0}), Error);
}

}  // namespace
}  // namespace cemfrac

// Deterministic, rank-aware, resumable (B, S) batches from one token shard.
//
// The shard's T tokens are cut into W = floor((T - 1) / S) windows of S + 1 tokens at stride S:
// window k is tokens [k*S, k*S + S], its inputs the first S and its targets the last S (shifted by
// one), so every token but the first is a target exactly once per epoch. Epoch e visits the windows
// in the order of a permutation drawn from (seed, e) with our own PRNG (splitmix64 + Fisher-Yates,
// identical on every platform and LibTorch version). Rank r of a world of w ranks takes positions
// r, r + w, r + 2w, ... of that order, W / w windows per epoch and rank (the last W mod w windows
// of each epoch's order are skipped so all ranks make the same number of steps). Batches run on
// across epoch ends. state() after a batch is the cursor of the next window; restore() makes the
// loader continue exactly there.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cemfrac/data/shard.h"

namespace cemfrac {

// The cursor: the next window is position `index` of this rank's share of epoch `epoch`.
struct LoaderState {
  int64_t epoch = 0;
  int64_t index = 0;
};
bool operator==(const LoaderState& a, const LoaderState& b);

struct LoaderOptions {
  int64_t batch_size = 1;  // B
  int64_t seq_len = 1;     // S
  uint64_t seed = 0;       // data order
  bool shuffle = true;     // false: windows in shard order (validation)
  int64_t rank = 0;
  int64_t world_size = 1;
};

struct Batch {
  torch::Tensor inputs;   // (B, S) int64
  torch::Tensor targets;  // (B, S) int64, inputs shifted left by one token
  LoaderState position;   // cursor of the batch's first window (for reports)
};

// The permutation of [0, n) for (seed, epoch): seeded_permutation (core/random.h) of a stream
// derived from both.
std::vector<int64_t> window_permutation(int64_t n, uint64_t seed, int64_t epoch);

class TokenLoader {
 public:
  // Throws cemfrac::Error when the shard holds less than one window per rank.
  TokenLoader(std::shared_ptr<const ShardReader> shard, const LoaderOptions& options);

  Batch next();

  // Moves the cursor past `n` windows without reading them (data parallel: the windows other ranks
  // read, see dist/data_parallel.h).
  void skip(int64_t n);

  LoaderState state() const { return state_; }
  void restore(const LoaderState& state);

  int64_t windows() const { return windows_; }                    // W, all ranks together
  int64_t windows_per_rank() const { return windows_per_rank_; }  // per epoch
  // Start token of the window at `index` of this rank's share of `epoch`.
  int64_t window_start(int64_t epoch, int64_t index) const;
  const LoaderOptions& options() const { return options_; }

 private:
  const std::vector<int64_t>& order(int64_t epoch) const;

  std::shared_ptr<const ShardReader> shard_;
  LoaderOptions options_;
  int64_t windows_ = 0;
  int64_t windows_per_rank_ = 0;
  LoaderState state_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace cemfrac

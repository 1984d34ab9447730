#include "cemfrac/data/loader.h"

#include <torch/types.h>

#include <numeric>
#include <utility>

#include "cemfrac/core/check.h"
#include "cemfrac/core/random.h"

namespace cemfrac {

bool operator==(const LoaderState& a, const LoaderState& b) {
  return a.epoch == b.epoch && a.index == b.index;
}

std::vector<int64_t> window_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  // One stream per (seed, epoch): the epoch is mixed in through a splitmix64 step of its own so
  // that nearby seeds and epochs give unrelated streams.
  const uint64_t stream = seed ^ SplitMix64(static_cast<uint64_t>(epoch)).next();
  const std::vector<size_t> order = seeded_permutation(static_cast<size_t>(n), stream);
  return std::vector<int64_t>(order.begin(), order.end());
}

TokenLoader::TokenLoader(std::shared_ptr<const ShardReader> shard, const LoaderOptions& options)
    : shard_(std::move(shard)), options_(options) {
  TORCH_INTERNAL_ASSERT(shard_);
  CEMFRAC_CHECK(options_.batch_size >= 1, "loader: batch size {} must be at least 1",
                options_.batch_size);
  CEMFRAC_CHECK(options_.seq_len >= 1, "loader: sequence length {} must be at least 1",
                options_.seq_len);
  CEMFRAC_CHECK(
      options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
      "loader: rank {} is not in [0, world size {})", options_.rank, options_.world_size);
  const int64_t tokens = static_cast<int64_t>(shard_->size());
  windows_ = tokens > 0 ? (tokens - 1) / options_.seq_len : 0;
  windows_per_rank_ = windows_ / options_.world_size;
  CEMFRAC_CHECK(
      windows_per_rank_ >= 1,
      "{}: {} tokens make {} windows of {} + 1 tokens, fewer than the {} rank(s) need; use "
      "a shorter seq_len or more data",
      shard_->path(), tokens, windows_, options_.seq_len, options_.world_size);
}

const std::vector<int64_t>& TokenLoader::order(int64_t epoch) const {
  if (order_epoch_ != epoch) {
    if (options_.shuffle) {
      order_ = window_permutation(windows_, options_.seed, epoch);
    } else {
      order_.resize(windows_);
      std::iota(order_.begin(), order_.end(), int64_t{0});
    }
    order_epoch_ = epoch;
  }
  return order_;
}

int64_t TokenLoader::window_start(int64_t epoch, int64_t index) const {
  TORCH_INTERNAL_ASSERT(index >= 0 && index < windows_per_rank_);
  return order(epoch)[index * options_.world_size + options_.rank] * options_.seq_len;
}

void TokenLoader::restore(const LoaderState& state) {
  CEMFRAC_CHECK(
      state.epoch >= 0 && state.index >= 0 && state.index < windows_per_rank_,
      "loader: cannot restore cursor (epoch {}, index {}): this shard and seq_len give {} "
      "windows per epoch and rank; was the checkpoint written for other data?",
      state.epoch, state.index, windows_per_rank_);
  state_ = state;
}

void TokenLoader::skip(int64_t n) {
  TORCH_INTERNAL_ASSERT(n >= 0);
  state_.epoch += n / windows_per_rank_;
  state_.index += n % windows_per_rank_;
  if (state_.index >= windows_per_rank_) {
    state_.index -= windows_per_rank_;
    ++state_.epoch;
  }
}

Batch TokenLoader::next() {
  const int64_t B = options_.batch_size, S = options_.seq_len;
  Batch batch;
  batch.position = state_;
  torch::Tensor window = torch::empty({B, S + 1}, torch::kInt64);
  int64_t* data = window.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    shard_->copy_to(static_cast<uint64_t>(window_start(state_.epoch, state_.index)),
                    static_cast<uint64_t>(S + 1), data + b * (S + 1));
    if (++state_.index == windows_per_rank_) {
      state_.index = 0;
      ++state_.epoch;
    }
  }
  batch.inputs = window.narrow(1, 0, S).contiguous();
  batch.targets = window.narrow(1, 1, S).contiguous();
  return batch;
}

}  // namespace cemfrac

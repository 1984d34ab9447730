#include "cemfrac/layers/kv_cache.h"

#include <c10/core/GradMode.h>
#include <torch/types.h>

#include <algorithm>
#include <vector>

#include "cemfrac/core/check.h"

namespace cemfrac {

int64_t KvCache::capacity() const {
  if (buffer_.defined()) return buffer_.size(time_dim_);
  return whole_.defined() ? whole_.size(time_dim_) : 0;
}

int64_t KvCache::bytes() const {
  const torch::Tensor& held = buffer_.defined() ? buffer_ : whole_;
  return held.defined() ? static_cast<int64_t>(held.nbytes()) : 0;
}

torch::Tensor KvCache::values() const {
  if (length_ == 0) return torch::Tensor();
  return buffer_.defined() ? buffer_.narrow(time_dim_, 0, length_) : whole_;
}

torch::Tensor KvCache::append(const torch::Tensor& chunk, int64_t offset, int64_t capacity,
                              int64_t time_dim, const std::string& who) {
  const int64_t n = chunk.size(time_dim), B = chunk.size(0);
  if (length_ > 0) {
    const int64_t held_batch = values().size(0);
    CEMFRAC_CHECK(
        held_batch == B && length_ == offset,
        "decode state of {} holds batch {} and {} positions, but the input has batch {} at "
        "position {}; use one decode state per sequence batch",
        who, held_batch, length_, B, offset);
    CEMFRAC_CHECK(time_dim == time_dim_, "decode state of {}: appended along dimension {}, not {}",
                  who, time_dim, time_dim_);
  } else {
    time_dim_ = time_dim;
  }
  const int64_t total = length_ + n;
  CEMFRAC_CHECK(
      capacity <= 0 || total <= capacity,
      "decode state of {}: positions {}..{} exceed its capacity of {} positions (the model "
      "context); start a new decode state",
      who, length_, total - 1, capacity);

  // Autograd through the cache: keep the differentiable concatenation.
  if (c10::GradMode::is_enabled() && chunk.requires_grad()) {
    whole_ = length_ == 0 ? chunk : torch::cat({values(), chunk}, time_dim);
    buffer_ = torch::Tensor();
    length_ = total;
    return whole_;
  }

  const int64_t room = buffer_.defined() ? buffer_.size(time_dim) : 0;
  if (total > room) {
    // Allocate (or grow): the capacity when known, else twice what is needed.
    const int64_t want = capacity > 0 ? capacity : std::max<int64_t>(2 * total, 16);
    std::vector<int64_t> shape = chunk.sizes().vec();
    shape[static_cast<size_t>(time_dim)] = want;
    torch::Tensor grown = torch::empty(shape, chunk.options());
    if (length_ > 0) grown.narrow(time_dim, 0, length_).copy_(values());
    buffer_ = grown;
    whole_ = torch::Tensor();
  }
  buffer_.narrow(time_dim, length_, n).copy_(chunk);
  const bool first = length_ == 0;
  length_ = total;
  // The first chunk (a prompt, or a whole sequence) is returned as it is: the same tensor the layer
  // computed, so a full forward through a state runs exactly the stateless code path.
  return first ? chunk : buffer_.narrow(time_dim, 0, length_);
}

}  // namespace cemfrac

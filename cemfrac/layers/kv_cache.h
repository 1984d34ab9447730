// The decode cache every mixer kind keeps in its MixerState: one tensor per cached quantity (keys,
// values, ladder outputs, inputs), grown along its time dimension as positions are decoded. The
// buffer is allocated once for `capacity` positions (the model's context, MixerContext::capacity)
// and each decoded chunk is copied into place, instead of concatenating the whole history per
// token. Without a known capacity (0: a layer driven directly, as in the tests) the buffer doubles
// when full.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace cemfrac {

class KvCache {
 public:
  // Appends `chunk` (positions offset..offset+n-1 along dimension `time_dim`) and returns every
  // position held, 0..offset+n-1, as one tensor (the chunk itself for the first chunk). Refuses,
  // with a cemfrac::Error naming `who`, a chunk whose batch size differs from the cache's, an
  // offset other than the number of positions held, and more positions than a non-zero `capacity`.
  // With autograd recording and a chunk that requires grad, the result is a concatenation (autograd
  // sees the same graph as before); otherwise a view of the preallocated buffer.
  torch::Tensor append(const torch::Tensor& chunk, int64_t offset, int64_t capacity,
                       int64_t time_dim, const std::string& who);

  bool defined() const { return length_ > 0; }
  int64_t size() const { return length_; }  // positions held
  int64_t capacity() const;                 // positions the buffer has room for (0: none yet)
  torch::Tensor values() const;             // positions 0..size()-1 (undefined when empty)
  // Bytes the cache holds: its whole buffer (room for capacity() positions, the model's context
  // once preallocated), not only the positions filled so far; 0 when empty.
  int64_t bytes() const;

 private:
  torch::Tensor buffer_;  // room for capacity() positions along time_dim_
  torch::Tensor whole_;   // when not copied into a buffer: the cached positions themselves
  int64_t time_dim_ = 0;
  int64_t length_ = 0;
};

}  // namespace cemfrac

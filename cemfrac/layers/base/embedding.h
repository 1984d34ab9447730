// A table of vectors looked up by index: the token embedding "wte" (V, D) and the learned position
// embedding "wpe" (N_max, D). Both are in the no-decay group.
#pragma once
#include <torch/types.h>

#include "cemfrac/layers/param_tags.h"

namespace cemfrac {

class EmbeddingImpl : public TaggedModule {
 public:
  EmbeddingImpl(int64_t count, int64_t dim, double init_std, torch::Device device);
  // ids (...) int64 -> (..., dim)
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  // (count, dim) "weight"
};

// The output projection of an untied model, "head.weight" (V, D): logits = z W^T. Decayed.
class OutputHeadImpl : public TaggedModule {
 public:
  OutputHeadImpl(int64_t vocab_size, int64_t d_model, double init_std, torch::Device device);

  torch::Tensor weight;  // (V, D) "weight"
};

}  // namespace cemfrac

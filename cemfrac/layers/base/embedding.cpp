#include "cemfrac/layers/base/embedding.h"

#include <torch/types.h>

namespace cemfrac {

EmbeddingImpl::EmbeddingImpl(int64_t count, int64_t dim, double init_std, torch::Device device) {
  weight = add_parameter("weight", init_normal({count, dim}, init_std, device),
                         ParamKind::kEmbedding, ParamGroup::kNoDecay);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return torch::embedding(weight, ids);
}

OutputHeadImpl::OutputHeadImpl(int64_t vocab_size, int64_t d_model, double init_std,
                               torch::Device device) {
  weight = add_parameter("weight", init_normal({vocab_size, d_model}, init_std, device),
                         ParamKind::kHead, ParamGroup::kDecay);
}

}  // namespace cemfrac

#include "cemfrac/model/block.h"

#include <torch/types.h>

#include "cemfrac/model/layer_factory.h"

namespace cemfrac {

BlockImpl::BlockImpl(const ModelConfig& config, int64_t layer, torch::Device device) {
  norm1_ = register_module("norm1", make_norm(config, device));
  mixer_ = register_module("attn", make_mixer(config, layer, device));
  norm2_ = register_module("norm2", make_norm(config, device));
  ffn_ = register_module("mlp", make_ffn(config, layer, device));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& z, const MixerContext& ctx) {
  torch::Tensor h = z + mixer_->forward(norm1_->forward(z), ctx);  // (B, N, D)
  return h + ffn_->forward(norm2_->forward(h));                    // (B, N, D)
}

}  // namespace cemfrac

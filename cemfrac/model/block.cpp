#include "cemfrac/model/block.h"

#include <ATen/record_function.h>
#include <torch/types.h>

#include "cemfrac/model/layer_factory.h"

namespace cemfrac {

BlockImpl::BlockImpl(const ModelConfig& config, int64_t layer, torch::Device device) {
  norm1_ = register_module("norm1", make_norm(config, device));
  mixer_ = register_module("attn", make_mixer(config, layer, device));
  if (config.has_ffn(layer)) {  // ffn = "none": no norm2, no mlp (and no checkpoint keys)
    norm2_ = register_module("norm2", make_norm(config, device));
    ffn_ = register_module("mlp", make_ffn(config, layer, device));
  }
  // Profiler scopes (bench train --profile): the time a layer spends outside ATen ops (the fused
  // kernels' forward) shows as the scope's own time. Free when no profiler is on.
  mixer_scope_ = "cemfrac::mixer." + config.mixer_of(layer);
  ffn_scope_ = "cemfrac::ffn." + config.ffn_of(layer);
}

torch::Tensor BlockImpl::forward(const torch::Tensor& z, const MixerContext& ctx) {
  torch::Tensor h;
  {
    RECORD_FUNCTION(mixer_scope_, std::vector<c10::IValue>());
    h = z + mixer_->forward(norm1_->forward(z), ctx);  // (B, N, D)
  }
  if (!ffn_) return h;
  RECORD_FUNCTION(ffn_scope_, std::vector<c10::IValue>());
  return h + ffn_->forward(norm2_->forward(h));  // (B, N, D)
}

}  // namespace cemfrac

// One transformer block, pre-norm:  z += mixer(norm1(z));  z += ffn(norm2(z)), the second step
// absent where the layer's ffn is "none". Submodule names (checkpoint key prefixes): norm1, attn
// (the mixer, whatever its kind), norm2, mlp (the FFN, whatever its kind; both absent without one).
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/mixer.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, int64_t layer, torch::Device device);
  // z (B, N, D) -> (B, N, D)
  torch::Tensor forward(const torch::Tensor& z, const MixerContext& ctx);

  MixerImpl& mixer() { return *mixer_; }
  bool has_ffn() const { return ffn_ != nullptr; }
  FfnImpl& ffn() {  // only where has_ffn()
    TORCH_INTERNAL_ASSERT(ffn_, "Block::ffn: this layer has no FFN (ffn = none)");
    return *ffn_;
  }

 private:
  std::shared_ptr<NormImpl> norm1_;
  std::shared_ptr<MixerImpl> mixer_;
  std::shared_ptr<NormImpl> norm2_;
  std::shared_ptr<FfnImpl> ffn_;
  std::string mixer_scope_, ffn_scope_;  // profiler range names
};

}  // namespace cemfrac

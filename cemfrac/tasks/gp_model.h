// The model of the GP task (docs/gp.md): continuous tokens in, one number out per position, built
// from the language model's own blocks (cemfrac/model/block.h, kinds from the registry):
//     z = embed(token)            Linear(3 -> D), token = [t_n, y_n, t_{n+1}]
//     z += mixer(norm1 z); z += ffn(norm2 z)    L times (any mixer / FFN kind of the registry)
//     y_hat = readout(norm_f z)   Linear(D -> 1), the prediction of y_{n+1}
// Causal like the blocks: y_hat at position n depends on tokens 0..n only.
// Parameters (names as in named_parameters()): embed.weight (D, 3), embed.bias (D),
// blocks.<l>.* (as in an LmModel), norm_f.*, readout.weight (1, D), readout.bias (1).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/param_tags.h"
#include "cemfrac/model/block.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

// y = x W^T + b with a tagged weight and bias: the GP model's input embedding and its read-out.
class TaggedLinearImpl : public TaggedModule {
 public:
  TaggedLinearImpl(int64_t in_features, int64_t out_features, double init_std, ParamKind kind,
                   ParamGroup weight_group, torch::Device device);
  // x (..., in) -> (..., out)
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (out, in) "weight", N(0, init_std)
  torch::Tensor bias;    // (out) "bias", 0, no decay
};

class GpModelImpl : public torch::nn::Module {
 public:
  // Uses the shape and kind fields of `config` (d_model, n_layers, n_heads, d_ff, context >= the
  // number of tokens, mixer, ffn, layer_overrides, norm, positions, cem, init_std, bias);
  // vocab_size and tie_embeddings play no part. positions must be "none" or "rope" (learned
  // positions belong to a vocabulary model). Initialised from the default generator, like LmModel.
  explicit GpModelImpl(const ModelConfig& config, torch::Device device = torch::kCPU);

  // tokens (B, N, 3) float -> predictions (B, N) float.
  torch::Tensor forward(const torch::Tensor& tokens);

  const ModelConfig& config() const { return config_; }
  // One entry per tensor, for the optimizer groups and the parameter count.
  std::vector<ParamInfo> parameter_table() const { return tagged_parameter_table(*this); }
  int64_t num_parameters() const;

 private:
  ModelConfig config_;
  std::shared_ptr<TaggedLinearImpl> embed_;         // "embed"
  std::vector<std::shared_ptr<BlockImpl>> blocks_;  // "blocks.<l>"
  std::shared_ptr<NormImpl> norm_f_;                // "norm_f"
  std::shared_ptr<TaggedLinearImpl> readout_;       // "readout"
  std::unique_ptr<RotaryEmbedding> rope_;           // positions = rope
};
TORCH_MODULE(GpModel);

// The same model with another CEM step count T (test-time scaling): a new model whose parameters
// are copies of `model`'s (cem.steps changes no shape).
GpModel gp_model_with_steps(GpModel& model, int64_t steps);

}  // namespace cemfrac

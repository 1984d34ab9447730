#include "cemfrac/tasks/gp_model.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "cemfrac/core/check.h"
#include "cemfrac/model/layer_factory.h"

namespace cemfrac {

TaggedLinearImpl::TaggedLinearImpl(int64_t in_features, int64_t out_features, double init_std,
                                   ParamKind kind, ParamGroup weight_group, torch::Device device) {
  weight = add_parameter("weight", init_normal({out_features, in_features}, init_std, device), kind,
                         weight_group);
  bias =
      add_parameter("bias", init_constant({out_features}, 0.0, device), kind, ParamGroup::kNoDecay);
}

torch::Tensor TaggedLinearImpl::forward(const torch::Tensor& x) {
  return torch::linear(x, weight, bias);
}

GpModelImpl::GpModelImpl(const ModelConfig& config, torch::Device device) : config_(config) {
  config_.validate();
  const ModelConfig& c = config_;
  CEMFRAC_CHECK(
      c.positions != Positions::kLearned,
      "positions = \"{}\": the GP model takes none or rope (its tokens carry the inputs t)",
      enum_name(c.positions));
  // Inputs t in [-1, 1] and y of unit scale: the embedding starts at the model's init_std like a
  // token embedding; its rows are decayed like any projection (it is not a lookup table).
  embed_ = register_module(
      "embed", std::make_shared<TaggedLinearImpl>(3, c.d_model, c.init_std, ParamKind::kEmbedding,
                                                  ParamGroup::kDecay, device));
  // The blocks of an LmModel with this config, under the same names.
  auto blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    blocks_.push_back(std::make_shared<BlockImpl>(c, layer, device));
    blocks->push_back(blocks_.back());
  }
  norm_f_ = register_module("norm_f", make_norm(c, device));
  readout_ = register_module(
      "readout", std::make_shared<TaggedLinearImpl>(c.d_model, 1, c.init_std, ParamKind::kHead,
                                                    ParamGroup::kDecay, device));
  if (c.positions == Positions::kRope) {
    rope_ =
        std::make_unique<RotaryEmbedding>(c.head_dim(), c.context, c.rope_theta, c.rope_scaling);
  }
}

torch::Tensor GpModelImpl::forward(const torch::Tensor& tokens) {
  CEMFRAC_CHECK(tokens.dim() == 3 && tokens.size(2) == 3 && tokens.is_floating_point(),
                "GP model input must be float tokens of shape (batch, length, 3), got {} dims",
                tokens.dim());
  const int64_t N = tokens.size(1);
  CEMFRAC_CHECK(N >= 1 && N <= config_.context,
                "GP sequence of {} tokens: must be 1..{} (the model's context)", N,
                config_.context);
  // 1. Embed the continuous tokens.
  torch::Tensor z = embed_->forward(tokens);  // (B, N, D)
  // 2. The blocks, with RoPE tables computed once when positions = rope.
  MixerContext ctx;
  if (rope_) std::tie(ctx.rope_cos, ctx.rope_sin) = rope_->tables(0, N, z.options());
  for (const auto& block : blocks_) z = block->forward(z, ctx);  // (B, N, D)
  // 3. Final norm and the scalar read-out.
  return readout_->forward(norm_f_->forward(z)).squeeze(-1);  // (B, N)
}

int64_t GpModelImpl::num_parameters() const {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters()) total += p.numel();
  return total;
}

GpModel gp_model_with_steps(GpModel& model, int64_t steps) {
  ModelConfig c = model->config();
  c.cem.steps = steps;
  const torch::Device device = model->parameters().front().device();
  GpModel other(c, device);
  torch::NoGradGuard no_grad;
  const auto source = model->named_parameters();
  for (auto& item : other->named_parameters()) item.value().copy_(source[item.key()]);
  for (auto& item : other->named_buffers()) {
    const torch::Tensor* b = model->named_buffers().find(item.key());
    TORCH_INTERNAL_ASSERT(b != nullptr, "buffer ", item.key(), " missing in the source model");
    item.value().copy_(*b);
  }
  return other;
}

}  // namespace cemfrac

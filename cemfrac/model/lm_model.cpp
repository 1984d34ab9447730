#include "cemfrac/model/lm_model.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>

#include "cemfrac/core/check.h"
#include "cemfrac/model/layer_factory.h"
#include "cemfrac/ops/linear.h"

namespace cemfrac {

LmModelImpl::LmModelImpl(const ModelConfig& config, torch::Device device) : config_(config) {
  config_.validate();
  const ModelConfig& c = config_;
  wte_ = register_module(
      "wte", std::make_shared<EmbeddingImpl>(c.vocab_size, c.d_model, c.init_std, device));
  if (c.positions == Positions::kLearned) {
    wpe_ = register_module(
        "wpe", std::make_shared<EmbeddingImpl>(c.context, c.d_model, c.init_std, device));
  }
  auto blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    blocks_.push_back(std::make_shared<BlockImpl>(c, layer, device));
    blocks->push_back(blocks_.back());  // registered as "blocks.<layer>"
  }
  norm_f_ = register_module("norm_f", make_norm(c, device));
  // Tied: the head multiplies by wte's own tensor (head_weight()); no second parameter exists.
  if (!c.tie_embeddings) {
    head_ = register_module(
        "head", std::make_shared<OutputHeadImpl>(c.vocab_size, c.d_model, c.init_std, device));
  }
  if (c.positions == Positions::kRope) {
    rope_ =
        std::make_unique<RotaryEmbedding>(c.head_dim(), c.context, c.rope_theta, c.rope_scaling);
  }
}

const torch::Tensor& LmModelImpl::head_weight() const {
  return head_ ? head_->weight : wte_->weight;
}

void LmModelImpl::set_observer(LayerObserver observer) {
  observer_ = std::move(observer);
  layer_observers_.clear();
  if (observer_) {
    layer_observers_.reserve(2 * blocks_.size());  // stable addresses: the FFNs keep pointers
    for (size_t l = 0; l < blocks_.size(); ++l) {
      for (const char* sub : {"attn", "mlp"}) {
        const std::string prefix = "blocks." + std::to_string(l) + "." + sub + ".";
        layer_observers_.push_back(
            [this, prefix](const std::string& name, const torch::Tensor& value) {
              observer_(prefix + name, value);
            });
      }
    }
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (blocks_[l]->has_ffn())
      blocks_[l]->ffn().set_observer(observer_ ? &layer_observers_[2 * l + 1] : nullptr);
  }
}

DecodeState LmModelImpl::new_decode_state() const {
  DecodeState state;
  for (const auto& block : blocks_) state.layers.push_back(block->mixer().new_state());
  return state;
}

torch::Tensor LmModelImpl::forward(const torch::Tensor& tokens, DecodeState* state) {
  CEMFRAC_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64,
                "model input must be int64 token ids of shape (batch, length), got {} of {} dims",
                std::string(c10::toString(tokens.scalar_type())), tokens.dim());
  // Ids on another device would be read through the wrong pointer (meta ids on a CPU model gave
  // finite, made-up logits): the caller moves them.
  CEMFRAC_CHECK(tokens.device() == wte_->weight.device(),
                "model input is on {} but the model is on {}; move the token ids there (e.g. "
                "tokens.to(\"{}\"))",
                tokens.device().str(), wte_->weight.device().str(), wte_->weight.device().str());
  const int64_t N = tokens.size(1);
  const int64_t offset = state ? state->position : 0;
  CEMFRAC_CHECK(N >= 1, "model input is empty (length 0); pass at least one token");
  CEMFRAC_CHECK(
      offset + N <= config_.context,
      "sequence too long: positions {}..{} exceed the model context of {} tokens; shorten "
      "the input (or the generation) to at most {} tokens",
      offset, offset + N - 1, config_.context, config_.context);
  if (state) {
    TORCH_INTERNAL_ASSERT(state->layers.size() == blocks_.size(),
                          "decode state made for another model (", state->layers.size(),
                          " layers)");
  }

  // 1. Embed tokens (and add learned positions).
  torch::Tensor z = wte_->forward(tokens);  // (B, N, D)
  if (wpe_) z = z + wpe_->weight.narrow(0, offset, N);

  // 2. The blocks; RoPE tables for these positions are computed once for all layers.
  MixerContext ctx;
  ctx.offset = offset;
  ctx.capacity = config_.context;
  if (rope_) std::tie(ctx.rope_cos, ctx.rope_sin) = rope_->tables(offset, N, z.options());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    ctx.state = state ? state->layers[l].get() : nullptr;
    ctx.observer = observer_ ? &layer_observers_[2 * l] : nullptr;
    z = blocks_[l]->forward(z, ctx);  // (B, N, D)
  }

  // 3. Final norm and the head.
  z = norm_f_->forward(z);                                   // (B, N, D)
  torch::Tensor logits = cemfrac::linear(z, head_weight());  // (B, N, V)
  if (state) state->position += N;
  return logits;
}

std::vector<ParamInfo> LmModelImpl::parameter_table() const {
  std::vector<ParamInfo> table = tagged_parameter_table(*this);
  for (ParamInfo& info : table) {
    if (config_.tie_embeddings && info.name == "wte.weight") info.tied_to = "head.weight";
  }
  return table;
}

int64_t LmModelImpl::num_parameters() const {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters()) total += p.numel();
  return total;
}

}  // namespace cemfrac

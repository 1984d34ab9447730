// Decoder-only language model: token embedding (+ learned positions for GPT-2), L blocks, final
// norm, head (tied to the embedding or not). A block is
//     z += mixer(norm1(z));  z += ffn(norm2(z))
// with mixer and FFN chosen independently by name (ModelConfig::mixer_of / ffn_of).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cemfrac/layers/base/embedding.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/mixer.h"
#include "cemfrac/layers/param_tags.h"
#include "cemfrac/model/block.h"
#include "cemfrac/model/model_config.h"

namespace cemfrac {

// ParamKind, ParamGroup, ParamInfo, to_string: cemfrac/layers/param_tags.h. MixerState:
// cemfrac/layers/mixer.h (layers declare them; the model re-exports them through this header).

struct DecodeState {
  int64_t position = 0;  // tokens already consumed
  std::vector<std::unique_ptr<MixerState>> layers;
};

class LmModelImpl : public torch::nn::Module {
 public:
  // Validates the config. Parameters are created on `device` and initialised from the default
  // generator (deterministic given torch::manual_seed): N(0, init_std) for matrices and embeddings,
  // residual output projections N(0, init_std / sqrt(2L)), norm weights 1, biases 0. On
  // torch::kMeta nothing is allocated: a shape-only model for parameter_table() of big presets (no
  // forward).
  explicit LmModelImpl(const ModelConfig& config, torch::Device device = torch::kCPU);

  // tokens (B, N) int64 -> logits (B, N, V) float. With a state, tokens continue the sequence the
  // state holds (positions start at state->position) and the state is extended; logits equal those
  // of a full forward over the whole sequence.
  torch::Tensor forward(const torch::Tensor& tokens, DecodeState* state = nullptr);

  DecodeState new_decode_state() const;

  // Attaches (or, with an empty function, detaches) an observer that receives every value a mixer
  // or FFN reports (cemfrac/layers/mixer.h, LayerObserver), named "<module>.<name>" with the
  // module's checkpoint prefix, e.g. "blocks.0.attn.energy.1". Layers may do extra work while
  // observed.
  void set_observer(LayerObserver observer);

  const ModelConfig& config() const { return config_; }

  // One entry per distinct tensor (tied tensors appear once), in registration order; the sum of
  // numel equals the model's parameter count. With tie_embeddings the head has no entry of its own:
  // "wte.weight" is the only tensor and its entry says tied_to = "head.weight".
  std::vector<ParamInfo> parameter_table() const;
  // Sum of numel over parameters() (each tensor once).
  int64_t num_parameters() const;

  // The matrix the head multiplies by: "head.weight", or "wte.weight" itself when tied. (V, D)
  const torch::Tensor& head_weight() const;
  EmbeddingImpl& wte() { return *wte_; }
  BlockImpl& block(int64_t layer) { return *blocks_.at(layer); }

 private:
  ModelConfig config_;
  std::shared_ptr<EmbeddingImpl> wte_;              // "wte": token embedding (V, D)
  std::shared_ptr<EmbeddingImpl> wpe_;              // "wpe": learned positions (N_max, D), or null
  std::vector<std::shared_ptr<BlockImpl>> blocks_;  // "blocks.<l>"
  std::shared_ptr<NormImpl> norm_f_;                // "norm_f": final norm
  std::shared_ptr<OutputHeadImpl> head_;            // "head": (V, D), null when tied
  std::unique_ptr<RotaryEmbedding> rope_;           // positions = rope
  LayerObserver observer_;                          // set_observer; empty = none
  std::vector<LayerObserver> layer_observers_;  // [2 l]: blocks.<l>.attn, [2 l + 1]: blocks.<l>.mlp
};
TORCH_MODULE(LmModel);

}  // namespace cemfrac

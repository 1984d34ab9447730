// The abstract token mixer and FFN that a block holds. Every kind (mha; later cem_attention, cattn_u,
// cattn_m, synthesizer_dense, sparse_attention / cem_mlp, cffn) derives from one of these; the
// registry (registry.h) builds them by name.
#pragma once
#include <torch/types.h>

#include <memory>

#include "cemfrac/layers/param_tags.h"

namespace cemfrac {

// Per-layer state for incremental decoding. Each mixer kind defines what it keeps (MHA: K and V).
struct MixerState {
  virtual ~MixerState() = default;
};

// What a mixer needs besides its input: where the input sits in the sequence, the rotary tables for
// those positions (shared by all layers, computed once per forward) and the layer's decode state.
struct MixerContext {
  int64_t offset = 0;          // absolute position of x[:, 0]
  torch::Tensor rope_cos;      // (N, d_h / 2) for positions offset..offset+N-1; undefined without RoPE
  torch::Tensor rope_sin;      // (N, d_h / 2)
  MixerState* state = nullptr; // this layer's decode state, extended by forward; null = no caching
};

class MixerImpl : public TaggedModule {
 public:
  // x (B, N, D), already normalised -> (B, N, D). Causal: output n sees inputs at positions <= n
  // (and, with a state, everything the state holds).
  virtual torch::Tensor forward(const torch::Tensor& x, const MixerContext& ctx) = 0;
  // An empty decode state for this layer.
  virtual std::unique_ptr<MixerState> new_state() const = 0;
  // Model FLOPs of forward per token when every token sees `context` positions (docs/flops.md: the
  // PaLM convention, a causal mask not discounted; 2 per multiply-add of a matrix product or of a
  // weight applied to an activation; element-wise nonlinearities, softmax, masks, biases, scalars
  // and the continued-fraction recurrences not counted). Backward is counted as twice this.
  virtual double forward_flops_per_token(int64_t context) const = 0;
};

class FfnImpl : public TaggedModule {
 public:
  // x (B, N, D) -> (B, N, D), position-wise.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Model FLOPs of forward per token (the same convention as MixerImpl's).
  virtual double forward_flops_per_token() const = 0;
};

class NormImpl : public TaggedModule {
 public:
  // x (B, N, D) -> (B, N, D), over the last dimension.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

}  // namespace cemfrac

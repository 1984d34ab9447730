// The abstract token mixer and FFN that a block holds. Every kind (mha; later cem_attention,
// cattn_u, cattn_m, synthesizer_dense, sparse_attention / cem_mlp, cffn) derives from one of these;
// the registry (registry.h) builds them by name.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>

#include "cemfrac/layers/param_tags.h"

namespace cemfrac {

// Per-layer state for incremental decoding. Each mixer kind defines what it keeps (MHA: K and V).
struct MixerState {
  virtual ~MixerState() = default;
  // Bytes of every cache the state holds (the sum of its KvCache::bytes()). Pure virtual so that a
  // new kind cannot report 0 by omission: `cemfrac bench generate` quotes it per kind.
  virtual int64_t cache_bytes() const = 0;
};

// Named values a layer reports while it runs, for diagnostics (cemfrac eval --cem-energy), in the
// spirit of llama.cpp's per-tensor evaluation callback: (name, value), the names chosen by the kind
// and documented with it (cem_attention, cem_mlp: "energy.<t>"). A layer may compute a reported
// value only when somebody listens, so an observer can cost time; none is attached by default.
using LayerObserver = std::function<void(const std::string& name, const torch::Tensor& value)>;

// What a mixer needs besides its input: where the input sits in the sequence, the rotary tables for
// those positions (shared by all layers, computed once per forward) and the layer's decode state.
struct MixerContext {
  int64_t offset = 0;      // absolute position of x[:, 0]
  torch::Tensor rope_cos;  // (N, d_h / 2) for positions offset..offset+N-1; undefined without RoPE
  torch::Tensor rope_sin;  // (N, d_h / 2)
  MixerState* state = nullptr;  // this layer's decode state, extended by forward; null = no caching
  int64_t capacity = 0;  // positions a decode state may hold (the model's context); 0 = unknown
  const LayerObserver* observer = nullptr;  // receives the values this layer reports; null = none
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
  // Where this FFN reports named values (an FFN gets no context); null = none. Set by the model.
  void set_observer(const LayerObserver* observer) { observer_ = observer; }

 protected:
  const LayerObserver* observer_ = nullptr;
};

class NormImpl : public TaggedModule {
 public:
  // x (B, N, D) -> (B, N, D), over the last dimension.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

}  // namespace cemfrac

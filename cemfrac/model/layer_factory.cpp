// Plain switches over the kinds, like the name tables in layers/registry.cpp: grep-able,
// independent of link order, and the compiler warns about a kind without a case.
#include "cemfrac/model/layer_factory.h"

#include <cmath>

#include "cemfrac/layers/base/gelu_mlp.h"
#include "cemfrac/layers/base/layer_norm.h"
#include "cemfrac/layers/base/mha.h"
#include "cemfrac/layers/base/rms_norm.h"
#include "cemfrac/layers/base/swiglu.h"
#include "cemfrac/layers/cem/cem_attention.h"
#include "cemfrac/layers/cem/cem_mlp.h"
#include "cemfrac/layers/cofrgenet/cattn_m.h"
#include "cemfrac/layers/cofrgenet/cattn_u.h"
#include "cemfrac/layers/cofrgenet/cffn.h"
#include "cemfrac/layers/cofrgenet/ladder_common.h"
#include "cemfrac/layers/cofrgenet/sparse_attention.h"
#include "cemfrac/layers/cofrgenet/synthesizer_dense.h"
#include "cemfrac/layers/registry.h"

namespace cemfrac {

namespace {

// GPT-2: the projections that write into the residual stream start 1/sqrt(2L) smaller, so the
// stream's variance does not grow with depth.
double residual_init_std(const ModelConfig& c) {
  return c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
}

// model.cem -> the step options both CEM sub-layers share.
CemStepOptions cem_step_options(const ModelConfig& c) {
  return CemStepOptions()
      .steps(c.cem.steps)
      .learn_eta(c.cem.learn_eta())
      .eta_init(c.cem.eta_init)
      .precond(c.cem.precond)
      .precond_rank(c.cem.precond_rank)
      .precond_psd(c.cem.precond_psd)
      .prox(c.cem.prox)
      .step_norm(c.cem.step_norm == CemStepNorm::kRms);
}

}  // namespace

std::shared_ptr<MixerImpl> make_mixer(const ModelConfig& c, int64_t layer, torch::Device device) {
  switch (parse_mixer_kind(c.mixer_of(layer))) {
    case MixerKind::kMha:
      return std::make_shared<MhaImpl>(MhaOptions(c.d_model, c.n_heads)
                                           .n_kv_heads(c.kv_heads())
                                           .bias(c.bias)
                                           .rope(c.positions == Positions::kRope)
                                           .init_std(c.init_std)
                                           .out_init_std(residual_init_std(c))
                                           .device(device));
    case MixerKind::kCemAttention:
      return std::make_shared<CemAttentionImpl>(CemAttentionOptions(c.d_model, c.n_heads)
                                                    .rope(c.positions == Positions::kRope)
                                                    .rope_mode(c.cem.rope_mode)
                                                    .dlr(c.cem.dlr)
                                                    .dlr_distance(c.cem.dlr_distance)
                                                    .recursion(c.cem.recursion)
                                                    .recursion_keys(c.cem.recursion_keys)
                                                    .attention(c.cem.attention)
                                                    .step(cem_step_options(c))
                                                    .init_std(c.init_std)
                                                    .device(device));
    case MixerKind::kCAttnU:
      return std::make_shared<CAttnUImpl>(
          CAttnUOptions(c.d_model, c.cofrgenet.length_for(c.context), c.cofrgenet.u_depth)
              .bias(c.cofrgenet.u_bias)
              .ladder(ladder_options(c.cofrgenet))
              .device(device));
    case MixerKind::kCAttnM:
      return std::make_shared<CAttnMImpl>(CAttnMOptions(c.d_model,
                                                        c.cofrgenet.length_for(c.context),
                                                        c.cofrgenet.m_ladders, c.cofrgenet.m_depth)
                                              .heads(c.cofrgenet.m_heads)
                                              .bias(c.cofrgenet.ladder_bias)
                                              .out_proj(c.cofrgenet.m_out_proj)
                                              .ladder(ladder_options(c.cofrgenet))
                                              .init_std(c.init_std)
                                              .out_init_std(residual_init_std(c))
                                              .device(device));
    case MixerKind::kSynthesizerDense:
      return std::make_shared<SynthesizerDenseImpl>(
          SynthesizerDenseOptions(c.d_model, c.cofrgenet.length_for(c.context), c.n_heads)
              .hidden(c.cofrgenet.synth_hidden)
              .bias(c.bias)
              .init_std(c.init_std)
              .out_init_std(residual_init_std(c))
              .device(device));
    case MixerKind::kSparseAttention:
      return std::make_shared<SparseAttentionImpl>(
          SparseAttentionOptions(c.d_model, c.n_heads, c.context)
              .pattern(c.cofrgenet.sparse_pattern)
              .block(c.cofrgenet.sparse_block_for(c.context))
              .summary(c.cofrgenet.sparse_summary)
              .bias(c.bias)
              .rope(c.positions == Positions::kRope)
              .init_std(c.init_std)
              .out_init_std(residual_init_std(c))
              .device(device));
    case MixerKind::kSentinel: break;
  }
  TORCH_INTERNAL_ASSERT(false, "make_mixer: unhandled kind");
}

std::shared_ptr<FfnImpl> make_ffn(const ModelConfig& c, int64_t layer, torch::Device device) {
  const FfnOptions options = FfnOptions(c.d_model, c.d_ff)
                                 .bias(c.bias)
                                 .init_std(c.init_std)
                                 .out_init_std(residual_init_std(c))
                                 .device(device);
  switch (parse_ffn_kind(c.ffn_of(layer))) {
    case FfnKind::kGeluMlp: return std::make_shared<GeluMlpImpl>(options);
    case FfnKind::kSwiGlu: return std::make_shared<SwiGluImpl>(options);
    case FfnKind::kCemMlp:
      return std::make_shared<CemMlpImpl>(CemMlpOptions(c.d_model, c.d_ff)
                                              .form_b(c.cem.mlp_form == CemMlpForm::kB)
                                              .step(cem_step_options(c))
                                              .init_std(c.init_std)
                                              .device(device));
    case FfnKind::kCffn:
      return std::make_shared<CffnImpl>(
          CffnOptions(c.d_model, c.cofrgenet.ladders, c.cofrgenet.depth)
              .bias(c.cofrgenet.ladder_bias)
              .gate(c.cofrgenet.gate)
              .glu(c.cofrgenet.glu)
              .direct_raw(c.cofrgenet.direct_raw)
              .univariate(c.cofrgenet.univariate)
              .ladder(ladder_options(c.cofrgenet))
              .init_std(c.init_std)
              .out_init_std(residual_init_std(c))
              .device(device));
    case FfnKind::kSentinel: break;
  }
  TORCH_INTERNAL_ASSERT(false, "make_ffn: unhandled kind");
}

std::shared_ptr<NormImpl> make_norm(const ModelConfig& c, torch::Device device) {
  switch (c.norm) {
    case NormKind::kLayerNorm:
      return std::make_shared<LayerNormImpl>(c.d_model, c.norm_eps, c.bias, device);
    case NormKind::kRmsNorm: return std::make_shared<RmsNormImpl>(c.d_model, c.norm_eps, device);
  }
  TORCH_INTERNAL_ASSERT(false, "make_norm: unhandled kind");
}

}  // namespace cemfrac

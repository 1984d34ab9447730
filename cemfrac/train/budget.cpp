// FLOPs and memory of a training step (see budget.h).
#include "cemfrac/train/budget.h"

#include <fmt/format.h>

namespace cemfrac {

Flops model_flops(LmModelImpl& model, int64_t B, int64_t S) {
  const ModelConfig& c = model.config();
  Flops f;
  for (const ParamInfo& p : model.parameter_table()) {
    if (p.shape.size() == 2 && p.kind != ParamKind::kEmbedding) f.matmul_params += p.numel;
  }
  if (c.tie_embeddings) f.matmul_params += c.vocab_size * c.d_model;  // the head multiplies by wte
  for (int64_t l = 0; l < c.n_layers; ++l) {
    f.mixers += model.block(l).mixer().forward_flops_per_token(S);
    if (model.block(l).has_ffn()) f.ffns += model.block(l).ffn().forward_flops_per_token();
  }
  f.head = 2.0 * double(c.vocab_size) * double(c.d_model);
  f.per_token = 3.0 * (f.mixers + f.ffns + f.head);
  f.per_step = double(B) * S * f.per_token;
  f.formula = fmt::format(
      "B*S*3*(mixers + FFNs + head 2*V*D) = {}*{}*3*({:.4e} + {:.4e} + {:.4e}) = {:.4e}", B, S,
      f.mixers, f.ffns, f.head, f.per_step);
  return f;
}

double training_memory_lower_bound(const RunConfig& config) {
  const ModelConfig& m = config.model;
  const double V = static_cast<double>(m.vocab_size), D = static_cast<double>(m.d_model),
               L = static_cast<double>(m.n_layers), M = static_cast<double>(m.d_ff);
  double ffn_layers = 0;  // ffn = "none" has no FFN weights
  for (int64_t l = 0; l < m.n_layers; ++l) ffn_layers += m.has_ffn(l) ? 1 : 0;
  const double S = static_cast<double>(config.train.seq_len > 0 ? config.train.seq_len : m.context);
  const double B = static_cast<double>(config.train.micro_batch);
  const double params = V * D + L * 2 * D * D + ffn_layers * 2 * D * M;
  const double activations = 2 * B * S * V + L * 4 * B * S * D;
  return 16 * params + 4 * activations;
}

}  // namespace cemfrac

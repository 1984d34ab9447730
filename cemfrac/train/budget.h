// What a training step costs, from the model itself: FLOPs per step (forward + backward, for MFU in
// `bench train`; docs/flops.md) and a lower bound of the memory training a config needs (`train`
// refuses a config that cannot fit before allocating).
#pragma once
#include <cstdint>
#include <string>

#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/run_config.h"

namespace cemfrac {

// docs/flops.md: each mixer and FFN states its forward FLOPs per token; the head is 2 V D; a
// training step is 3x the forward (backward = 2x forward).
struct Flops {
  int64_t matmul_params = 0;  // P_mm: every 2-D parameter but the embeddings, plus the head's V x D
  double mixers = 0;          // sum of the mixers' forward FLOPs per token at context S
  double ffns = 0;            // sum of the FFNs' forward FLOPs per token
  double head = 0;            // 2 V D
  double per_token = 0;       // 3 (mixers + ffns + head): forward + backward
  double per_step = 0;        // B S per_token
  std::string formula;        // with the numbers
};
Flops model_flops(LmModelImpl& model, int64_t B, int64_t S);

// A lower bound of the memory training `config` needs, in bytes (float32): 16 bytes per parameter
// (weights, gradients, two AdamW moments) for the embedding and, per layer, two D x D attention
// matrices and two D x d_ff FFN matrices; plus the logits of one micro-batch and their gradient
// (2 x micro_batch x seq_len x V floats) and four activations of micro_batch x seq_len x D floats
// per layer. Every architecture has at least these, so a config refused by it cannot fit. Doubles:
// absurd sizes must not overflow.
double training_memory_lower_bound(const RunConfig& config);

}  // namespace cemfrac

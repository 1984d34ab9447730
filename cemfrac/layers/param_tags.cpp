#include "cemfrac/layers/param_tags.h"

#include <torch/torch.h>

namespace cemfrac {

const char* to_string(ParamKind kind) {
  switch (kind) {
    case ParamKind::kEmbedding: return "embedding";
    case ParamKind::kAttention: return "attention";
    case ParamKind::kFfn: return "ffn";
    case ParamKind::kNorm: return "norm";
    case ParamKind::kHead: return "head";
  }
  return "?";
}

const char* to_string(ParamGroup group) {
  switch (group) {
    case ParamGroup::kDecay: return "decay";
    case ParamGroup::kNoDecay: return "no_decay";
    case ParamGroup::kFrozen: return "frozen";
  }
  return "?";
}

torch::Tensor init_normal(torch::IntArrayRef shape, double std, torch::Device device) {
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  if (!t.is_meta()) {
    torch::NoGradGuard no_grad;
    t.normal_(0.0, std);
  }
  return t;
}

torch::Tensor init_constant(torch::IntArrayRef shape, double value, torch::Device device) {
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  if (!t.is_meta()) {
    torch::NoGradGuard no_grad;
    t.fill_(value);
  }
  return t;
}

}  // namespace cemfrac

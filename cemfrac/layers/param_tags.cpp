#include "cemfrac/layers/param_tags.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>

#include "cemfrac/core/meta_kernels.h"

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

std::vector<std::pair<std::string, torch::Tensor>> state_buffers(const torch::nn::Module& root) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    auto* tagged = dynamic_cast<const TaggedModule*>(item.value().get());
    if (tagged == nullptr) continue;
    const auto buffers = tagged->named_buffers(/*recurse=*/false);
    for (const std::string& local : tagged->state_buffer_names()) {
      const torch::Tensor* t = buffers.find(local);
      TORCH_INTERNAL_ASSERT(t != nullptr, "state buffer ", local, " is not registered");
      out.emplace_back(item.key().empty() ? local : item.key() + "." + local, *t);
    }
  }
  return out;
}

void notify_train_step(torch::nn::Module& root, const TrainProgress& progress) {
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* tagged = dynamic_cast<TaggedModule*>(module.get())) tagged->on_train_step(progress);
  }
}

std::vector<ParamInfo> tagged_parameter_table(const torch::nn::Module& root) {
  // Tags are declared by the module that owns each tensor; key them by the full name.
  std::map<std::string, ParamTag> tags;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    auto* tagged = dynamic_cast<const TaggedModule*>(item.value().get());
    if (tagged == nullptr) continue;
    for (const auto& [local, tag] : tagged->param_tags()) {
      tags.emplace(item.key().empty() ? local : item.key() + "." + local, tag);
    }
  }
  std::vector<ParamInfo> table;
  for (const auto& item : root.named_parameters()) {
    auto tag = tags.find(item.key());
    TORCH_INTERNAL_ASSERT(tag != tags.end(), "parameter ", item.key(),
                          " was registered without a kind/group (use TaggedModule::add_parameter)");
    ParamInfo info;
    info.name = item.key();
    info.shape = item.value().sizes().vec();
    info.numel = item.value().numel();
    info.kind = tag->second.kind;
    info.group = tag->second.group;
    info.depth = tag->second.depth;
    table.push_back(std::move(info));
  }
  return table;
}

torch::Tensor init_normal(torch::IntArrayRef shape, double std, torch::Device device) {
  if (device.is_meta()) {
    ensure_meta_kernels();  // a meta model must run forward and backward
    return torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  }
  // Drawn from the CPU generator whatever the device, then moved: a seed gives the same weights on
  // every device (CUDA's generator would draw other numbers), so a GPU run starts where the CPU run
  // does.
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32));
  {
    torch::NoGradGuard no_grad;
    t.normal_(0.0, std);
  }
  return device.is_cpu() ? t : t.to(device);
}

torch::Tensor init_constant(torch::IntArrayRef shape, double value, torch::Device device) {
  if (device.is_meta()) ensure_meta_kernels();  // a meta model must run forward and backward
  torch::Tensor t =
      torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  if (!t.is_meta()) {
    torch::NoGradGuard no_grad;
    t.fill_(value);
  }
  return t;
}

}  // namespace cemfrac

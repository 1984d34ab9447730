#include "cemfrac/train/optimizer.h"

#include <c10/util/C++17.h>  // c10::guts::to_string: the key of torch::optim's per-parameter state
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

constexpr int kDecayGroup = 0;
constexpr int kNoDecayGroup = 1;

// torch::optim keys its state by the parameter's TensorImpl address (optimizer.h); we translate
// to and from parameter names here and nowhere else.
std::string state_key(const torch::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

std::string shape_string(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The names saved in optimizer.safetensors' metadata (kept here, not through lm_model's to_string, so
// the saved format cannot change when display names do).
const char* group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::kDecay: return "decay";
    case ParamGroup::kNoDecay: return "no_decay";
    case ParamGroup::kFrozen: return "frozen";
  }
  return "?";
}

}  // namespace

std::map<std::string, torch::Tensor> parameters_by_name(const torch::nn::Module& module,
                                                        const std::vector<ParamInfo>& params) {
  const auto named = module.named_parameters(/*recurse=*/true);
  std::map<std::string, torch::Tensor> out;
  for (const ParamInfo& info : params) {
    const torch::Tensor* t = named.find(info.name);
    CEMFRAC_CHECK(t != nullptr, "parameter table names '{}' but the module has no such parameter",
                  info.name);
    out.emplace(info.name, *t);
  }
  return out;
}

Optimizer::Optimizer(const torch::nn::Module& module, const std::vector<ParamInfo>& params,
                     const AdamWConfig& config)
    : lr_(config.lr) {
  params_ = parameters_by_name(module, params);
  std::vector<torch::Tensor> decay, no_decay;
  std::set<const c10::TensorImpl*> seen;
  for (const ParamInfo& info : params) {
    const torch::Tensor& p = params_.at(info.name);
    // Tied tensors appear once in the table; guard anyway, AdamW must not see a tensor twice.
    TORCH_INTERNAL_ASSERT(seen.insert(p.unsafeGetTensorImpl()).second,
                          "parameter table lists one tensor twice: ", info.name);
    names_.push_back(info.name);
    groups_[info.name] = info.group;
    switch (info.group) {
      case ParamGroup::kDecay: decay.push_back(p); break;
      case ParamGroup::kNoDecay: no_decay.push_back(p); break;
      case ParamGroup::kFrozen: p.set_requires_grad(false); break;
    }
  }
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(config.lr)
            .betas(std::make_tuple(config.beta1, config.beta2))
            .eps(config.eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(config.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  adamw_ = std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                 torch::optim::AdamWOptions(config.lr));
}

int Optimizer::group_index(ParamGroup group) const {
  TORCH_INTERNAL_ASSERT(group != ParamGroup::kFrozen);
  return group == ParamGroup::kDecay ? kDecayGroup : kNoDecayGroup;
}

void Optimizer::set_lr(double lr) {
  lr_ = lr;
  for (auto& group : adamw_->param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

void Optimizer::zero_grad() {
  // Gradients become undefined (set_to_none): the next backward assigns instead of adding to zero,
  // which gives the same bits and skips a pass over memory.
  for (const auto& [name, p] : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

void Optimizer::step() { adamw_->step(); }

void Optimizer::unfreeze(const std::string& name, ParamGroup group) {
  auto it = groups_.find(name);
  CEMFRAC_CHECK(it != groups_.end(), "unfreeze: no parameter named '{}'", name);
  CEMFRAC_CHECK(it->second == ParamGroup::kFrozen, "unfreeze: parameter '{}' is not frozen", name);
  CEMFRAC_CHECK(group != ParamGroup::kFrozen, "unfreeze: '{}' must join the decay or no-decay group",
                name);
  torch::Tensor& p = params_.at(name);
  p.set_requires_grad(true);
  adamw_->param_groups()[group_index(group)].params().push_back(p);
  it->second = group;
}

bool Optimizer::is_frozen(const std::string& name) const {
  auto it = groups_.find(name);
  return it != groups_.end() && it->second == ParamGroup::kFrozen;
}

std::vector<std::string> Optimizer::frozen() const {
  std::vector<std::string> out;
  for (const std::string& name : names_)
    if (groups_.at(name) == ParamGroup::kFrozen) out.push_back(name);
  return out;
}

std::vector<torch::Tensor> Optimizer::trainable() const {
  std::vector<torch::Tensor> out;
  for (const std::string& name : names_)
    if (groups_.at(name) != ParamGroup::kFrozen) out.push_back(params_.at(name));
  return out;
}

TensorMap Optimizer::state_tensors() const {
  TensorMap out;
  const auto& state = adamw_->state();
  for (const std::string& name : names_) {
    auto it = state.find(state_key(params_.at(name)));
    if (it == state.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out[name + ".exp_avg"] = s.exp_avg();
    out[name + ".exp_avg_sq"] = s.exp_avg_sq();
    out[name + ".step"] = torch::tensor(s.step(), torch::kInt64).reshape({});
  }
  return out;
}

std::map<std::string, std::string> Optimizer::state_metadata() const {
  nlohmann::json groups = nlohmann::json::object();
  for (const std::string& name : names_) groups[name] = group_name(groups_.at(name));
  return {{"format", "cemfrac-adamw"}, {"groups", groups.dump()}};
}

void Optimizer::load_state(const SafetensorsFile& file, const std::string& source) {
  // Group membership first: parameters trainable when the state was saved are unfrozen here.
  auto meta = file.metadata.find("groups");
  CEMFRAC_CHECK(meta != file.metadata.end(),
                "{}: no 'groups' metadata (not an optimizer state written by cemfrac)", source);
  nlohmann::json groups = nlohmann::json::parse(meta->second, nullptr, false);
  CEMFRAC_CHECK(groups.is_object(), "{}: corrupted 'groups' metadata", source);
  for (auto it = groups.begin(); it != groups.end(); ++it) {
    CEMFRAC_CHECK(groups_.count(it.key()),
                  "{}: optimizer state for '{}', which the model does not have", source, it.key());
    const std::string saved = it.value().is_string() ? it.value().get<std::string>() : "";
    const std::string here = group_name(groups_.at(it.key()));
    if (saved == here) continue;
    if (here == std::string(group_name(ParamGroup::kFrozen)) &&
        (saved == group_name(ParamGroup::kDecay) || saved == group_name(ParamGroup::kNoDecay))) {
      unfreeze(it.key(), saved == group_name(ParamGroup::kDecay) ? ParamGroup::kDecay
                                                               : ParamGroup::kNoDecay);
      continue;
    }
    fail("{}: parameter '{}' was in group '{}' when saved but is in '{}' now", source, it.key(),
         saved, here);
  }
  std::set<std::string> used;
  std::vector<std::string> problems;
  auto& state = adamw_->state();
  for (const std::string& name : names_) {
    const torch::Tensor& p = params_.at(name);
    auto m = file.tensors.find(name + ".exp_avg");
    auto v = file.tensors.find(name + ".exp_avg_sq");
    auto s = file.tensors.find(name + ".step");
    const int found = (m != file.tensors.end()) + (v != file.tensors.end()) +
                      (s != file.tensors.end());
    if (found == 0) {
      state.erase(state_key(p));  // never stepped (fresh or just unfrozen)
      continue;
    }
    if (found != 3) {
      problems.push_back(fmt::format("'{}' lacks part of its state", name));
      continue;
    }
    if (groups_.at(name) == ParamGroup::kFrozen) {
      problems.push_back(fmt::format("'{}' is frozen but has state", name));
      continue;
    }
    used.insert({m->first, v->first, s->first});
    if (m->second.sizes() != p.sizes() || v->second.sizes() != p.sizes() ||
        s->second.numel() != 1) {
      problems.push_back(fmt::format("'{}' state shape {} vs parameter {}", name,
                                     shape_string(m->second.sizes()), shape_string(p.sizes())));
      continue;
    }
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(s->second.to(torch::kInt64).item<int64_t>());
    st->exp_avg(m->second.to(p.options()).clone());
    st->exp_avg_sq(v->second.to(p.options()).clone());
    state[state_key(p)] = std::move(st);
  }
  for (const auto& [key, tensor] : file.tensors)
    if (!used.count(key)) problems.push_back(fmt::format("unexpected tensor '{}'", key));
  CEMFRAC_CHECK(problems.empty(), "{} does not match the model's parameters: {}", source,
                fmt::join(problems.begin(), problems.begin() + std::min<size_t>(problems.size(), 6),
                          "; "));
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().detach().to(torch::kFloat64).norm());
  if (norms.empty()) return 0.0;
  const double total = torch::stack(norms).norm().item<double>();
  if (max_norm > 0 && std::isfinite(total) && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : params)
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  return total;
}

}  // namespace cemfrac

#include "cemfrac/train/optimizer.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>
#include <set>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"

namespace cemfrac {
namespace {

std::string shape_string(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The names saved in optimizer.safetensors' metadata (kept here, not through lm_model's to_string,
// so the saved format cannot change when display names do).
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
    : config_(config), lr_(config.lr) {
  params_ = parameters_by_name(module, params);
  std::set<const c10::TensorImpl*> seen;
  for (const ParamInfo& info : params) {
    const torch::Tensor& p = params_.at(info.name);
    // Tied tensors appear once in the table; guard anyway, AdamW must not see a tensor twice.
    TORCH_INTERNAL_ASSERT(seen.insert(p.unsafeGetTensorImpl()).second,
                          "parameter table lists one tensor twice: ", info.name);
    names_.push_back(info.name);
    groups_[info.name] = info.group;
    if (info.group == ParamGroup::kFrozen) p.set_requires_grad(false);
  }
}

void Optimizer::set_lr(double lr) {
  lr_ = lr;
}

void Optimizer::zero_grad() {
  // Gradients become undefined (set_to_none): the next backward assigns instead of adding to zero,
  // which gives the same bits and skips a pass over memory.
  for (const auto& [name, p] : params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

void Optimizer::step() {
  torch::NoGradGuard no_grad;
  // Tensors off the fused CPU kernel (every tensor on a GPU; a strided one on the CPU) are updated
  // together, a few multi-tensor ATen ops per batch instead of five kernels per tensor: one batch
  // per (device, dtype, step count, weight decay), since those set each op's scalars.
  struct Batch {
    int64_t step = 0;
    double wd = 0;
    std::vector<torch::Tensor> p, g, m, v;
  };
  std::map<std::tuple<std::string, int, int64_t, double>, Batch> batches;
  for (const std::string& name : names_) {
    const ParamGroup group = groups_.at(name);
    if (group == ParamGroup::kFrozen || !owns(name)) continue;
    torch::Tensor p = params_.at(name);
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    Moments& s = state_[name];
    if (s.step == 0) {
      s.exp_avg = torch::zeros_like(p, torch::MemoryFormat::Contiguous);
      s.exp_avg_sq = torch::zeros_like(p, torch::MemoryFormat::Contiguous);
    }
    ++s.step;
    const double wd = group == ParamGroup::kDecay ? config_.weight_decay : 0.0;
    const bool fused = p.device().is_cpu() && p.is_contiguous() && g.is_contiguous() &&
                       (p.scalar_type() == torch::kFloat32 || p.scalar_type() == torch::kFloat64) &&
                       g.scalar_type() == p.scalar_type();
    if (fused) {
      kernels::adamw_step_cpu(p, g, s.exp_avg, s.exp_avg_sq, s.step, lr_, config_.beta1,
                              config_.beta2, config_.eps, wd);
      continue;
    }
    Batch& b = batches[{p.device().str(), static_cast<int>(p.scalar_type()), s.step, wd}];
    b.step = s.step;
    b.wd = wd;
    b.p.push_back(p);
    b.g.push_back(g);
    b.m.push_back(s.exp_avg);
    b.v.push_back(s.exp_avg_sq);
  }
  // torch.optim.AdamW's sequence, per element the same ops as one tensor at a time.
  for (auto& [key, b] : batches) {
    const double bc1 = 1.0 - std::pow(config_.beta1, static_cast<double>(b.step));
    const double bc2 = 1.0 - std::pow(config_.beta2, static_cast<double>(b.step));
    if (b.wd != 0) at::_foreach_mul_(b.p, 1.0 - lr_ * b.wd);
    at::_foreach_mul_(b.m, config_.beta1);
    at::_foreach_add_(b.m, b.g, 1.0 - config_.beta1);
    at::_foreach_mul_(b.v, config_.beta2);
    at::_foreach_addcmul_(b.v, b.g, b.g, 1.0 - config_.beta2);
    std::vector<torch::Tensor> denom = at::_foreach_sqrt(b.v);
    at::_foreach_div_(denom, std::sqrt(bc2));
    at::_foreach_add_(denom, config_.eps);
    at::_foreach_addcdiv_(b.p, b.m, denom, -lr_ / bc1);
  }
}

void Optimizer::unfreeze(const std::string& name, ParamGroup group) {
  auto it = groups_.find(name);
  CEMFRAC_CHECK(it != groups_.end(), "unfreeze: no parameter named '{}'", name);
  CEMFRAC_CHECK(it->second == ParamGroup::kFrozen, "unfreeze: parameter '{}' is not frozen", name);
  CEMFRAC_CHECK(group != ParamGroup::kFrozen,
                "unfreeze: '{}' must join the decay or no-decay group", name);
  params_.at(name).set_requires_grad(true);
  state_.erase(name);  // its moments start fresh at its first update
  it->second = group;
}

void Optimizer::set_owned(const std::set<std::string>& names) {
  for (const std::string& name : names)
    CEMFRAC_CHECK(groups_.count(name), "set_owned: no parameter named '{}'", name);
  owned_ = names;
  for (auto it = state_.begin(); it != state_.end();)
    it = owns(it->first) ? std::next(it) : state_.erase(it);
}

std::vector<int64_t> shard_by_size(const std::vector<int64_t>& sizes, int64_t parts) {
  CEMFRAC_CHECK(parts >= 1, "shard_by_size: {} parts", parts);
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> load(static_cast<size_t>(parts), 0), owner(sizes.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owner[i] = least;
    load[static_cast<size_t>(least)] += sizes[i];
  }
  return owner;
}

ShardedStateBytes sharded_state_bytes(const std::vector<ParamInfo>& params, int64_t parts,
                                      int64_t element_bytes) {
  std::vector<int64_t> sizes;
  for (const ParamInfo& p : params) sizes.push_back(p.numel);
  const std::vector<int64_t> owner = shard_by_size(sizes, parts);
  std::vector<int64_t> per_rank(static_cast<size_t>(parts), 0);
  ShardedStateBytes b;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t bytes = 2 * sizes[i] * element_bytes;
    b.whole += bytes;
    per_rank[static_cast<size_t>(owner[i])] += bytes;
  }
  b.largest_shard = *std::max_element(per_rank.begin(), per_rank.end());
  return b;
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
  for (const std::string& name : names_) {
    auto it = state_.find(name);
    if (it == state_.end()) continue;
    out[name + ".exp_avg"] = it->second.exp_avg;
    out[name + ".exp_avg_sq"] = it->second.exp_avg_sq;
    out[name + ".step"] = torch::tensor(it->second.step, torch::kInt64).reshape({});
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
      unfreeze(it.key(),
               saved == group_name(ParamGroup::kDecay) ? ParamGroup::kDecay : ParamGroup::kNoDecay);
      continue;
    }
    fail("{}: parameter '{}' was in group '{}' when saved but is in '{}' now", source, it.key(),
         saved, here);
  }
  std::set<std::string> used;
  std::vector<std::string> problems;
  std::map<std::string, Moments> loaded;
  for (const std::string& name : names_) {
    const torch::Tensor& p = params_.at(name);
    auto m = file.tensors.find(name + ".exp_avg");
    auto v = file.tensors.find(name + ".exp_avg_sq");
    auto s = file.tensors.find(name + ".step");
    const int found =
        (m != file.tensors.end()) + (v != file.tensors.end()) + (s != file.tensors.end());
    if (found == 0) continue;  // never stepped (fresh or just unfrozen)
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
    Moments& st = loaded[name];
    st.step = s->second.to(torch::kInt64).item<int64_t>();
    st.exp_avg = m->second.to(p.options()).clone(torch::MemoryFormat::Contiguous);
    st.exp_avg_sq = v->second.to(p.options()).clone(torch::MemoryFormat::Contiguous);
    if (st.step < 1) problems.push_back(fmt::format("'{}' has step {}", name, st.step));
  }
  for (const auto& [key, tensor] : file.tensors)
    if (!used.count(key)) problems.push_back(fmt::format("unexpected tensor '{}'", key));
  CEMFRAC_CHECK(
      problems.empty(), "{} does not match the model's parameters: {}", source,
      fmt::join(problems.begin(), problems.begin() + std::min<size_t>(problems.size(), 6), "; "));
  state_ = std::move(loaded);
  if (owned_) set_owned(*owned_);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  return clip_to_norm(params, grad_square_sum(params), max_norm);
}

double grad_square_sum(const std::vector<torch::Tensor>& params) {
  // Sum of squares of every gradient in float64 (on CPU one fused pass that does not depend on the
  // thread count), added in table order. Off the CPU the per-gradient sums stay on the device and
  // are added there in the same order: the step reads one number back (one host sync), not one per
  // parameter.
  double sum = 0;
  torch::Tensor device_sum;  // float64 scalar on the gradients' device
  bool any = false;
  for (const torch::Tensor& p : params) {
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    any = true;
    if (g.device().is_cpu() && g.is_contiguous() &&
        (g.scalar_type() == torch::kFloat32 || g.scalar_type() == torch::kFloat64)) {
      sum += kernels::sum_squares_cpu(g);
    } else {
      const torch::Tensor s = g.detach().to(torch::kFloat64).square().sum();
      device_sum = device_sum.defined() ? device_sum + s.to(device_sum.device()) : s;
    }
  }
  if (!any) return 0.0;
  if (device_sum.defined()) sum += device_sum.item<double>();
  return sum;
}

double clip_to_norm(const std::vector<torch::Tensor>& params, double square_sum, double max_norm) {
  const double total = std::sqrt(square_sum);
  if (max_norm > 0 && std::isfinite(total) && total > max_norm) {
    const double scale = max_norm / (total + 1e-6);
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : params)
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  return total;
}

}  // namespace cemfrac

// The trainer's data-parallel steps, kept apart from trainer.cpp: the rank layout, the
// start-of-run checks and parameter broadcast, and the per-step gradient and loss reduction. The
// collectives themselves are behind dist/data_parallel.h.
#include <fmt/format.h>

#include "cemfrac/core/compat.h"
#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/trainer.h"

#include <map>
#include <set>

namespace cemfrac {
namespace {

// What every rank must agree on: the architecture, every train.* field but the run directory, what
// identifies the data and its number of validation batches, the binary and LibTorch versions.
// FNV-1a of that text, as hex.
std::string run_fingerprint(const nlohmann::json& model_config, TrainConfig train,
                            const TrainingData& data, int64_t stop_at_step) {
  std::string text = model_config.dump();
  auto visit = [&text](const char* name, auto& value, const char*, auto...) {
    if (std::string(name) != "out") text += fmt::format("|{}={}", name, value);
  };
  train.visit_fields(visit);
  // --stop-at-step too: ranks stopping at different steps would wait on each other forever.
  text += fmt::format("|stop_at_step={}|data={},{}|cemfrac {}|torch {}", stop_at_step,
                      data.settings().dump(), data.validation_batches(), CEMFRAC_VERSION,
                      compat::torch_version());
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

}  // namespace

void set_data_parallel_layout(TrainerOptions& options) {
  if (options.dist == nullptr) return;
  options.rank = options.dist->rank();
  options.world_size = options.dist->world_size();
}

bool Trainer::distributed() const {
  return options_.dist != nullptr && options_.dist->active();
}

void Trainer::start_data_parallel() {
  DataParallel& d = *options_.dist;
  d.check_same("run config hash",
               run_fingerprint(model_.config, options_.train, *data_, options_.stop_at_step));
  d.check_same("checkpoint step", std::to_string(state_.step));
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, tensor] : parameters_by_name(*model_.module, model_.params))
    tensors.push_back(tensor);
  for (const auto& [name, tensor] : model_.buffers) tensors.push_back(tensor);
  d.broadcast_from_rank0(tensors, "parameters");
  // In table order (the reducer's buckets follow it backwards, as backward produces gradients).
  const auto by_name = parameters_by_name(*model_.module, model_.params);
  std::vector<torch::Tensor> params;
  for (const ParamInfo& info : model_.params) params.push_back(by_name.at(info.name));
  std::vector<int64_t> owner;  // of each parameter, in table order
  if (options_.train.shard_optimizer) {
    std::vector<int64_t> sizes;
    for (const ParamInfo& info : model_.params) sizes.push_back(info.numel);
    owner = shard_by_size(sizes, d.world_size());
    shards_.assign(static_cast<size_t>(d.world_size()), {});
    for (size_t i = 0; i < owner.size(); ++i)
      shards_[static_cast<size_t>(owner[i])].push_back(model_.params[i].name);
    const auto& mine = shards_[static_cast<size_t>(d.rank())];
    optimizer_->set_owned(std::set<std::string>(mine.begin(), mine.end()));
  }
  gradients_sharded_ = options_.train.shard_gradients;
  d.attach_gradients(params, options_.train.dist_overlap,
                     gradients_sharded_ ? owner : std::vector<int64_t>{});
}

double Trainer::clip_gradients() {
  const std::vector<torch::Tensor> trainable = optimizer_->trainable();
  if (!gradients_sharded_) return clip_grad_norm(trainable, options_.train.grad_clip);
  // Each rank holds its owned gradients only: the squares summed over ranks.
  const double local = grad_square_sum(trainable);
  const double total = options_.dist->allreduce_sum({local}, "gradient norm", false)[0];
  return clip_to_norm(trainable, total, options_.train.grad_clip);
}

void Trainer::broadcast_updated_parameters() {
  DataParallel& d = *options_.dist;
  const auto by_name = parameters_by_name(*model_.module, model_.params);
  for (size_t r = 0; r < shards_.size(); ++r) {
    std::vector<torch::Tensor> updated;
    for (const std::string& name : shards_[r])
      if (!optimizer_->is_frozen(name)) updated.push_back(by_name.at(name));
    d.broadcast(updated, static_cast<int64_t>(r), "updated parameters");
  }
}

TensorMap Trainer::optimizer_state_to_save() {
  if (shards_.empty()) return optimizer_->state_tensors();
  DataParallel& d = *options_.dist;
  TensorMap mine = optimizer_->state_tensors();
  // Which parameters have state (on their owner) and at which step: a sum over ranks, since
  // every parameter has one owner.
  std::vector<double> steps;
  for (const ParamInfo& info : model_.params) {
    auto it = mine.find(info.name + ".step");
    steps.push_back(it == mine.end() ? 0.0 : static_cast<double>(it->second.item<int64_t>()));
  }
  steps = d.allreduce_sum(steps, "optimizer state steps", false);
  std::map<std::string, int64_t> step_of;
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i] > 0) step_of[model_.params[i].name] = static_cast<int64_t>(steps[i]);
  const auto by_name = parameters_by_name(*model_.module, model_.params);
  TensorMap all;
  for (size_t r = 0; r < shards_.size(); ++r) {
    std::vector<torch::Tensor> moments;
    std::vector<std::string> keys;
    for (const std::string& name : shards_[r]) {
      if (!step_of.count(name)) continue;
      for (const char* part : {".exp_avg", ".exp_avg_sq"}) {
        const std::string key = name + part;
        auto it = mine.find(key);
        moments.push_back(it != mine.end() ? it->second
                                           : torch::empty_like(by_name.at(name),
                                                               torch::MemoryFormat::Contiguous));
        keys.push_back(key);
      }
    }
    d.send_to_rank0(moments, static_cast<int64_t>(r), "optimizer state");
    if (d.rank() != 0) continue;
    for (size_t i = 0; i < keys.size(); ++i) all[keys[i]] = moments[i];
  }
  if (d.rank() != 0) return {};
  for (const auto& [name, step] : step_of)
    all[name + ".step"] = torch::tensor(step, torch::kInt64).reshape({});
  return all;
}

double Trainer::reduce_step(double loss_sum, bool stop) {
  DataParallel& d = *options_.dist;
  d.reduce_gradients();  // with train.dist_overlap, launched during the last backward
  const std::vector<double> sums = d.allreduce_sum({loss_sum, stop ? 1.0 : 0.0}, "loss", true);
  stop_agreed_ = sums[1] > 0;
  return sums[0];
}

}  // namespace cemfrac

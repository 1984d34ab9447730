// The trainer's data-parallel steps, kept apart from trainer.cpp: the rank layout, the
// start-of-run checks and parameter broadcast, and the per-step gradient and loss reduction. The
// collectives themselves are behind dist/data_parallel.h.
#include <fmt/format.h>

#include "cemfrac/core/compat.h"
#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/train/trainer.h"

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
  std::vector<torch::Tensor> params;
  for (const auto& [name, tensor] : parameters_by_name(*model_.module, model_.params))
    params.push_back(tensor);
  d.attach_gradients(params, options_.train.dist_overlap);
}

double Trainer::reduce_step(double loss_sum, bool stop) {
  DataParallel& d = *options_.dist;
  d.reduce_gradients();  // with train.dist_overlap, launched during the last backward
  const std::vector<double> sums = d.allreduce_sum({loss_sum, stop ? 1.0 : 0.0}, "loss", true);
  stop_agreed_ = sums[1] > 0;
  return sums[0];
}

}  // namespace cemfrac

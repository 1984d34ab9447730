// start_or_resume_training (train_run.h).
#include "cemfrac/train/train_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/budget.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/run_dir.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

// "a, b, c and 4 more": the first names of a list.
std::string some_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 4;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  std::string out = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

void print_init_from(const InitFromReport& r) {
  fmt::print("# init_from {}: {} tensors loaded", r.checkpoint, r.loaded.size());
  if (!r.fresh.empty())
    fmt::print("; {} freshly initialised ({})", r.fresh.size(), some_names(r.fresh));
  if (!r.unused.empty())
    fmt::print("; {} of the checkpoint unused ({})", r.unused.size(), some_names(r.unused));
  fmt::print("\n");
}

// The run's all-reduce time, step by step.
struct ReduceTotals : ReduceObserver {
  double seconds = 0;
  double exposed_seconds = 0;
  int64_t steps = 0;
  void on_step_reduced(const ReduceTiming& t) override {
    seconds += t.seconds;
    exposed_seconds += t.exposed_seconds;
    ++steps;
  }
};

// The checkpoint --resume names, resolved; a checkpoint inside a run's checkpoints/ continues that
// run in its own directory.
std::string resolve_resume(const std::string& resume, RunConfig& config) {
  if (resume.empty()) return resume;
  const std::string resolved = resolve_checkpoint(resume);  // warns about skipped incomplete ones
  const fs::path parent = fs::path(resolved).lexically_normal().parent_path();
  if (parent.filename() == "checkpoints") {
    const std::string own = parent.parent_path().empty() ? "." : parent.parent_path().string();
    std::error_code ec1, ec2;
    if (fs::weakly_canonical(own, ec1) != fs::weakly_canonical(config.train.out, ec2)) {
      warn("train.out = {} is ignored: --resume continues the run in {}", config.train.out, own);
      config.train.out = own;
    }
  }
  return resolved;
}

// The refusals that need the dataset and the machine: an unprepared dataset, a tokenizer larger
// than the model's vocabulary, a config that cannot fit in this machine's memory. Returns the
// dataset's tokenizer.
std::unique_ptr<Tokenizer> check_data_and_memory(const RunConfig& config,
                                                 const torch::Device& device) {
  CEMFRAC_CHECK(fs::exists(config.data.path + "/meta.json"),
                "data.path '{}' is not a prepared dataset (no meta.json): run cemfrac prepare "
                "--out {} first",
                config.data.path, config.data.path);
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(config.data.path + "/tokenizer");
  CEMFRAC_CHECK(tokenizer->vocab_size() <= config.model.vocab_size,
                "model.vocab_size = {} is smaller than the dataset tokenizer's vocabulary ({}, {})",
                config.model.vocab_size, tokenizer->vocab_size(), tokenizer->id());
  const double need = training_memory_lower_bound(config);
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  CEMFRAC_CHECK(!device.is_cpu() || have <= 0 || need <= have,
                "this config needs at least {:.1f} GiB to train (parameters, gradients, AdamW "
                "state and activations) but this machine has {:.1f} GiB; use a smaller model, "
                "train.micro_batch or train.seq_len",
                need / (1u << 30), have / (1u << 30));
  return tokenizer;
}

}  // namespace

TrainRunOutcome start_or_resume_training(TrainRunRequest request, torch::Device device) {
  RunConfig& config = request.config;
  const std::string resume = resolve_resume(request.resume, config);
  const std::string toml = to_toml(config);
  const DistEnv dist_env = dist_env_from_environment();
  // Each CUDA rank takes its own GPU; config.train.device keeps what was asked ("cuda"), so that
  // every rank's run config, which they compare, is the same.
  if (dist_env.world_size > 1)
    device = data_parallel_device(device, config.train.device != "cuda", dist_env,
                                  device.is_cuda() ? torch::cuda::device_count() : 0);
  const std::unique_ptr<DataParallel> dp = make_data_parallel(dist_env, request.dist, device);
  DataParallel& dist = *dp;
  ReduceTotals reduce_totals;
  dist.set_observer(&reduce_totals);
  if (dist.rank() == 0) {
    fmt::print("# resolved run config ({})\n{}\n", request.source, toml);
    if (dist.active())
      fmt::print("# data parallel: {}; gradient all-reduce {}\n", dist.describe(),
                 config.train.dist_overlap ? "overlapped with backward (train.dist_overlap)"
                                           : "after backward (train.dist_overlap = false)");
    std::fflush(stdout);
  }

  // The run directory's rule is the Trainer's too; asked here first so that a refused folder is
  // named before the data and the model are loaded.
  if (resume.empty() && dist.rank() == 0)
    check_new_run_dir(config.train.out, "train.out", config.data.path);
  const std::unique_ptr<Tokenizer> tokenizer = check_data_and_memory(config, device);
  seed_everything(config.train.seed);
  LmModel model(config.model, device);
  if (resume.empty() && !config.train.init_from.empty()) {
    const InitFromReport init =
        init_from_checkpoint(*model, config.train.init_from, tokenizer.get());
    if (dist.rank() == 0) print_init_from(init);
  }
  TrainerOptions options;
  options.train = config.train;
  options.data_dir = config.data.path;
  options.tokenizer = tokenizer.get();
  options.verify_data = request.verify_data;
  options.resume = resume;
  options.progress = request.progress;
  options.stop_at_step = request.stop_at_step;
  options.dist = &dist;
  // A dry run of shapes on the meta device writes nothing: no run folder, no summary (its error,
  // one line, is the whole report).
  options.write_files = !device.is_meta();
  Trainer trainer(make_train_model(model), options);  // data, existing run, checkpoint, settings
  if (dist.rank() == 0 && dist.active() && config.train.shard_optimizer) {
    const ShardedStateBytes b = sharded_state_bytes(model->parameter_table(), dist.world_size());
    fmt::print(
        "# optimizer state sharded over {} ranks (train.shard_optimizer): AdamW moments {:.2f} "
        "MiB on the most loaded rank instead of {:.2f} MiB\n",
        dist.world_size(), b.largest_shard / 1048576.0, b.whole / 1048576.0);
  }
  if (dist.rank() == 0 && options.write_files)
    write_file_atomic(trainer.run_dir() + "/config.toml", toml);

  TrainRunOutcome out;
  out.result = trainer.run();
  dist.finish();
  out.run_dir = trainer.run_dir();
  out.rank = dist.rank();
  out.data_parallel = dist.active();
  out.reduce_seconds = reduce_totals.seconds;
  out.reduce_exposed_seconds = reduce_totals.exposed_seconds;
  out.reduce_steps = reduce_totals.steps;
  return out;
}

}  // namespace cemfrac

// cemfrac train: trains a model described by a TOML run config (configs/*.toml) on a prepared
// dataset. Prints the resolved config; once every check has passed, saves it as <run>/config.toml
// and runs the trainer (metrics, progress, checkpoints, NaN guard, SIGINT/SIGTERM checkpoint and
// exit code kExitInterrupted; --resume continues a run exactly, in its own directory).
#include <fmt/format.h>
#include <torch/cuda.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/dist/env.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/budget.h"
#include "cemfrac/train/run_config.h"
#include "cemfrac/train/run_dir.h"
#include "cemfrac/train/trainer.h"
#include "cli/commands.h"
#include "cli/device_util.h"

namespace cemfrac::cli {

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

// The run's all-reduce time, step by step, for the closing line (and `bench train --nproc`, which
// reads that line).
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

}  // namespace

Command add_train(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string config;
    std::vector<std::string> sets;
    std::string resume;
    std::string out;
    int64_t stop_at_step = 0;
    bool quiet = false;
    double connect_timeout = 0;
    double collective_timeout = 0;
    bool no_verify_data = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("train", "Train a model from a TOML run config");
  app->footer(
      "Exit codes: 0 completed (or stopped at --stop-at-step), 1 error, 2 usage error, 3 "
      "interrupted by SIGINT/SIGTERM (checkpoint saved; continue with --resume RUN).");
  app->add_option("--config", f->config, "Run config (TOML: [model] [data] [train] [eval])")
      ->required();
  app->add_option("--set", f->sets, "Override a config field: section.key=value (repeatable)");
  app->add_option("--resume", f->resume,
                  "Continue a run in its own directory: the run directory (newest complete "
                  "checkpoint) or one checkpoint directory; settings that break exactness must not "
                  "change");
  app->add_option("--out", f->out, "Run directory (same as --set train.out=DIR)");
  app->add_option("--stop-at-step", f->stop_at_step,
                  "Stop after this step with a checkpoint (the schedule still spans train.steps)");
  app->add_flag("--no-verify-data", f->no_verify_data,
                "Skip the full scan of train.bin and val.bin before step 1 (token CRC-32, every id "
                "below the vocabulary); the header checks still run (docs/formats.md)");
  app->add_flag("--quiet", f->quiet, "No progress line");
  app->add_option("--connect-timeout", f->connect_timeout,
                  "Data parallel: seconds to reach the store and meet every rank (default 60, or "
                  "CEMFRAC_CONNECT_TIMEOUT)")
      ->check(CLI::PositiveNumber);
  app->add_option("--collective-timeout", f->collective_timeout,
                  "Data parallel: seconds one collective may wait for a peer before the run fails "
                  "(default 60, or CEMFRAC_COLLECTIVE_TIMEOUT)")
      ->check(CLI::PositiveNumber);
  auto run = [f, &global]() {
    CEMFRAC_CHECK(f->stop_at_step >= 0,
                  "--stop-at-step {}: must be a step number >= 1 (or 0: run to train.steps)",
                  f->stop_at_step);
    std::vector<std::string> sets = f->sets;
    if (!f->out.empty()) sets.push_back("train.out=" + f->out);
    RunConfig config = load_run_config(f->config, sets);
    if (!global.device.empty()) config.train.device = global.device;  // config.toml says where
    torch::Device device = command_device(global, config.train.device);
    // --resume continues in the run's own directory (the trainer warns when train.out differs).
    std::string resume = f->resume;
    if (!resume.empty()) {
      resume = resolve_checkpoint(resume);  // warns about skipped incomplete checkpoints, once
      const std::filesystem::path parent =
          std::filesystem::path(resume).lexically_normal().parent_path();
      if (parent.filename() == "checkpoints") {
        const std::string own = parent.parent_path().empty() ? "." : parent.parent_path().string();
        std::error_code ec1, ec2;
        if (std::filesystem::weakly_canonical(own, ec1) !=
            std::filesystem::weakly_canonical(config.train.out, ec2)) {
          warn("train.out = {} is ignored: --resume continues the run in {}", config.train.out,
               own);
          config.train.out = own;
        }
      }
    }
    const std::string toml = to_toml(config);
    // Data parallel when torchrun's WORLD_SIZE > 1 (cemfrac launch sets it); rank 0 alone prints
    // the config and writes into the run directory.
    DistOptions dist_options = dist_options_from_environment();
    if (f->connect_timeout > 0) dist_options.connect_timeout_s = f->connect_timeout;
    if (f->collective_timeout > 0) dist_options.collective_timeout_s = f->collective_timeout;
    const DistEnv dist_env = dist_env_from_environment();
    // Each CUDA rank takes its own GPU; config.train.device keeps what was asked ("cuda"), so
    // that every rank's run config, which they compare, is the same.
    if (dist_env.world_size > 1)
      device = data_parallel_device(device, config.train.device != "cuda", dist_env,
                                    device.is_cuda() ? torch::cuda::device_count() : 0);
    const std::unique_ptr<DataParallel> dp = make_data_parallel(dist_env, dist_options, device);
    DataParallel& dist = *dp;
    ReduceTotals reduce_totals;
    dist.set_observer(&reduce_totals);
    if (dist.rank() == 0) {
      fmt::print("# resolved run config ({}{})\n{}\n", f->config,
                 sets.empty() ? "" : fmt::format(", {} override(s)", sets.size()), toml);
      if (dist.active())
        fmt::print("# data parallel: {}; gradient all-reduce {}\n", dist.describe(),
                   config.train.dist_overlap ? "overlapped with backward (train.dist_overlap)"
                                             : "after backward (train.dist_overlap = false)");
      std::fflush(stdout);
    }

    // Every check that can refuse the command runs before the first write into the run directory.
    // The run directory's rule (train/run_dir.h) is the Trainer's too; asked here first so that a
    // refused folder is named before the data and the model are loaded.
    if (resume.empty() && dist.rank() == 0)
      check_new_run_dir(config.train.out, "train.out", config.data.path);
    const std::string tokenizer_dir = config.data.path + "/tokenizer";
    CEMFRAC_CHECK(std::filesystem::exists(config.data.path + "/meta.json"),
                  "data.path '{}' is not a prepared dataset (no meta.json): run cemfrac prepare "
                  "--out {} first",
                  config.data.path, config.data.path);
    std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_dir);
    CEMFRAC_CHECK(
        tokenizer->vocab_size() <= config.model.vocab_size,
        "model.vocab_size = {} is smaller than the dataset tokenizer's vocabulary ({}, {})",
        config.model.vocab_size, tokenizer->vocab_size(), tokenizer->id());

    const double need = training_memory_lower_bound(config);
    const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    CEMFRAC_CHECK(!device.is_cpu() || have <= 0 || need <= have,
                  "this config needs at least {:.1f} GiB to train (parameters, gradients, AdamW "
                  "state and activations) but this machine has {:.1f} GiB; use a smaller model, "
                  "train.micro_batch or train.seq_len",
                  need / (1u << 30), have / (1u << 30));
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
    options.verify_data = !f->no_verify_data;
    options.resume = resume;
    options.progress = !f->quiet;
    options.stop_at_step = f->stop_at_step;
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
    TrainResult result = trainer.run();
    dist.finish();
    if (dist.rank() != 0) return result.status == TrainStatus::kInterrupted ? kExitInterrupted : 0;
    fmt::print("{} at step {} ({} tokens, {:.1f} s): loss {:.4f}{}\n", to_string(result.status),
               result.step, result.tokens, result.elapsed_s, result.last_loss,
               result.last_val_loss ? fmt::format(", val_loss {:.4f}", *result.last_val_loss) : "");
    if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
    if (dist.active() && reduce_totals.steps > 0) {
      const double steps = static_cast<double>(reduce_totals.steps);
      fmt::print(
          "data parallel: all-reduce {:.3f} s in {} steps ({:.2f} ms/step), exposed {:.2f} "
          "ms/step (waiting after backward; {})\n",
          reduce_totals.seconds, reduce_totals.steps, 1e3 * reduce_totals.seconds / steps,
          1e3 * reduce_totals.exposed_seconds / steps,
          config.train.dist_overlap ? "overlapped with backward" : "not overlapped");
    }
    if (result.status == TrainStatus::kInterrupted) {
      std::fflush(stdout);
      fmt::print(stderr, "cemfrac: interrupted at step {}; continue with --resume {}\n",
                 result.step, trainer.run_dir());
      return kExitInterrupted;
    }
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

// cemfrac train: trains a model described by a TOML run config (configs/*.toml) on a prepared
// dataset: the flags, then one call (cemfrac/train/train_run.h), which prints the resolved config,
// checks everything that can refuse the run, saves the config as <run>/config.toml and runs the
// trainer (metrics, progress, checkpoints, NaN guard, SIGINT/SIGTERM checkpoint and exit code
// kExitInterrupted; --resume continues a run exactly, in its own directory).
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/train/run_config.h"
#include "cemfrac/train/train_run.h"
#include "cemfrac/train/trainer.h"
#include "cli/commands.h"
#include "cli/device_util.h"

namespace cemfrac::cli {

namespace {

// What a finished, stopped or interrupted run prints (rank 0 only), and its exit code.
int report_outcome(const TrainRunOutcome& run, bool overlap) {
  const TrainResult& result = run.result;
  if (run.rank != 0) return result.status == TrainStatus::kInterrupted ? kExitInterrupted : 0;
  fmt::print("{} at step {} ({} tokens, {:.1f} s): loss {:.4f}{}\n", to_string(result.status),
             result.step, result.tokens, result.elapsed_s, result.last_loss,
             result.last_val_loss ? fmt::format(", val_loss {:.4f}", *result.last_val_loss) : "");
  if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
  if (run.data_parallel && run.reduce_steps > 0) {
    const double steps = static_cast<double>(run.reduce_steps);
    fmt::print(
        "data parallel: all-reduce {:.3f} s in {} steps ({:.2f} ms/step), exposed {:.2f} "
        "ms/step (waiting after backward; {})\n",
        run.reduce_seconds, run.reduce_steps, 1e3 * run.reduce_seconds / steps,
        1e3 * run.reduce_exposed_seconds / steps,
        overlap ? "overlapped with backward" : "not overlapped");
  }
  if (result.status == TrainStatus::kInterrupted) {
    std::fflush(stdout);
    fmt::print(stderr, "cemfrac: interrupted at step {}; continue with --resume {}\n", result.step,
               run.run_dir);
    return kExitInterrupted;
  }
  return 0;
}

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
    TrainRunRequest request;
    request.config = load_run_config(f->config, sets);
    RunConfig& config = request.config;
    if (!global.device.empty()) config.train.device = global.device;  // config.toml says where
    const torch::Device device = command_device(global, config.train.device);
    request.source = f->config + (sets.empty() ? "" : fmt::format(", {} override(s)", sets.size()));
    request.resume = f->resume;
    request.stop_at_step = f->stop_at_step;
    request.progress = !f->quiet;
    request.verify_data = !f->no_verify_data;
    if (f->connect_timeout > 0) request.dist.connect_timeout_s = f->connect_timeout;
    if (f->collective_timeout > 0) request.dist.collective_timeout_s = f->collective_timeout;
    const bool overlap = config.train.dist_overlap;
    return report_outcome(start_or_resume_training(std::move(request), device), overlap);
  };
  return {app, run};
}

}  // namespace cemfrac::cli

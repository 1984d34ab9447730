// cemfrac train: trains a model described by a TOML run config (configs/*.toml) on a prepared
// dataset. Prints the resolved config, saves it as <run>/config.toml, then runs the trainer (metrics,
// progress, checkpoints, NaN guard, SIGINT/SIGTERM checkpoint; --resume continues a run exactly).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/distributed.h"
#include "cemfrac/train/run_config.h"
#include "cemfrac/train/trainer.h"
#include "cli/commands.h"

namespace cemfrac::cli {

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
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("train", "Train a model from a TOML run config");
  app->add_option("--config", f->config, "Run config (TOML: [model] [data] [train] [eval])")
      ->required();
  app->add_option("--set", f->sets, "Override a config field: section.key=value (repeatable)");
  app->add_option("--resume", f->resume,
                  "Continue a run: its directory (newest checkpoint) or one checkpoint directory");
  app->add_option("--out", f->out, "Run directory (same as --set train.out=DIR)");
  app->add_option("--stop-at-step", f->stop_at_step,
                  "Stop after this step with a checkpoint (the schedule still spans train.steps)");
  app->add_flag("--quiet", f->quiet, "No progress line");
  app->add_option("--connect-timeout", f->connect_timeout,
                  "Data parallel: seconds to reach the store and meet every rank (default 60, or "
                  "CEMFRAC_CONNECT_TIMEOUT)")
      ->check(CLI::PositiveNumber);
  app->add_option("--collective-timeout", f->collective_timeout,
                  "Data parallel: seconds one collective may wait for a peer before the run fails "
                  "(default 60, or CEMFRAC_COLLECTIVE_TIMEOUT)")
      ->check(CLI::PositiveNumber);
  auto run = [f]() {
    std::vector<std::string> sets = f->sets;
    if (!f->out.empty()) sets.push_back("train.out=" + f->out);
    RunConfig config = load_run_config(f->config, sets);
    const std::string toml = to_toml(config);
    // Data parallel when torchrun's WORLD_SIZE > 1 (cemfrac launch sets it); rank 0 alone prints the
    // config and writes into the run directory.
    DistOptions dist_options = dist_options_from_environment();
    if (f->connect_timeout > 0) dist_options.connect_timeout_s = f->connect_timeout;
    if (f->collective_timeout > 0) dist_options.collective_timeout_s = f->collective_timeout;
    DistContext dist(dist_env_from_environment(), dist_options);
    if (dist.rank() == 0) {
      fmt::print("# resolved run config ({}{})\n{}\n", f->config,
                 sets.empty() ? "" : fmt::format(", {} override(s)", sets.size()), toml);
      if (dist.active()) fmt::print("# data parallel: {}\n", dist.describe());
      std::fflush(stdout);
      std::filesystem::create_directories(config.train.out);
      write_file_atomic(config.train.out + "/config.toml", toml);
    }

    const std::string tokenizer_dir = config.data.path + "/tokenizer";
    CEMFRAC_CHECK(std::filesystem::exists(config.data.path + "/meta.json"),
                  "data.path '{}' is not a prepared dataset (no meta.json): run cemfrac prepare "
                  "--out {} first",
                  config.data.path, config.data.path);
    std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_dir);
    CEMFRAC_CHECK(tokenizer->vocab_size() <= config.model.vocab_size,
                  "model.vocab_size = {} is smaller than the dataset tokenizer's vocabulary ({}, {})",
                  config.model.vocab_size, tokenizer->vocab_size(), tokenizer->id());

    seed_everything(config.train.seed);
    LmModel model(config.model);
    TrainerOptions options;
    options.train = config.train;
    options.data_dir = config.data.path;
    options.tokenizer = tokenizer.get();
    options.resume = f->resume;
    options.progress = !f->quiet;
    options.stop_at_step = f->stop_at_step;
    options.dist = &dist;
    Trainer trainer(make_train_model(model), options);
    TrainResult result = trainer.run();
    dist.finish();
    if (dist.rank() != 0) return 0;
    fmt::print("{} at step {} ({} tokens, {:.1f} s): loss {:.4f}{}\n", to_string(result.status),
               result.step, result.tokens, result.elapsed_s, result.last_loss,
               result.last_val_loss ? fmt::format(", val_loss {:.4f}", *result.last_val_loss) : "");
    if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
    if (dist.active() && dist.reduce_steps() > 0)
      fmt::print("data parallel: all-reduce {:.3f} s in {} steps ({:.2f} ms/step, after backward)\n",
                 dist.reduce_seconds(), dist.reduce_steps(),
                 1e3 * dist.reduce_seconds() / static_cast<double>(dist.reduce_steps()));
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

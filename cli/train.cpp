// cemfrac train: trains a model described by a TOML run config (configs/*.toml) on a prepared
// dataset. Prints the resolved config, saves it as <run>/config.toml, then runs the trainer (metrics,
// progress, checkpoints, NaN guard, SIGINT/SIGTERM checkpoint; --resume continues a run exactly).
#include <fmt/format.h>

#include <filesystem>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
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
    bool no_verify_data = false;
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
  app->add_flag("--no-verify-data", f->no_verify_data,
                "Skip the full scan of train.bin and val.bin before step 1 (token CRC-32, every id "
                "below the vocabulary); the header checks still run (docs/formats.md)");
  app->add_flag("--quiet", f->quiet, "No progress line");
  auto run = [f]() {
    CEMFRAC_CHECK(f->stop_at_step >= 0,
                  "--stop-at-step {}: must be a step number >= 1 (or 0: run to train.steps)",
                  f->stop_at_step);
    std::vector<std::string> sets = f->sets;
    if (!f->out.empty()) sets.push_back("train.out=" + f->out);
    RunConfig config = load_run_config(f->config, sets);
    const std::string toml = to_toml(config);
    fmt::print("# resolved run config ({}{})\n{}\n", f->config,
               sets.empty() ? "" : fmt::format(", {} override(s)", sets.size()), toml);
    std::filesystem::create_directories(config.train.out);
    write_file_atomic(config.train.out + "/config.toml", toml);

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
    options.verify_data = !f->no_verify_data;
    options.resume = f->resume;
    options.progress = !f->quiet;
    options.stop_at_step = f->stop_at_step;
    Trainer trainer(make_train_model(model), options);
    TrainResult result = trainer.run();
    fmt::print("{} at step {} ({} tokens, {:.1f} s): loss {:.4f}{}\n", to_string(result.status),
               result.step, result.tokens, result.elapsed_s, result.last_loss,
               result.last_val_loss ? fmt::format(", val_loss {:.4f}", *result.last_val_loss) : "");
    if (!result.last_checkpoint.empty()) fmt::print("checkpoint: {}\n", result.last_checkpoint);
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

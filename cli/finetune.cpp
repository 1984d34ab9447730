// cemfrac finetune: a classification (STS-B: regression) head on a pre-trained checkpoint, trained
// on GLUE's TSV files, a plain text<TAB>label TSV or the built-in Brown genre task through the one
// Trainer (tasks/finetune.h), then scored with the task's GLUE metrics.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/tasks/finetune.h"
#include "cemfrac/tasks/glue.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cli/flag_checks.h"

namespace cemfrac::cli {

Command add_finetune(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    FinetuneOptions o;
    bool json = false;
    bool quiet = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "finetune",
      "Fine-tune a checkpoint with a classification head on GLUE TSVs, a text<TAB>label TSV or "
      "Brown genres (docs/evaluation.md)");
  app->add_option("--checkpoint", f->o.checkpoint,
                  "Pre-trained checkpoint directory, or a run directory (newest checkpoint)");
  app->add_option("--task", f->o.task,
                  "cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli (GLUE's files), tsv "
                  "(DIR/train.tsv and DIR/dev.tsv, text<TAB>label) or brown-genre (built in)")
      ->required();
  app->add_option("--data", f->o.data_dir,
                  "The task's folder: GLUE's (e.g. glue_data/MRPC: train.tsv, dev.tsv; MNLI: "
                  "dev_matched.tsv, dev_mismatched.tsv) or the plain TSV's; not for brown-genre");
  app->add_option("--out", f->o.out, "Run directory (checkpoints, metrics.jsonl, summary.json, "
                                     "finetune.json)")
      ->capture_default_str();
  app->add_option("--resume", f->o.resume,
                  "Continue a fine-tuning run directory exactly (same --task, --data and flags)");
  app->add_option("--lr", f->o.lr, "Peak learning rate (warmup, then cosine to 0)")
      ->capture_default_str();
  app->add_option("--epochs", f->o.epochs, "Passes over the training set (fractions allowed)")
      ->capture_default_str();
  app->add_option("--batch", f->o.batch, "Examples per optimizer step")->capture_default_str();
  app->add_option("--max-len", f->o.max_len,
                  "Tokens per example, end-of-text ids included (0: the model's context); longer "
                  "inputs lose tokens from the end of their longer text")
      ->capture_default_str();
  app->add_option("--seed", f->o.seed, "Head initialisation and data order")
      ->check(seed_check())
      ->capture_default_str();
  app->add_option("--warmup", f->o.warmup, "Warmup as a fraction of the steps")
      ->capture_default_str();
  app->add_option("--weight-decay", f->o.weight_decay, "AdamW weight decay (matrices)")
      ->capture_default_str();
  app->add_option("--set", f->o.sets,
                  "Change a backbone field no parameter shape depends on, e.g. model.cem.steps=4");
  app->add_option("--stop-at-step", f->o.stop_at_step,
                  "Stop after this many steps with a checkpoint (the schedule still spans all)");
  app->add_flag("--json", f->json, "Print finetune.json's object");
  app->add_flag("--quiet", f->quiet, "No progress line");
  auto run = [f, &global]() {
    f->o.device = command_device(global);
    CEMFRAC_CHECK(f->o.task == "brown-genre" || !f->o.data_dir.empty(),
                  "--task {} needs --data DIR (the task's folder of TSV files)", f->o.task);
    CEMFRAC_CHECK(f->o.task != "brown-genre" || f->o.data_dir.empty(),
                  "--task brown-genre is built in: no --data");
    f->o.progress = !f->quiet;
    const FinetuneResult r = run_finetune(f->o);
    if (f->json) {
      fmt::print("{}\n", r.report.dump(2));
    } else {
      fmt::print("{} at step {}/{}; checkpoint {}\n", r.status, r.step, r.steps, r.checkpoint);
      if (r.report.contains("evals")) {
        for (const auto& [name, m] : r.report["evals"].items()) {
          std::string line;
          for (const auto& [k, v] : m.items()) {
            if (k == "examples") continue;
            line += fmt::format("  {} {:.4f}", k, v.get<double>());
          }
          fmt::print("{:<16}{} examples{}\n", name, m["examples"].get<int64_t>(), line);
        }
      }
    }
    if (r.status == "interrupted") {
      std::fflush(stdout);
      fmt::print(stderr, "cemfrac: interrupted at step {}; continue with --resume {}\n", r.step,
                 f->o.resume.empty() ? f->o.out : f->o.resume);
      return kExitInterrupted;
    }
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

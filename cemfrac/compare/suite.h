// A comparison suite (`cemfrac compare --suite FILE`, configs/suites/*.toml): the runs to train,
// their budget, seeds and learning-rate grid, the eval sets, and the claims to test. The format is
// documented in docs/compare.md; every problem in a file is one cemfrac::Error naming file:line.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/compare/stats.h"  // ClaimTest
#include "cemfrac/core/fields.h"

namespace cemfrac {

// A run's task (suite files: task = "lm" | "gp").
enum class SuiteTask { kLm, kGp };
template <>
struct EnumNames<SuiteTask> {
  static constexpr std::array<std::pair<SuiteTask, const char*>, 2> kNames = {
      {{SuiteTask::kLm, "lm"}, {SuiteTask::kGp, "gp"}}};
};

// A GP run's model (model = "cem" | "llama": the baseline, mha + swiglu).
enum class GpModelKind { kCem, kLlama };
template <>
struct EnumNames<GpModelKind> {
  static constexpr std::array<std::pair<GpModelKind, const char*>, 2> kNames = {
      {{GpModelKind::kCem, "cem"}, {GpModelKind::kLlama, "llama"}}};
};

// An evaluation of a trained run with fields changed at test time (e.g. model.cem.steps=4).
struct SuiteVariant {
  std::string name;               // "T=4"
  std::vector<std::string> sets;  // passed to `cemfrac eval --set`
  int64_t cem_steps = 0;  // > 0 when the variant only sets the CEM steps T (steps plots; GP: all)
};

// The settings of a GP run (task = "gp": the GP in-context regression task of docs/gp.md, one
// model trained and evaluated by `cemfrac gp --one`).
struct SuiteGpRun {
  GpModelKind model = GpModelKind::kCem;
  std::string variant = "fixed";  // CEM reading of the recursion (apply_gp_variant's names)
  std::string variant_at;         // file:line of the variant
  int64_t T = 1;                  // CEM steps at training
  int64_t steps = 0;              // optimizer steps of each final run
  int64_t layers = 0;             // blocks L ([gp].layers unless the run names its own)
  std::string ffn;                // "" = the model's own FFN, "none" = attention-only ([gp].ffn)
};

// [gp]: what every GP run of the suite shares.
struct SuiteGp {
  int64_t steps = 0;         // final runs' optimizer steps (a run may set its own)
  int64_t search_steps = 0;  // steps of each learning-rate grid run (needed by a grid)
  int64_t batch = 16;        // fresh sequences per step
  int64_t layers = 2;
  std::string positions = "none";
  std::string ffn;           // "" = each model's own FFN (cem_mlp, swiglu); "none": attention-only
  int64_t val_seqs = 256;    // the validation set (chooses the learning rate)
  int64_t test_seqs = 1024;  // the test set (the claims)
  uint64_t eval_seed = 1;    // both sets, the same for every seed of every run
  int64_t threads = 1;       // threads of each GP job (its 128-wide matrices: docs/gp.md)
};

struct SuiteRun {
  std::string name;
  SuiteTask task = SuiteTask::kLm;  // lm: a language model (cemfrac train); gp: docs/gp.md
  SuiteGpRun gp;                  // task = "gp" only
  std::string config;             // LM: run config TOML path (relative to the working directory)
  std::vector<std::string> sets;  // the suite's `set`, then the run's own
  int64_t tokens = 0;             // final training budget (the suite's unless the run names one)
  std::vector<uint64_t> seeds;    // the suite's unless the run names its own
  std::vector<double> lr;         // the learning-rate grid (the suite's unless the run names one)
  std::string lr_from;            // take the learning rate another run chose ("" = choose own)
  std::vector<SuiteVariant> variants;  // test-time variants evaluated on every final run
};

// A fine-tuning of every final LM run ([[finetune]]): `cemfrac finetune` of the trained checkpoint
// on `task`, once per fine-tuning seed, in <final run>/ft-<name>/seed-<k>/ (docs/compare.md,
// "Downstream jobs"). Chained after the run's training and evaluations, while its checkpoint exists.
struct SuiteFinetune {
  std::string name;                   // folders ft-<name>/, claim metric finetune_error:<name>
  std::string task;                   // finetune_task_names() (tasks/glue.h)
  std::string data;                   // the task's folder (GLUE's, a TSV's); "" for brown-genre
  std::vector<uint64_t> seeds = {1};  // fine-tuning seeds (head initialisation, data order)
  double lr = 1e-4;
  double epochs = 1;
  int64_t batch = 16;
  int64_t max_len = 0;  // tokens per example; 0 = the model's context
};

// A claim: every run of `a` against `b` on `metric` (lower is better), paired over common seeds.
struct SuiteClaim {
  std::string id;
  std::string text;
  std::string source;
  std::vector<std::string> a;  // "run" or "run@variant"
  std::string b;
  ClaimTest test = ClaimTest::kBetter;  // better: a < b; not_worse: a < b + margin
  double margin = 0;            // nats per token (not_worse)
  // LM rows: test_loss, val_loss, text_loss:<name>, or the downstream error rates (1 - accuracy)
  // task_error:<task>, task_error_norm:<task> (acc_norm) and finetune_error:<finetune> (on its
  // evaluation set "test", else its first; the mean over the fine-tuning seeds); GP rows: test_rmse (against the posterior
  // mean, the default for them), val_rmse, test_rmse_targets.
  std::string metric = "test_loss";
};

struct Suite {
  std::string path;  // the file
  std::string name;
  std::string description;
  std::string data = "data/brown";  // prepared dataset (training, validation, the test split)
  std::string eval_split = "test";
  std::vector<std::string> eval_text;  // extra text files evaluated on every final run
  std::vector<std::string> tasks;      // zero-shot tasks (`eval --task`) on every final LM run
  std::vector<SuiteFinetune> finetunes;  // fine-tunings of every final LM run
  int64_t lr_search_tokens = 0;        // budget of each learning-rate grid run
  double lr_min_ratio = 0.1;           // lr_min = ratio * lr_max
  int64_t val_points = 8;              // validation evaluations per final run (the loss curve)
  SuiteGp gp;
  std::vector<SuiteRun> runs;
  std::vector<SuiteClaim> claims;

  const SuiteRun& run(const std::string& name) const;
  bool has_task(SuiteTask task) const;
};

// Reads and checks a suite file. Run configs and --set texts are checked by load_run_config, so a
// bad override fails here, before anything trains.
Suite load_suite(const std::string& path);

// "run@variant" -> {"run", "variant"}; "run" -> {"run", ""}.
// A zero-shot task's name in folders and metrics: a built-in's name, a task file's stem.
std::string task_key(const std::string& task);
// A downstream metric's kind and name: "task_error:brown-mc" -> {"task_error", "brown-mc"};
// {"", ""} for any other metric.
std::pair<std::string, std::string> downstream_metric(const std::string& metric);

std::pair<std::string, std::string> split_row(const std::string& row);

}  // namespace cemfrac

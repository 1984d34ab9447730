// A suite's plan: the jobs of its trainings (LM runs: `cemfrac train` with the budget's overrides;
// GP runs: `cemfrac gp --one`), each in its own folder whose compare-run.json records its settings
// (a finished job is reused, an interrupted training resumed, a folder made with other settings
// refused), and the learning rate each run gets from its grid.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/compare/runner.h"
#include "cemfrac/compare/suite.h"
#include "cemfrac/train/run_config.h"

namespace cemfrac {

// ---- LM trainings

struct TrainSpec {
  std::string label;
  std::string config;
  std::vector<std::string> sets;  // the run's, then the budget's
  std::string dir;
  int64_t tokens = 0;  // rounded up to whole steps
  int64_t steps = 0;
};

// Tokens of one optimizer step of `c` (train.tokens_per_step, else micro-batch x sequence).
int64_t tokens_per_step(const RunConfig& c);

// The budget overrides of one training: steps for `tokens`, warm-up 10%, lr and seed, validation
// `val_points` times, checkpoints for resuming; `data` when the config names another dataset.
// The resulting config is checked now.
TrainSpec make_train(const SuiteRun& run, const std::string& data, const std::string& label,
                     const std::string& dir, int64_t tokens, double lr, double lr_min_ratio,
                     uint64_t seed, int64_t val_points, const std::vector<std::string>& extra = {});

// What a training run's compare-run.json records: a folder with other settings is another run.
nlohmann::json train_settings(const TrainSpec& t);

// The job that brings `t` to completion, or nullopt when it is complete (or diverged) already.
// A directory trained with other settings, or not made by compare, is refused.
std::optional<Job> train_job(const TrainSpec& t, double est_s_per_token);

// ---- GP runs (task = "gp"): one child `cemfrac gp --one` each, which trains, evaluates and prints
// its result as one JSON object, kept as <dir>/gp-run.json when the job succeeds. An interrupted
// one resumes from the checkpoint its child keeps in <dir>/checkpoints.

struct GpSpec {
  std::string label;
  std::string dir;
  std::vector<std::string> args;  // after `cemfrac --threads K`
  int64_t steps = 0;
};

// `steps` optimizer steps at `lr` from `seed`; the validation set of val_seqs sequences; with
// `test`, the test set at the trained T and at each test-time T.
GpSpec make_gp(const Suite& suite, const SuiteRun& run, const std::string& label,
               const std::string& dir, int64_t steps, double lr, uint64_t seed, int64_t val_seqs,
               bool test);

// What a GP run's compare-run.json records (its `cemfrac gp --one` arguments).
nlohmann::json gp_settings(const GpSpec& spec);

// The job that produces <dir>/gp-run.json, or nullopt when it exists (a finished run, completed or
// diverged). A directory made with other settings is refused.
std::optional<Job> gp_job(const GpSpec& spec, const SuiteGp& g, double est_s);

// ---- downstream jobs of a trained LM run (suite.h: [suite].tasks, [[finetune]])

// `cemfrac eval --task` of the run in `dir`, its JSON kept as task_eval_path; nullopt when kept
// already.
std::optional<Job> task_job(const std::string& dir, const std::string& task,
                            const std::string& label, double est_s);

// The job that brings fine-tuning `f` of the run in `dir` at `seed` to its finetune.json: fresh
// (a folder without a checkpoint is cleared first) or resumed from its checkpoint; nullopt when
// finetune.json exists. Fine-tunings with other settings in ft-<name>/ are refused.
std::optional<Job> finetune_job(const std::string& dir, const SuiteFinetune& f, uint64_t seed,
                                const std::string& label, double est_s);

// ---- folders

// Refuses `dir` when it was made with other settings than `settings` (its compare-run.json), or
// not by cemfrac compare at all.
void check_settings(const std::string& dir, const nlohmann::json& settings);

// A plan's timing folder is disposable: one timed with other settings than the suite now gives
// (a learning-rate grid whose first value changed, say) is removed, to be timed again, where a
// result folder with other settings is refused (check_settings). Returns whether it was removed.
bool drop_stale_timing(const std::string& dir, const nlohmann::json& settings);

// What makes one machine's timed steps say nothing about another's: the CPU (vendor, model name,
// how many flags it shows), its hardware threads and the BLAS core this process runs.
std::string machine_key();

// The plan's timed steps are reused only on the machine that took them: OUT/plan/machine.txt
// records it (machine_key), and timings from another machine, or from before the record existed,
// are deleted (they are the suite's own 3-step runs) so the plan times them again. Returns the
// line to print, "" when nothing was deleted.
std::string discard_other_machines_timings(const std::string& out, const std::string& here);

// ---- the plan of each run

struct RunPlan {
  const SuiteRun* run = nullptr;
  bool gp = false;        // task = "gp"
  double s_per_step = 0;  // GP: measured seconds per optimizer step (at [gp].threads)
  int64_t params = 0;
  int64_t per_step = 0;
  double s_per_token = 0;  // measured, at the planned threads
  double lr = 0;           // chosen (0 until known)
  // lr text -> final validation loss (GP: validation RMSE); nullopt: diverged.
  std::map<std::string, std::optional<double>> lr_search;
};

// The folder of a run's learning-rate grid value and of its final run at `seed`.
std::string lr_dir(const std::string& out, const SuiteRun& run, double lr);
std::string final_dir(const std::string& out, const SuiteRun& run, uint64_t seed);

// Whether the job in `dir` is finished for good (trained or diverged; GP: its gp-run.json).
bool run_finished(const RunPlan& p, const std::string& dir);

// Whether the run searches its learning rate on a grid; false for lr_from (set by
// choose_learning_rates) and for a single value, which it sets here.
bool searches_lr(RunPlan& p);

// Step 2's choice, from the grid folders under `out`: each run with a grid gets the learning rate
// of the lowest final validation loss (GP: validation RMSE against the posterior mean) among the
// values that completed, ties to the first; diverged values count as such. A grid not finished
// yet (a partial report) leaves lr = 0; one where every value diverged is an error. Then every
// run with lr_from takes its source's rate. A run with one learning rate gets it.
void choose_learning_rates(std::vector<RunPlan>& plans, const std::string& out);

}  // namespace cemfrac

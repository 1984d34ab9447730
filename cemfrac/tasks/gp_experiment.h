// The GP in-context regression experiment (CEM spec §5.3; docs/gp.md): train CEM
// models at each T (and a Llama baseline) on fresh GP batches with an MSE loss, evaluate them on
// one fixed held-out set against the noisy targets and against the exact posterior mean (the
// oracle), and evaluate the model trained at one T (2 by default) at every other T (test-time
// scaling).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/model/model_config.h"
#include "cemfrac/tasks/gp_data.h"
#include "cemfrac/tasks/gp_model.h"

namespace cemfrac {

struct GpTrainOptions {
  int64_t steps = 500;   // optimizer steps; each draws a fresh batch
  int64_t batch = 16;    // sequences per step
  double lr_max = 2e-3;  // linear warmup, cosine decay to lr_min (train/schedule.h)
  double lr_min = 2e-4;
  int64_t warmup_steps = 25;
  double weight_decay = 0.1;  // AdamW, decay group only (matrices)
  double clip = 1.0;          // global gradient-norm clip
  uint64_t data_seed = 1;     // the stream of training batches (the same for every model)
  bool progress = false;      // a progress line on stderr
  std::string label = "gp";   // prefix of the progress line
  // On a non-finite loss or gradient norm: throw cemfrac::Error (true), or stop and report the run
  // as diverged (false; a learning-rate grid treats a diverged value as a result, not a failure).
  bool throw_on_nonfinite = true;
  // Resumable training (`cemfrac gp --one --checkpoint-dir`, the GP jobs of `cemfrac compare`).
  // GP training runs through the project's Trainer (train/trainer.h, GP data and the MSE loss).
  // With checkpoint_run_dir set, it is a run directory of the trainer's: the whole training state
  // (parameters, AdamW moments, the data stream's generator, the step, the recent losses) is saved
  // to <checkpoint_run_dir>/checkpoints/step-N (the newest kept) every checkpoint_every steps and
  // after the last step, beside metrics.jsonl and summary.json, and a training that finds a
  // complete checkpoint there resumes from it: the result is bit for bit that of an uninterrupted
  // run. The settings (train.* and the task's fields and data seed) must equal the saved run's and
  // the model config its config.json, else one error line names the difference. Without it the
  // training runs in memory and writes nothing.
  std::string checkpoint_run_dir;
  int64_t checkpoint_every = 0;  // 0: every max(1, steps / 20) steps
  // With checkpoints: SIGINT/SIGTERM during training save a checkpoint after the current step and
  // stop (GpTrainResult::interrupted); a second signal gets the default action.
  bool stop_on_signal = false;
  // > 0 (with checkpoints): stop after this step as a signal would (tests).
  int64_t stop_at_step = 0;
};

struct GpTrainResult {
  int64_t steps = 0;
  double last_loss = 0;          // mean training MSE over the last min(50, steps) steps (NaN
                                 // when interrupted or diverged)
  double seconds = 0;            // wall time of the training loop, across resumes
  bool diverged = false;         // only with throw_on_nonfinite = false
  int64_t diverged_at_step = 0;  // 1-based step whose loss or gradient norm was not finite
  int64_t resumed_from = 0;      // step of the checkpoint training resumed from (0: a fresh start)
  bool interrupted = false;      // stopped by a signal after saving a checkpoint at `steps`
  std::string checkpoint;        // the last checkpoint written or resumed from ("" without)
};

// Trains `model` in place. On a non-finite loss or gradient norm throws cemfrac::Error, or (with
// throw_on_nonfinite = false) stops before that step's update and returns diverged = true.
GpTrainResult train_gp_model(GpModel& model, const GpTaskOptions& task,
                             const GpTrainOptions& options);

struct GpEvalResult {
  double rmse_targets = 0;    // model vs the noisy targets y_{n+1}
  double rmse_posterior = 0;  // model vs the oracle's posterior mean
  double rmse_oracle = 0;     // oracle vs the noisy targets (the floor of rmse_targets)
  // Standard errors over sequences (delta method from the per-sequence MSEs).
  double se_targets = 0, se_posterior = 0, se_oracle = 0;
  double seconds = 0;
};

// RMSE over every position of every sequence of `heldout` (which must carry posterior_mean), in
// chunks of `chunk` sequences, without gradients.
GpEvalResult evaluate_gp_model(GpModel& model, const GpBatch& heldout, int64_t chunk = 256);

// The streams drawn from one seed, in this order (core/random.h SplitMix64): the init of every
// model, the training batches, the held-out (test) set, the validation set. The validation stream
// was added after the others, so the first three are those of every earlier run.
struct GpSeeds {
  uint64_t init = 0, train = 0, test = 0, val = 0;
};
GpSeeds gp_seeds(uint64_t seed);

struct GpExperimentOptions {
  GpTaskOptions task;
  GpTrainOptions train;   // data_seed and label are set per run
  ModelConfig cem_model;  // the CEM model (mixer cem_attention, ffn cem_mlp); steps set per run
  ModelConfig baseline;   // the baseline model (mha + swiglu)
  std::vector<int64_t> steps = {1, 2, 4, 8};  // T: one CEM model trained and tested at each
  // CEM readings of the recursion, each trained at every T (apply_gp_variant): "fixed" (the default
  // model), or '+'-joined options among iterate, prox, prox_fixed, step_norm, linear.
  std::vector<std::string> variants = {"fixed"};
  int64_t scale_from = 2;  // T of the model also evaluated at every T in `steps` (0: none)
  bool run_baseline = true;
  int64_t eval_seqs = 1024;  // held-out sequences
  // Validation sequences (0: none), from their own stream (GpSeeds::val), disjoint in draws from
  // the held-out (test) set: choose a learning rate on them, never on the held-out set.
  int64_t val_seqs = 0;
  uint64_t seed = 1;  // -> model init, training stream and held-out set (core/random.h)
  // Where the models live. The task's sequences are drawn on the CPU generators whatever the
  // device (the same data on every device) and moved to the model's device per batch.
  torch::Device device = torch::kCPU;
};

// Defaults of the experiment: the spec's D = 128, H = 4, M = 512, L = 2, positions none, N = 64.
GpExperimentOptions default_gp_experiment();

// Sets the cem fields of `config` for a variant name of GpExperimentOptions::variants:
//   fixed       nothing (keys from h, no proximal term, no step_norm)
//   iterate     cem.recursion_keys = "iterate"
//   prox        cem.prox = "learned";  prox_fixed: cem.prox = "fixed"
//   step_norm   cem.step_norm = "rms"
//   linear      cem.attention = "linear" (the linear-attention control)
// joined with '+' (e.g. "iterate+prox"). Throws cemfrac::Error naming an unknown part.
void apply_gp_variant(ModelConfig& config, const std::string& variant);

// The k of the last progress line "<label>: step k/N | ..." that GP training prints to stderr
// (without a terminal: every tenth of its steps and at its last), 0 when `log` holds none. A line
// "<label>: resumed from DIR (step k/N)" is not a progress line. `cemfrac compare` follows its
// GP jobs with it.
int64_t last_logged_step(const std::string& log);

struct GpRow {
  std::string model;    // "cem", "llama" (the baseline) or "oracle"
  std::string variant;  // CEM rows: the variant name ("fixed" by default); empty otherwise
  int64_t train_T = 0;  // T the model was trained at (0: not a CEM model)
  int64_t eval_T = 0;   // T it was evaluated at
  GpEvalResult eval;
  std::optional<GpEvalResult> val;  // on the validation set (val_seqs > 0), at eval_T
  int64_t params = 0;
  double train_s = 0;  // wall time of the training (0 for test-time rows and the oracle)
  double last_train_loss = 0;
};

struct GpExperimentResult {
  std::vector<GpRow> rows;  // CEM at each T, the test-time rows, the baseline, the oracle (last)
  int64_t train_steps = 0, batch = 0, eval_seqs = 0, n_points = 0;
  int64_t val_seqs = 0;
  uint64_t seed = 0;
  double seconds = 0;  // the whole experiment
};

GpExperimentResult run_gp_experiment(const GpExperimentOptions& options);

nlohmann::json to_json(const GpExperimentResult& result);
// Reads what to_json wrote (for re-drawing the plot of a finished run). Throws cemfrac::Error
// naming `source` when a key is missing or has the wrong type.
GpExperimentResult gp_result_from_json(const nlohmann::json& j, const std::string& source);
// A self-contained SVG (cemfrac/io/plot.h, two panels): RMSE against the posterior mean versus T
// (log axis, a tick at every T): CEM trained at T, the scale_from model evaluated at T, the
// baseline as a horizontal line; and the same against the noisy targets with the oracle floor.
std::string gp_rmse_svg(const GpExperimentResult& result);

// One model of the task, trained and evaluated on its own (`cemfrac gp --one`, the GP job of
// `cemfrac compare`, docs/compare.md): train `model` for train.steps, then RMSE on the validation
// set (at the trained T) and on the test set at the trained T and at every `eval_steps` T (the
// same weights, gp_model_with_steps).
struct GpRunOptions {
  GpTaskOptions task;
  GpTrainOptions train;             // data_seed is set from `seed`
  ModelConfig model;                // as trained (cem.steps = the trained T of a CEM model)
  std::vector<int64_t> eval_steps;  // CEM only: further T at test time
  int64_t val_seqs = 256;           // 0: no validation
  int64_t test_seqs = 1024;         // 0: no test (a learning-rate grid run)
  uint64_t seed = 1;       // the init and the training stream: gp_seeds(seed).init / .train
  uint64_t eval_seed = 1;  // the validation and test sets: gp_seeds(eval_seed).val / .test
  // Resumable training: see GpTrainOptions::checkpoint_run_dir.
  std::string checkpoint_run_dir;
  torch::Device device = torch::kCPU;  // as GpExperimentOptions::device
};

struct GpRunResult {
  std::string status = "completed";  // or "diverged" (nothing evaluated)
  int64_t params = 0;
  GpTrainResult train;
  std::optional<GpEvalResult> val;          // at the trained T
  std::optional<GpEvalResult> test;         // at the trained T
  std::map<int64_t, GpEvalResult> test_at;  // eval T -> test RMSE with the same weights
  double oracle_test_rmse = 0;              // the posterior mean against the noisy test targets
};

// Throws TrainingInterrupted (train/trainer.h) when the training was interrupted by a signal (its
// checkpoint saved).
GpRunResult run_gp_single(const GpRunOptions& options);
nlohmann::json to_json(const GpRunResult& result, const GpRunOptions& options);

}  // namespace cemfrac

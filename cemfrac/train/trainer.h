// The training loop: gradient accumulation, clipping, AdamW groups, the cosine schedule,
// validation, metrics (<run>/metrics.jsonl), progress on stderr, checkpoints (train/checkpoint.h),
// the NaN/Inf guard, SIGINT/SIGTERM and exact resume. Generic over the model and the data: it sees
// a TrainModel (any torch::nn::Module with a forward function and a parameter table) and a
// TrainingData with a loss (train/training_data.h: LM token shards with cross-entropy, the GP
// task's batches with MSE, ...). For an LmModel on a prepared dataset:
//
//   seed_everything(run.train.seed);             // deterministic init
//   TrainModel tm = make_train_model(LmModel(run.model));
//   TrainerOptions opt;  opt.train = run.train;  opt.data_dir = run.data.path;
//   opt.tokenizer = tokenizer.get();  opt.resume = resume_arg;      // "" for a fresh run
//   TrainResult r = Trainer(std::move(tm), opt).run();               // throws TrainingDiverged
//
// Another source: opt.data = std::make_shared<MyData>(...); opt.loss = mse_loss();
//
// Determinism: a fresh run seeds torch with train.seed at the start of run(); the data order comes
// from the data's own cursor (LM: the loader's PRNG seeded with train.seed). Resuming restores
// parameters, AdamW state, the torch RNG, the data cursor and the step, so every later step's loss
// equals the uninterrupted run's bit for bit at the same thread count.
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"  // ParamInfo
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/run_config.h"  // TrainConfig
#include "cemfrac/train/run_dir.h"     // RunStatus
#include "cemfrac/train/schedule.h"
#include "cemfrac/train/training_data.h"

namespace cemfrac {

class DataParallel;  // dist/data_parallel.h

// What the trainer needs of a model.
struct TrainModel {
  std::shared_ptr<torch::nn::Module> module;  // named_parameters() keys are the ParamInfo names
  // TrainBatch::inputs -> the output the loss takes (LmModel: (B, N) int64 -> (B, N, V) logits).
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<ParamInfo> params;  // one entry per distinct tensor; also the checkpoint keys
  nlohmann::json config;          // the architecture, saved as config.json
  int64_t context = 0;            // longest sequence the model takes (train.seq_len = 0 uses it)
  int64_t vocab_size = 0;         // V; the shards' vocabulary must not exceed it (0 = unchecked)
  // Where the batches go (the module's device). Only the CPU generator's state is checkpointed so
  // far; a CUDA run resumes exactly only while it samples nothing on the GPU (no dropout yet).
  torch::Device device = torch::kCPU;
  // Non-parameter state saved in checkpoints (TaggedModule::add_state_buffer), by full name; the
  // tensors are the module's own (restored in place on resume).
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
};

// The TrainModel of an LmModel (it shares the module): forward = the logits, params =
// parameter_table(), config = to_json(config()), context and vocab_size from the config, buffers =
// state_buffers().
//
// Dyadic schedule (train.dyadic, CoFrGeNet spec §4): a parameter with ParamInfo::depth = i >= 1
// starts in the optimizer's frozen group (no update, no decay, no state) and joins its own group
// right before 0-based step dyadic_start(i, train.steps) runs. Before every step the trainer also
// tells each TaggedModule where the run is (TaggedModule::on_train_step). Both depend only on the
// step, so a resumed run makes the same changes at the same steps.
TrainModel make_train_model(LmModel model);

// One line of metrics.jsonl (keys: step, tokens, loss, val_loss, lr, grad_norm, tokens_per_s,
// elapsed_s; val_loss is null when the step did not evaluate).
struct StepMetrics {
  int64_t step = 0;    // optimizer steps completed, 1-based
  int64_t tokens = 0;  // training tokens consumed so far (all ranks)
  double loss = 0;     // mean training loss of the step's tokens (nats)
  std::optional<double> val_loss;
  double lr = 0;         // lr used by this step
  double grad_norm = 0;  // global norm before clipping
  double tokens_per_s = 0;
  double elapsed_s = 0;  // training wall time so far, across resumes
};
nlohmann::json to_json(const StepMetrics& m);

class Trainer;

struct TrainerOptions {
  TrainConfig train;
  // What to train on. Null: token shards (TokenData, train/token_data.h) from the three fields
  // below, with the cross-entropy loss.
  std::shared_ptr<TrainingData> data;
  LossFn loss;           // empty: cross_entropy_loss()
  std::string data_dir;  // prepared dataset: train.bin and val.bin (docs/formats.md)
  const Tokenizer* tokenizer = nullptr;  // saved into every checkpoint when given; the shards'
                                         // headers must name it (open_token_shard)
  bool verify_data = true;  // full scan of train.bin and val.bin before step 1 (CRC, every id)
  std::string resume;       // "" = fresh run; a run directory (newest checkpoint) or a checkpoint
  int64_t rank = 0;         // set from `dist` when given; rank 0 writes files
  int64_t world_size = 1;
  // Data parallel (dist/data_parallel.h): null or world 1 = one process. Each rank reads its block
  // of every global batch of world x micro_batch x accumulation windows (train.tokens_per_step is
  // the global batch); gradients are averaged over ranks before clipping.
  DataParallel* dist = nullptr;
  bool handle_signals = true;  // SIGINT/SIGTERM: finish the step, checkpoint, return kInterrupted
  bool progress = true;        // progress line on stderr
  std::string label;           // prefix of the progress line ("<label>: step k/N | ..."), or none
  // false: train in memory, writing nothing (no run directory, checkpoints, metrics or summary;
  // train.out is ignored, resume and signal stops are not available).
  bool write_files = true;
  // With write_files, rank 0 holds the run directory's lock (core/dir_lock.h) from the
  // constructor on, until the Trainer is destroyed: a second writer (a fresh run into the same
  // train.out, or --resume of a live run) is refused with one line naming this process. The
  // command the lock file names as the holder:
  std::string lock_command = "train";
  // The setting or flag that names train.out, as messages about the run directory name it.
  std::string out_key = "train.out";
  // A fresh run's train.out must be new or empty (train/run_dir.h). Off only where the folder is
  // another command's working folder rather than a run directory: the GP task's --checkpoint-dir,
  // which is `cemfrac compare`'s job folder (its log, its capture's temporary file).
  bool require_new_dir = true;
  // Stop after this many completed steps (0 = train.steps), writing a checkpoint as on a signal;
  // the schedule still spans train.steps. For time-boxed runs and resume tests.
  int64_t stop_at_step = 0;
  // Called after every step (and after its checkpoint, if one was due). The hook for step-dependent
  // changes such as unfreezing a parameter (trainer.optimizer().unfreeze(name, group)): a change
  // made at step t applies from step t + 1 on.
  std::function<void(Trainer&, const StepMetrics&)> on_step;
};

// options.rank and options.world_size from options.dist (when given); the trainer's constructor
// calls it.
void set_data_parallel_layout(TrainerOptions& options);

enum class TrainStatus { kCompleted, kInterrupted, kStopped };
const char* to_string(TrainStatus status);

struct TrainResult {
  TrainStatus status = TrainStatus::kCompleted;
  int64_t step = 0;
  int64_t tokens = 0;
  double last_loss = 0;
  std::optional<double> last_val_loss;
  std::optional<double> best_val_loss;
  // Mean training loss of the last min(kRecentLosses, step) steps, in step order (0 before a step).
  double recent_loss = 0;
  std::string last_checkpoint;  // "" when none was written
  double elapsed_s = 0;
};

// A non-finite loss or gradient norm. what() is the one-line report (step, lr, batch position, the
// last good checkpoint); nothing was saved for the failing step, which is step() (1-based).
class TrainingDiverged : public Error {
 public:
  TrainingDiverged(const std::string& report, int64_t step) : Error(report), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_ = 0;
};

// A training stopped by SIGINT/SIGTERM after saving its checkpoint, for callers that report it as
// an exception (the GP task); the CLI prints what() as a plain line and exits kExitInterrupted (3),
// as `train` does. Trainer::run() itself returns TrainStatus::kInterrupted.
class TrainingInterrupted : public Error {
 public:
  using Error::Error;
};

class Trainer {
 public:
  // Opens the data, takes the run directory's lock (write_files), builds the optimizer and, with
  // options.resume, loads the checkpoint (its config.json must equal model.config). Throws
  // cemfrac::Error for bad settings or files, or when another process writes the run.
  Trainer(TrainModel model, TrainerOptions options);
  ~Trainer();

  // Trains up to train.steps (or stop_at_step). Writes metrics.jsonl, checkpoints and summary.json
  // under train.out. Throws TrainingDiverged on a non-finite loss or gradient norm.
  TrainResult run();

  // Mean validation loss per target over the data's validation batches (LM: nats per token over
  // the first eval_tokens of val.bin), nullopt when the data has none. Data parallel: batch k is
  // computed by rank k mod world, and the per-batch float64 sums are summed in batch order on
  // every rank, so the value equals the 1-rank value bit for bit (same thread count).
  std::optional<double> evaluate();

  Optimizer& optimizer() { return *optimizer_; }
  const TrainModel& model() const { return model_; }
  TrainingData& data() { return *data_; }
  int64_t step() const { return state_.step; }
  double elapsed_s() const { return state_.elapsed_s; }  // training wall time, across resumes
  int64_t seq_len() const { return seq_len_; }
  int64_t accumulation_steps() const { return accum_; }
  const std::string& run_dir() const { return options_.train.out; }

  // Asks run() to stop after the current step with a checkpoint (what SIGINT/SIGTERM do).
  static void request_stop();

 private:
  double train_step(double* grad_norm);  // returns the step's mean loss
  void begin_step(int64_t step);         // dyadic unfreezing and on_train_step, before step `step`
  TrainResult run_loop();                // run() after the run directory is set up
  // The constructor's parts: the step's sizes (seq_len_, accum_, tokens_per_step_), the batch
  // source, the optimizer (with the dyadic schedule's frozen depths), and the resume from
  // options_.resume (locks the run's own directory, loads every tensor and the state).
  void size_steps();
  void open_data();
  void make_optimizer();
  void resume_from_checkpoint();
  // run_loop's parts: a non-finite step (summary "diverged", then TrainingDiverged); a good step
  // into the state; the validation of step m; the progress line; the result of the loop.
  [[noreturn]] void stop_diverged(double loss, double grad_norm, double lr, double elapsed_s);
  void record_step(double loss, double lr);
  void validate(StepMetrics& m);
  void print_step(const StepMetrics& m, double per_step_s, bool tty) const;
  TrainResult result(TrainStatus status) const;
  nlohmann::json run_settings() const;   // TrainerState::run of this run's settings
  // Resume: refuses a changed setting that exact resume depends on, warns about a safe change.
  void check_resume_settings(const std::string& source);
  void lock_run_dir();  // takes lock_ (rank 0 with write_files) on train.out
  std::string write_checkpoint();
  void write_summary(const std::string& status, const std::string& report);
  void append_metrics(const StepMetrics& m);
  // Data parallel (trainer_dist.cpp): a no-op in one process.
  bool distributed() const;
  void start_data_parallel();  // config hash check, parameters from rank 0
  // Gradients and loss over ranks; sets stop_agreed_.
  double reduce_step(double loss_sum, bool stop);
  bool stop_requested() const;  // the signal flag, agreed by all ranks
  bool stop_agreed_ = false;
  // train.shard_optimizer (trainer_dist.cpp): the parameters each rank owns, by rank, in table
  // order. After each step every owner broadcasts what it updated; a checkpoint gathers the whole
  // AdamW state on rank 0.
  std::vector<std::vector<std::string>> shards_;
  bool gradients_sharded_ = false;  // train.shard_gradients: only owned gradients after reduction
  double clip_gradients();          // clip_grad_norm, over every rank's share when sharded
  void broadcast_updated_parameters();
  TensorMap optimizer_state_to_save();

  TrainModel model_;
  TrainerOptions options_;
  DirLock lock_;  // the run directory's, while this Trainer may write into it
  // The directory's status before this Trainer took it (run_status: "died" for a writer killed
  // outright, "interrupted", ...; "" for a new directory): summary.json records it as
  // "previous_status" and a died one is named in a warning.
  RunStatus previous_status_ = RunStatus::kNone;
  int64_t seq_len_ = 0;
  int64_t accum_ = 1;
  bool bf16_ = false;            // train.precision = "bf16": the forward under autocast
  int64_t tokens_per_step_ = 0;  // all ranks
  CosineSchedule schedule_;
  std::shared_ptr<TrainingData> data_;
  LossFn loss_;
  std::unique_ptr<Optimizer> optimizer_;
  TrainerState state_;
  std::string last_checkpoint_;
  nlohmann::json step_position_;  // data cursor at the start of the current step (for reports)
  struct Pending {                // a ladder-depth parameter waiting for its dyadic step
    std::string name;
    ParamGroup group;
    int64_t start;
  };
  std::vector<Pending> dyadic_;
};

// Seeds torch's generators (model init, dropout): call before constructing the model.
void seed_everything(uint64_t seed);

}  // namespace cemfrac

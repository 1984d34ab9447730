// What a Trainer trains on: a stream of micro-batches, a loss, and optionally a validation set.
// The trainer owns the loop (schedule, accumulation, clipping, AdamW, the NaN guard, signals,
// checkpoints, exact resume, metrics, summary.json, data parallel); a TrainingData says only where
// the examples come from. Three kinds plug in:
//   TokenData (train/token_data.h)    LM training on prepared token shards (cross-entropy)
//   GpData (tasks/gp_experiment.cpp)  the GP task's fresh synthetic batches (MSE)
//   fine-tuning data (later)          labelled examples through a classification head
//
// Determinism: next() depends only on the cursor, and state() / restore() save and reload it, so
// a resumed run reads the same examples as an uninterrupted one.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace cemfrac {

class Tokenizer;

struct TrainBatch {
  torch::Tensor inputs;   // what the model's forward takes (LM: (B, S) ids; GP: (B, S, 3))
  torch::Tensor targets;  // what the loss compares its output with (LM: (B, S) ids)
};

// The resolved shape of the stream, set by the trainer before the first batch.
struct DataLayout {
  int64_t micro_batch = 1;  // rows (sequences, examples) per micro-batch
  int64_t seq_len = 1;      // positions per row (the unit of the trainer's token count)
  uint64_t seed = 0;        // train.seed: the data order of a fresh run
  int64_t eval_tokens = 0;  // train.eval_tokens: validation positions (0 = the whole split)
};

class TrainingData {
 public:
  virtual ~TrainingData() = default;

  // Called once by the trainer, before anything else. Opens and checks the data; throws
  // cemfrac::Error naming the problem.
  virtual void open(const DataLayout& layout) = 0;

  // The next micro-batch of the global stream (CPU tensors; the trainer moves them).
  virtual TrainBatch next() = 0;
  // Moves past `rows` rows of the global stream without producing them (data parallel: the rows
  // the other ranks train on). A source that cannot skip throws for rows > 0.
  virtual void skip(int64_t rows) = 0;

  // The cursor of the next batch, saved in trainer.json ("loader"); restore() continues exactly
  // there and throws naming `source` for a cursor this data cannot have.
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& state, const std::string& source) = 0;
  // A cursor in words, for reports ("epoch 0 window 12").
  virtual std::string describe(const nlohmann::json& state) const = 0;

  // What identifies the data, as {"data <what>": value}: part of the run's settings, so a resume
  // on other data is refused like a changed train.* setting.
  virtual nlohmann::json settings() const = 0;

  // The validation set: batches 0..validation_batches()-1, the same every time (0: none, and the
  // trainer reports no validation loss).
  virtual int64_t validation_batches() const { return 0; }
  virtual TrainBatch validation_batch(int64_t k) const;

  // Saved into every checkpoint when not null (LM data: the shards' tokenizer).
  virtual const Tokenizer* tokenizer() const { return nullptr; }
  // Resume: refuses a checkpoint (its directory) that was trained on other data than this in a way
  // settings() cannot tell (LM data: the checkpoint's tokenizer must be the data's).
  virtual void check_checkpoint(const std::string& checkpoint_dir) const { (void)checkpoint_dir; }
};

// A loss of the model's output against the batch's targets: a scalar mean (Reduction::Mean, what
// training differentiates) or one value per target (Reduction::None, what validation sums in
// float64).
using LossFn = std::function<torch::Tensor(const torch::Tensor& output,
                                           const torch::Tensor& targets, int64_t reduction)>;

// Next-token cross-entropy: output (B, S, V) logits, targets (B, S) ids.
LossFn cross_entropy_loss();
// Mean squared error: output and targets of the same shape.
LossFn mse_loss();

}  // namespace cemfrac

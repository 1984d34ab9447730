// `cemfrac finetune`: a classification (or, for STS-B, regression) head on a pre-trained cemfrac
// checkpoint of any model kind, trained on labelled sentence (pair) data (tasks/glue.h) through the
// project's one Trainer: FinetuneData is its batch source and the loss is cross-entropy (MSE for
// regression), so every trainer guarantee holds (exact resume, the NaN stop, SIGINT/SIGTERM
// checkpoints, progress, metrics.jsonl, summary.json).
//
// Input of one example: the end-of-text id, text_a's tokens, and for pairs another end-of-text id
// and text_b's tokens, cut to max_len by dropping tokens from the end of the longer text; rows are
// padded on the right with the end-of-text id. Pooling: the final hidden state (after the final
// norm) at the last non-padding token, as GPT-style models are fine-tuned: in a causal model it is
// the only position that has read the whole input, and padding after it cannot reach it. Head:
// "cls.weight" (K, D) and "cls.bias" (K), K = classes (1 for regression), N(0, init_std) and 0.
//
// The fine-tuned checkpoint is an ordinary cemfrac checkpoint: config.json is the backbone's,
// model.safetensors holds the backbone's tensors under their usual names plus cls.weight and
// cls.bias, tokenizer/ is the pre-trained one. `cemfrac eval`, `generate` and Python's
// cemfrac.load load the backbone from it (model_loader.h sets the head's tensors aside), and
// `finetune --resume` continues it. The run directory also holds finetune.json: the task, its
// labels and the GLUE metrics of every evaluation set.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/tasks/glue.h"
#include "cemfrac/train/training_data.h"

namespace cemfrac {

// The final hidden states (B, N, D) of `model` for tokens (B, N): LmModel::forward without the
// head (its steps 1-3 up to the final norm). A test checks features x head == forward's logits on
// every model kind.
torch::Tensor lm_features(LmModel& model, const torch::Tensor& tokens);

// The pooled input of the head: for each row of `tokens` (B, S), the feature (B, S, D) at its last
// position whose token is not `pad` (the end-of-text id pads rows on the right; every row starts
// with one, so a row of only padding pools position 0). (B, D).
torch::Tensor pool_last_token(const torch::Tensor& features, const torch::Tensor& tokens,
                              TokenId pad);

// The head, registered on the backbone as "cls" so that the backbone's module holds every trained
// tensor under its checkpoint name.
class ClassifierHeadImpl : public TaggedModule {
 public:
  ClassifierHeadImpl(int64_t d_model, int64_t outputs, double init_std, torch::Device device);
  torch::Tensor forward(const torch::Tensor& pooled);  // (B, D) -> (B, K)
  torch::Tensor weight, bias;
};

// One encoded example: token ids (unpadded) and its target.
struct EncodedExample {
  std::vector<int64_t> tokens;
  int64_t label = 0;
  double score = 0;
};
std::vector<EncodedExample> encode_examples(const LabelledSet& set, const Tokenizer& tokenizer,
                                            int64_t max_len);

// The Trainer's batch source: epochs over the training examples, each epoch in the order of
// seeded_permutation(n, seed + epoch); rows are padded to seq_len (= max_len); targets are class
// indices (int64) or scores (float32). Validation: the first evaluation set, in order.
class FinetuneData : public TrainingData {
 public:
  FinetuneData(std::string task, bool regression, std::vector<EncodedExample> train,
               std::vector<EncodedExample> validation, const Tokenizer* tokenizer);
  void open(const DataLayout& layout) override;
  TrainBatch next() override;
  void skip(int64_t rows) override;
  nlohmann::json state() const override;  // {"epoch": e, "index": i}
  void restore(const nlohmann::json& state, const std::string& source) override;
  std::string describe(const nlohmann::json& state) const override;
  nlohmann::json settings() const override;
  int64_t validation_batches() const override;
  TrainBatch validation_batch(int64_t k) const override;
  const Tokenizer* tokenizer() const override { return tokenizer_; }

  // Rows [first, first + n) of `examples` as a batch padded to seq_len.
  TrainBatch batch_of(const std::vector<EncodedExample>& examples,
                      const std::vector<size_t>& rows) const;

 private:
  std::string task_;
  bool regression_ = false;
  std::vector<EncodedExample> train_, validation_;
  const Tokenizer* tokenizer_ = nullptr;
  DataLayout layout_;
  int64_t epoch_ = 0, index_ = 0;
  std::vector<size_t> order_;  // this epoch's permutation
  uint64_t fingerprint_ = 0;   // of the training examples' tokens and targets
  void start_epoch();
};

struct FinetuneOptions {
  std::string checkpoint;          // pre-trained checkpoint or run directory
  std::vector<std::string> sets;   // --set on the backbone (fields no shape depends on)
  std::string task;                // finetune_task_names()
  std::string data_dir;            // the task's folder ("" for brown-genre: the corpus cache)
  std::string out = "runs/finetune";
  std::string resume;              // "" = fresh; a fine-tuning run directory or checkpoint
  double lr = 1e-4;
  double epochs = 3;
  int64_t batch = 16;
  int64_t max_len = 0;  // tokens per example (0 = the model's context)
  uint64_t seed = 1234;
  double warmup = 0.1;  // fraction of the steps
  double weight_decay = 0.01;
  int64_t stop_at_step = 0;  // Trainer's stop_at_step (tests)
  bool progress = true;
  torch::Device device = torch::kCPU;  // where the backbone, the head and every batch compute
};

struct FinetuneResult {
  std::string status;  // "completed", "interrupted", "stopped"
  int64_t step = 0, steps = 0;
  std::string checkpoint;
  nlohmann::json report;  // what finetune.json holds
};

// Runs the fine-tuning and, unless interrupted, evaluates every evaluation set with the task's
// metrics and writes <out>/finetune.json. Throws cemfrac::Error (TrainingDiverged for NaN).
FinetuneResult run_finetune(const FinetuneOptions& options);

// Predictions of a classifier (backbone with its "cls" head) on encoded examples: class indices
// and, for regression, scores.
void predict(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
             const FinetuneData& data, const std::vector<EncodedExample>& examples,
             int64_t batch, bool regression, std::vector<int64_t>* classes,
             std::vector<double>* scores);

}  // namespace cemfrac

// Checkpoints (DESIGN.md §4). A checkpoint is a directory <run>/checkpoints/step-000123/ holding
//   model.safetensors      the parameters by name (one entry per distinct tensor: tied ones once)
//   optimizer.safetensors  AdamW moments and step per parameter name (train/optimizer.h)
//   trainer.json           format + version, step, tokens, RNG state, loader cursor, schedule,
//                          losses
//   config.json            the model architecture: the only source of truth when loading
//   tokenizer/             Tokenizer::save output (when the run has a tokenizer)
// The directory is filled under a temporary name beside it and renamed when complete
// (core/atomic_file.h), so a directory named step-N is always complete; older checkpoints are
// deleted only after the new one is in place.
#pragma once
#include <ATen/core/Generator.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/train/schedule.h"

namespace torch::nn {
class Module;
}

namespace cemfrac {

inline constexpr const char* kCheckpointFormat = "cemfrac-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCheckpointTrainerFile = "trainer.json";
inline constexpr const char* kCheckpointConfigFile = "config.json";
inline constexpr const char* kCheckpointTokenizerDir = "tokenizer";
// Non-parameter model state (TaggedModule::add_state_buffer, e.g. the CoFrGeNet ladders' recorded
// output ranges for eval-time clipping), by full name; written only when the model has such state.
inline constexpr const char* kCheckpointBuffersFile = "buffers.safetensors";

// trainer.json: everything besides tensors that resuming needs.
struct TrainerState {
  int64_t step = 0;        // optimizer steps completed
  int64_t tokens = 0;      // training tokens consumed (all ranks)
  uint64_t data_seed = 0;  // seed of the data order (the loader's permutation)
  // The training data's cursor of the next batch (TrainingData::state(): an object; LM data:
  // {"epoch", "index"} of the token loader, the same on every rank).
  nlohmann::json loader = nlohmann::json::object();
  std::string torch_rng;  // CPU generator state, base64 (dropout and other torch sampling)
  // Each visible GPU's default generator state, base64, by device index ([] without CUDA; absent
  // in older checkpoints). A run resumes exactly on the devices it saved from; elsewhere the
  // states of GPUs that are not there are ignored (nothing of the model's values depends on them).
  std::vector<std::string> cuda_rng;
  CosineSchedule schedule;  // the schedule the run follows (lr is a function of the step)
  double lr = 0;            // lr of the last step taken
  std::optional<double> last_loss;
  std::optional<double> last_val_loss;
  std::optional<double> best_val_loss;
  double elapsed_s = 0;  // training wall time so far, across resumes
  // The run's settings that exact resume depends on (Trainer: seq_len, micro_batch, seed, data,
  // ...) and the safe ones (steps, log_every, ...), as {"train.key": value}; {} in older
  // checkpoints.
  nlohmann::json run = nlohmann::json::object();
  int64_t world_size = 1;  // data-parallel ranks of the run (dist/data_parallel.h); 1 when absent
  // The training losses of the last kRecentLosses steps, oldest first ([] in older checkpoints):
  // TrainResult::recent_loss, the mean over them, survives a resume exactly.
  std::vector<double> recent_losses;
  // Binds the parts of one checkpoint: save_checkpoint derives it from the rest
  // of the state (a hash without the wall time: another run or step gets another id, a resumed
  // run the uninterrupted one's) and writes it here and into the metadata ("save_id") of every
  // safetensors file of the checkpoint; load_checkpoint refuses a part whose id differs. "" in
  // older checkpoints (then nothing is checked).
  std::string save_id;
};
inline constexpr int64_t kRecentLosses = 50;

nlohmann::json trainer_state_to_json(const TrainerState& state);
// Throws cemfrac::Error naming `source` for another format, another version or missing fields.
TrainerState trainer_state_from_json(const nlohmann::json& j, const std::string& source);

// The default CPU generator's state as base64, and back.
std::string torch_rng_state();
void set_torch_rng_state(const std::string& base64, const std::string& source);
// Every visible GPU's default generator state (empty without CUDA), and back (states of GPUs
// beyond the visible ones are ignored).
std::vector<std::string> cuda_rng_states();
void set_cuda_rng_states(const std::vector<std::string>& base64, const std::string& source);
// The same for any CPU generator (e.g. the GP task's data stream).
std::string generator_state(at::Generator& generator);
void set_generator_state(at::Generator& generator, const std::string& base64,
                         const std::string& source);

std::string base64_encode(const std::string& bytes);
// Throws cemfrac::Error for characters outside the base64 alphabet or a bad length.
std::string base64_decode(const std::string& text, const std::string& source);

// What save_checkpoint writes.
struct CheckpointContents {
  TensorMap model;
  TensorMap buffers;  // state buffers; buffers.safetensors is written when non-empty
  TensorMap optimizer;
  std::map<std::string, std::string> optimizer_metadata;
  TrainerState trainer;
  nlohmann::json config;
  const Tokenizer* tokenizer = nullptr;  // optional
};

// "step-000123".
std::string checkpoint_name(int64_t step);
// <run_dir>/checkpoints
std::string checkpoints_dir(const std::string& run_dir);

// Writes <run_dir>/checkpoints/step-NNNNNN atomically (with its save id, TrainerState::save_id,
// whatever contents.trainer.save_id says), then deletes all but the newest `keep` complete
// checkpoints (keep <= 0 keeps all) and every incomplete step-N older than the oldest one kept
// (what a deletion cut short by a kill leaves). Each is renamed to a temporary name before it is
// removed, so a kill during the removal leaves a temporary that clean_stale_temporaries removes,
// never a half-deleted step-N. Returns the checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, const CheckpointContents& contents,
                            int64_t keep);

// Complete checkpoints of a run (directories named step-N, temporaries ignored), by step, oldest
// first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

// "" when `dir` holds a complete checkpoint (trainer.json, config.json, model.safetensors and
// optimizer.safetensors present and non-empty, trainer.json readable), else why not ("empty
// directory", "model.safetensors is missing", ...). Tensor contents are checked on load.
std::string checkpoint_problem(const std::string& dir);

// Removes <run_dir>/checkpoints/step-*.tmp-* left by saves that were killed (whose process is gone)
// and returns their paths. The trainer calls it when a run starts.
std::vector<std::string> clean_stale_temporaries(const std::string& run_dir);

// `path` is a checkpoint directory (holds trainer.json) -> itself; a run directory -> its newest
// complete checkpoint (checkpoint_problem() == ""), printing one warning line per newer checkpoint
// it skipped and why; a checkpoints/ directory -> its newest complete one. Throws naming `path`
// otherwise (also when no checkpoint is complete).
std::string resolve_checkpoint(const std::string& path);

struct LoadOptions {
  bool optimizer = true;  // also read optimizer.safetensors (training); false for eval/generate
  // When set, config.json must equal it (resume: the run's architecture); the error names the first
  // field that differs.
  const nlohmann::json* expected_config = nullptr;
};

struct Checkpoint {
  std::string dir;
  nlohmann::json config;
  SafetensorsFile model;
  SafetensorsFile buffers;    // buffers.safetensors; empty when the checkpoint has none
  bool has_buffers = false;   // buffers.safetensors exists
  SafetensorsFile optimizer;  // empty unless LoadOptions::optimizer
  TrainerState trainer;
  bool has_tokenizer = false;  // dir/tokenizer/ exists: load_tokenizer(dir + "/tokenizer")
};

// Reads and validates a checkpoint directory (not a run directory: see resolve_checkpoint). Missing
// files, bad trainer.json (format, version, fields), corrupt safetensors and a config that differs
// from the expected one each give one cemfrac::Error line naming the file. Whether the tensors fit
// the model is checked when they are loaded into it (load_into, Optimizer::load_state).
Checkpoint load_checkpoint(const std::string& dir, const LoadOptions& options = {});

// Loads a checkpoint's state buffers into `module` (every state_buffers() entry, by name; missing,
// extra and mis-shaped tensors are one-line errors naming buffers.safetensors). A module without
// state buffers accepts a checkpoint without the file.
void load_state_buffers(const Checkpoint& checkpoint, torch::nn::Module& module);

// Throws naming the first field where `found` differs from `expected` (missing, extra, or another
// value), e.g. "<source>: config.json field 'd_model' is 256 but the run's model has 128".
void check_config_matches(const nlohmann::json& expected, const nlohmann::json& found,
                          const std::string& source);

}  // namespace cemfrac

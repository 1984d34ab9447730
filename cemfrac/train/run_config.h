// A run = [model] + [data] + [train] + [eval] sections of a TOML file (configs/*.toml), overridden
// by `--set section.key=value`, printed at start and saved as config.toml in the run directory.
// Each field is declared once in its struct's visit_fields() (key, default, help).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/model/model_config.h"

namespace cemfrac {

struct DataConfig {
  std::string path = "data/brown";  // a directory written by `cemfrac prepare`

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("path", path, "Prepared dataset directory (cemfrac prepare --out)");
  }
};

struct TrainConfig {
  int64_t steps = 1000;         // optimizer steps
  int64_t micro_batch = 8;      // sequences per forward/backward
  int64_t seq_len = 0;          // tokens per sequence (0 = model.context)
  int64_t tokens_per_step = 0;  // tokens per optimizer step (0 = one micro-batch); a multiple of
                                // micro_batch * seq_len; the quotient is the accumulation count
  double lr_max = 3e-3;
  double lr_min = 3e-4;        // floor of the cosine decay
  int64_t warmup_steps = 100;  // linear warmup from 0 to lr_max
  double weight_decay = 0.1;   // decay group only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;            // max global gradient norm (0 = off)
  uint64_t seed = 1234;              // init and data order
  int64_t log_every = 10;            // metrics line every N steps
  int64_t eval_every = 100;          // validation every N steps (0 = only at the end)
  int64_t eval_tokens = 65536;       // validation tokens per evaluation (0 = whole split)
  int64_t checkpoint_every = 500;    // 0 = only at the end
  int64_t keep_checkpoints = 2;      // keep the last N
  std::string out = "runs/default";  // run directory
  bool dyadic = true;                // CoFrGeNet ladder depth i trains from step ceil(t (1 - 2^-i))
  bool dist_overlap = true;          // data parallel: all-reduce gradients during backward
  bool shard_optimizer = false;      // data parallel: AdamW state sharded over ranks (ZeRO-1)
  bool shard_gradients = false;      // data parallel: reduced gradients sharded too (ZeRO-2)
  std::string device = "cpu";        // cpu, cuda, cuda:N, meta (core/device.h); --device wins
  std::string precision = "fp32";    // fp32, or bf16: the forward under autocast (bfloat16)
  std::string init_from;             // a new run starts from this checkpoint's weights ("" = none)

  // OnCheckpoint::kMayChange marks the settings a resumed run may change (train --resume): they
  // alter no parameter update (steps stretches the schedule from the resumed step on, which the
  // resume warns about). Every other field is part of the run's identity: a resume that changes it
  // is refused (Trainer::run_settings).
  template <typename Visitor>
  void visit_fields(Visitor& v) {
    constexpr OnCheckpoint kMayChange = OnCheckpoint::kMayChange;
    v("steps", steps, "Optimizer steps", kMayChange);
    v("micro_batch", micro_batch, "Sequences per forward/backward pass");
    v("seq_len", seq_len, "Tokens per training sequence (0 = model.context)");
    v("tokens_per_step", tokens_per_step, "Tokens per optimizer step (0 = one micro-batch)");
    v("lr_max", lr_max, "Peak learning rate");
    v("lr_min", lr_min, "Learning-rate floor of the cosine decay");
    v("warmup_steps", warmup_steps, "Linear warmup steps");
    v("weight_decay", weight_decay, "AdamW weight decay (matrices only)");
    v("beta1", beta1, "AdamW beta1");
    v("beta2", beta2, "AdamW beta2");
    v("adam_eps", adam_eps, "AdamW epsilon");
    v("grad_clip", grad_clip, "Clip the global gradient norm to this (0 = off)");
    v("seed", seed, "Seed of initialisation and data order");
    v("log_every", log_every, "Write a metrics line every N steps", kMayChange);
    v("eval_every", eval_every, "Evaluate on the validation split every N steps (0 = at the end)",
      kMayChange);
    v("eval_tokens", eval_tokens, "Validation tokens per evaluation (0 = the whole split)",
      kMayChange);
    v("checkpoint_every", checkpoint_every, "Checkpoint every N steps (0 = at the end)",
      kMayChange);
    v("keep_checkpoints", keep_checkpoints, "Number of checkpoints kept", kMayChange);
    v("out", out, "Run directory", kMayChange);
    v("dyadic", dyadic, "CoFrGeNet dyadic schedule: ladder depth i trains from step t (1 - 2^-i)");
    // The same bits either way (tests/dist): only when communication happens changes.
    v("dist_overlap", dist_overlap,
      "Data parallel: all-reduce gradient buckets during backward (false: after backward)",
      kMayChange);
    // The same bits either way (tests/dist), and checkpoints always hold the whole state.
    v("shard_optimizer", shard_optimizer,
      "Data parallel: each rank keeps the AdamW state of its share of the parameters and "
      "broadcasts the ones it updated (ZeRO stage 1); the same steps as without",
      kMayChange);
    // Checkpoints do not depend on it; the gradient norm is summed in another order (below 1e-15
    // relative), so a resumed run may switch it.
    v("shard_gradients", shard_gradients,
      "Data parallel, with shard_optimizer: each parameter's gradient is reduced to its owner "
      "only, "
      "and the other ranks free it (ZeRO stage 2)",
      kMayChange);
    // Checkpoints hold host tensors, so a run resumes on any device (the global --device flag
    // overrides this; a data-parallel rank r on cuda takes cuda:LOCAL_RANK).
    v("device", device,
      "Where to compute: cpu, cuda, cuda:N, or meta (a dry run of shapes); --device overrides it",
      kMayChange);
    // Changes every update: part of the run's identity.
    v("precision", precision,
      "fp32, or bf16: forward under autocast (bfloat16 matrix products; float32 weights, "
      "optimizer state and loss)");
    // Where a run's weights came from: part of its identity (--resume reads its own checkpoint).
    v("init_from", init_from,
      "Start a new run from a checkpoint's weights (run or checkpoint directory): tensors of "
      "same-kind sub-layers by name, the others freshly initialised (\"\" = none)");
  }
};

struct EvalConfig {
  int64_t stride = 0;  // sliding-window stride for `cemfrac eval` (0 = context / 2)

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("stride", stride, "Sliding-window stride in tokens (0 = context / 2)");
  }
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
};

// Reads a TOML run config. Unknown sections/keys and invalid values throw cemfrac::Error naming the
// key, the value and the file:line. `overrides` are "section.key=value" strings (--set), applied
// after the file, with the same checks.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
// `overrides` applied to a config built in code (defaults, or a checkpoint's model), then
// validated; errors name the --set text.
RunConfig with_overrides(RunConfig config, const std::vector<std::string>& overrides);
// `overrides` ("model.key=value" or "model.table.key=value", as --set) applied to a model config by
// the same reader as the TOML file and --set of a run config; not validated (the caller does).
// Errors name the --set text. eval / generate use it on a checkpoint's model
// (train/model_loader.h).
// `flag` names where the texts came from in messages ("--set"; Python: "cemfrac.load: override").
void override_model_fields(ModelConfig& model, const std::vector<std::string>& overrides,
                           const std::string& flag = "--set");
// The checks of the [train] section, for a model of `context` positions (<= 0: unknown, seq_len
// unbounded); run configs and the trainer both apply them (nullopt = valid).
std::optional<ConfigProblem> train_config_problem(const TrainConfig& train, int64_t context);
// The checks load_run_config applies (also to a config built in code): throws cemfrac::Error naming
// the key, the value and what is allowed.
void validate_run_config(const RunConfig& config);
// The resolved config as TOML (what is printed at start and saved as config.toml).
std::string to_toml(const RunConfig& config);

}  // namespace cemfrac

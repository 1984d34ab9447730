// `cemfrac train` as one library call: start a new training run, or resume one, from a resolved run
// config. Everything that can refuse the run (the run directory's rule, train/run_dir.h; a dataset
// that is not prepared; a tokenizer larger than the model's vocabulary; a config whose memory lower
// bound exceeds this machine's, train/budget.h) is checked before the first write into the run
// directory. Data parallel when the environment says so (dist/env.h: torchrun's WORLD_SIZE > 1, as
// `cemfrac launch` sets it); rank 0 alone prints and writes into the run directory.
//
// Printed on stdout by rank 0: the resolved config (`# resolved run config (SOURCE)`, then the TOML
// saved as <run>/config.toml), the data-parallel line, what `train.init_from` loaded, and the
// moments' bytes per rank under `train.shard_optimizer`. The closing lines are the caller's.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>

#include "cemfrac/dist/env.h"
#include "cemfrac/train/run_config.h"
#include "cemfrac/train/trainer.h"

namespace cemfrac {

struct TrainRunRequest {
  RunConfig config;          // the run config with its overrides applied
  std::string source;        // how the header names it: "configs/x.toml, 2 override(s)"
  std::string resume;        // a run directory or one of its checkpoints; "" = a new run
  int64_t stop_at_step = 0;  // > 0: stop after this step with a checkpoint
  bool progress = true;      // the trainer's progress line
  bool verify_data = true;   // the full scan of the token files before step 1
  DistOptions dist = dist_options_from_environment();
};

struct TrainRunOutcome {
  TrainResult result;
  std::string run_dir;
  int rank = 0;
  bool data_parallel = false;
  // The all-reduce time over the run's steps (data parallel), for the closing line that `bench train
  // --nproc` reads.
  double reduce_seconds = 0, reduce_exposed_seconds = 0;
  int64_t reduce_steps = 0;
};

// Trains on `device` (cuda: each data-parallel rank takes cuda:LOCAL_RANK unless a GPU was named).
// A --resume of a checkpoint inside a run's checkpoints/ continues in that run's own directory
// (train.out is then ignored, with a warning). Throws cemfrac::Error, one line, on every refusal.
TrainRunOutcome start_or_resume_training(TrainRunRequest request, torch::Device device);

}  // namespace cemfrac

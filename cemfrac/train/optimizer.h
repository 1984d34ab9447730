// AdamW (torch.optim.AdamW's update) with parameter groups from the model's parameter table
// (ParamInfo::group):
//   kDecay    matrices: weight decay
//   kNoDecay  norms, biases, embeddings: no weight decay
//   kFrozen   no update, no decay, no state, and requires_grad(false) while frozen.
// The update of a CPU float/double parameter is one fused pass (kernels::adamw_step_cpu); other
// devices and dtypes take the same formulas as ATen ops. Parameters without a gradient are skipped
// (no state is created for them, their step count does not advance). Dyadic depth activation
// (DESIGN.md §5) calls unfreeze(name, group) at its step: the parameter gets requires_grad(true)
// and joins the decay or no-decay group; its AdamW state starts at the next step, as for a fresh
// parameter. The set of unfrozen parameters is saved with the optimizer state, so a resumed run has
// the same groups.
//
// Data-parallel sharding (ZeRO stage 1, train.shard_optimizer): set_owned(names) restricts updates
// and state to the parameters this rank owns; the others keep their values until the trainer
// overwrites them with their owners' (dist/data_parallel.h broadcast). shard_by_size decides the
// owners, the same way on every rank.
//
// Optimizer state is saved by parameter name (never by index): for each parameter with state,
// "<name>.exp_avg", "<name>.exp_avg_sq" (parameter's shape and dtype) and "<name>.step" (I64
// scalar).
#pragma once
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cemfrac/io/safetensors.h"
#include "cemfrac/model/lm_model.h"  // ParamInfo, ParamGroup

namespace cemfrac {

struct AdamWConfig {
  double lr = 1e-3;  // replaced every step by the schedule
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decay group only
};

// name -> parameter tensor for every entry of `params`, looked up in module.named_parameters().
// Throws when the table names a parameter the module lacks (a model bug, reported by name).
std::map<std::string, torch::Tensor> parameters_by_name(const torch::nn::Module& module,
                                                        const std::vector<ParamInfo>& params);

class Optimizer {
 public:
  Optimizer(const torch::nn::Module& module, const std::vector<ParamInfo>& params,
            const AdamWConfig& config);

  void set_lr(double lr);
  double lr() const { return lr_; }
  void zero_grad();
  void step();

  // Moves a frozen parameter into the decay or no-decay group (see the file comment).
  void unfreeze(const std::string& name, ParamGroup group);
  bool is_frozen(const std::string& name) const;
  std::vector<std::string> frozen() const;

  // Every trainable parameter, in table order (what gradient clipping and the NaN guard look at).
  std::vector<torch::Tensor> trainable() const;

  // State as tensors by name (see the file comment) and the group membership as metadata.
  TensorMap state_tensors() const;
  std::map<std::string, std::string> state_metadata() const;
  // Restores what state_tensors()/state_metadata() gave. Parameters frozen here but trainable in
  // the saved state are unfrozen first. Throws one cemfrac::Error line naming `source` for unknown
  // parameters, missing moments and shape mismatches.
  void load_state(const SafetensorsFile& file, const std::string& source);

  // Only these parameters are updated and keep state from now on (state of the others is
  // dropped: a resumed rank loads the whole state, then keeps its share).
  void set_owned(const std::set<std::string>& names);
  bool owns(const std::string& name) const { return !owned_ || owned_->count(name) > 0; }

  // Number of parameters that have AdamW state (those updated at least once since their last
  // unfreeze).
  size_t num_states() const { return state_.size(); }

 private:
  struct Moments {
    torch::Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
  };

  std::vector<std::string> names_;  // table order
  std::map<std::string, torch::Tensor> params_;
  std::map<std::string, ParamGroup> groups_;  // current group of each parameter
  std::map<std::string, Moments> state_;
  AdamWConfig config_;
  double lr_ = 0;
  std::optional<std::set<std::string>> owned_;  // unset: every parameter
};

// Owners of items of the given sizes among `parts` ranks: largest first, each to the rank with the
// smallest total so far (the lowest rank on ties). Deterministic, so every rank computes the same.
std::vector<int64_t> shard_by_size(const std::vector<int64_t>& sizes, int64_t parts);

// AdamW's two moments for every parameter of the table (bytes of `element_bytes` each, float32 = 4),
// whole and on the most loaded of `parts` ranks under shard_by_size: what sharding saves per rank.
struct ShardedStateBytes {
  int64_t whole = 0;
  int64_t largest_shard = 0;
};
ShardedStateBytes sharded_state_bytes(const std::vector<ParamInfo>& params, int64_t parts,
                                      int64_t element_bytes = 4);

// Scales all gradients so their global L2 norm is at most max_norm (max_norm <= 0: no clipping) and
// returns the norm before clipping (NaN/Inf when a gradient is not finite; then nothing is scaled).
// Parameters without a gradient are skipped.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);
// Its two halves, for gradients split over ranks (train.shard_gradients): the float64 sum of
// squares of the gradients held here, and the clip given the sum over every rank (returns the norm).
double grad_square_sum(const std::vector<torch::Tensor>& params);
double clip_to_norm(const std::vector<torch::Tensor>& params, double square_sum, double max_norm);

}  // namespace cemfrac

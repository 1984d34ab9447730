// What the trainer asks of data-parallel training, and nothing more: which rank am I, start every
// rank from the same state, reduce this step's gradients, sum these numbers over ranks (did any
// rank stop or fail). The trainer holds a DataParallel*; the one implementation is c10d's
// (dist/process_group.h: Gloo for CPU tensors, NCCL for CUDA ones where LibTorch has it). World
// size 1 is an inactive object whose every call is a no-op, so one process runs exactly the
// one-process code path.
//
// A step, seen from the trainer:
//   dp.before_last_backward(step);  // the step's last micro-batch: its backward may launch buckets
//   loss.backward();
//   dp.reduce_gradients();          // every attached gradient is now the mean over ranks
//   dp.allreduce_sum({loss, stop}); // the step's scalars; ends the step's reduce timing
//
// Failures (a peer killed or hung, the store gone) are one cemfrac::Error line naming the rank.
// Timings reach whoever reports them (the train command, `bench train --nproc`) through a
// ReduceObserver, not through the trainer.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cemfrac/dist/env.h"

namespace cemfrac {

// One optimizer step's reductions (gradients and the step's scalars), wall seconds including any
// wait for a slower rank. exposed_seconds: the part the training thread spent waiting (all of it
// unless the gradient all-reduce overlapped backward).
struct ReduceTiming {
  double seconds = 0;
  double exposed_seconds = 0;
};

class ReduceObserver {
 public:
  virtual ~ReduceObserver() = default;
  virtual void on_step_reduced(const ReduceTiming& timing) = 0;
};

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  virtual bool active() const = 0;  // world size > 1
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  virtual std::string backend() const = 0;   // "gloo", "nccl" or "none" (world 1)
  virtual std::string describe() const = 0;  // one line: world, backend, rank layout, store

  // Start of a run. check_same: every rank passes its value; all ranks fail with one line unless
  // all values equal rank 0's. broadcast_from_rank0: every tensor overwritten with rank 0's, then
  // checked to hold the same bytes everywhere.
  virtual void check_same(const std::string& what, const std::string& value) = 0;
  virtual void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors,
                                    const std::string& what) = 0;
  // Every tensor overwritten with rank `root`'s (bucketed; no check). Counted in the step's
  // timing.
  virtual void broadcast(const std::vector<torch::Tensor>& tensors, int64_t root,
                         const std::string& what) = 0;
  // Rank `from` sends its tensors to rank 0, which receives them into its own (the same shapes and
  // dtypes, in the same order); every other rank returns at once. from = 0: nothing to do.
  virtual void send_to_rank0(const std::vector<torch::Tensor>& tensors, int64_t from,
                             const std::string& what) = 0;
  // The parameters whose gradients reduce_gradients() averages (those with requires_grad and a
  // gradient at that time). overlap: their buckets are all-reduced during the backward pass that
  // follows before_last_backward(), as soon as each bucket's gradients are final; otherwise all at
  // once in reduce_gradients(). owners (one rank per parameter, or empty = every rank): gradient
  // sharding, each gradient reduced to its owner only, and undefined on the other ranks after.
  virtual void attach_gradients(const std::vector<torch::Tensor>& params, bool overlap,
                                const std::vector<int64_t>& owners = {}) = 0;

  // Each step: `step` is the 1-based step being computed.
  virtual void before_last_backward(int64_t step) = 0;
  virtual void reduce_gradients() = 0;
  // Sum over ranks in float64. end_of_step: this call closes the step (its timing goes to the
  // observer); false for reductions outside the step (validation).
  virtual std::vector<double> allreduce_sum(const std::vector<double>& values,
                                            const std::string& what, bool end_of_step) = 0;

  // End of a successful run: a last barrier (the store's host must not leave first).
  virtual void finish() = 0;
  virtual void set_observer(ReduceObserver* observer) = 0;  // null: none; not owned
};

// The process's data-parallel object: c10d's for world size > 1 (it connects to the store and
// meets every rank, or throws one line), an inactive one for world 1; `device` is where the
// model's tensors live (NCCL for CUDA where this LibTorch has it, Gloo otherwise). Passed through
// the decorator, if one was set.
std::unique_ptr<DataParallel> make_data_parallel(const DistEnv& env, const DistOptions& options,
                                                 const torch::Device& device);

// A wrapper put around every object make_data_parallel returns from then on. Only test
// executables set one (tests/dist/fault_injection.cpp: kill, hang or poison a rank at a step);
// the cemfrac binary never does.
using DataParallelDecorator =
    std::function<std::unique_ptr<DataParallel>(std::unique_ptr<DataParallel>)>;
void set_data_parallel_decorator(DataParallelDecorator decorator);

}  // namespace cemfrac

// Data-parallel training on PyTorch's c10d (the DataParallel of dist/data_parallel.h): a TCPStore
// for the rendezvous; a Gloo process group for CPU tensors, and for CUDA tensors NCCL (where this
// LibTorch was built with it, see core/compat.h) with a Gloo side group for the step's scalars and
// the parameter hash check. The environment is torchrun's (dist/env.h).
//
// Gradients are reduced in buckets by our own code, in one of two ways (train.dist_overlap):
//   overlapped (default, GradientReducer below): buckets in reverse parameter-table order
//     (the order backward produces gradients, as in PyTorch's DDP); autograd hooks on each
//     parameter's gradient accumulator launch a bucket's asynchronous all-reduce as soon as all its
//     gradients are final, during the step's last backward pass; the optimizer step waits for all
//     of them.
//   after backward (DistContext::allreduce_mean): every bucket all-reduced after the whole
//   backward.
// Either way each element is summed once over ranks and then divided by the world size, so the
// result does not depend on the bucket layout, and 2 ranks stay bitwise equal to 1 rank with 2
// accumulation micro-batches.
// Failures (a peer killed, a peer hung, the store gone) become one cemfrac::Error line naming the
// lost rank; the process group is then abandoned, never waited on.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/dist/env.h"

namespace cemfrac {

class GradientReducer;

class DistContext final : public DataParallel {
 public:
  // World 1: nothing. Otherwise connects to the store (or hosts it on rank 0 without an agent
  // store) and creates the process group for tensors on `device`; throws cemfrac::Error within
  // connect_timeout_s when the store or a peer cannot be reached, or when `device` is CUDA and this
  // LibTorch has no NCCL.
  DistContext(const DistEnv& env, const DistOptions& options,
              const torch::Device& device = torch::kCPU);
  ~DistContext() override;
  DistContext(const DistContext&) = delete;
  DistContext& operator=(const DistContext&) = delete;

  // World size > 1, or DistOptions::group_for_one_rank.
  bool active() const override { return grouped_; }
  int64_t rank() const override { return env_.rank; }
  int64_t world_size() const override { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  const DistOptions& options() const { return options_; }
  std::string backend() const override;
  std::string describe() const override;

  void check_same(const std::string& what, const std::string& value) override;
  // Bucketed; the byte check is a min/max all-reduce of a hash of every tensor.
  void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors,
                            const std::string& what) override;
  void broadcast(const std::vector<torch::Tensor>& tensors, int64_t root,
                 const std::string& what) override;
  void send_to_rank0(const std::vector<torch::Tensor>& tensors, int64_t from,
                     const std::string& what) override;
  // overlap: a GradientReducer (below) over `params`; else allreduce_mean in reduce_gradients().
  void attach_gradients(const std::vector<torch::Tensor>& params, bool overlap,
                        const std::vector<int64_t>& owners = {}) override;
  void before_last_backward(int64_t step) override;
  void reduce_gradients() override;
  std::vector<double> allreduce_sum(const std::vector<double>& values, const std::string& what,
                                    bool end_of_step) override;
  void finish() override;
  void set_observer(ReduceObserver* observer) override;

  // In place: each tensor becomes the mean over ranks (bucketed sum, then / world). Undefined
  // tensors are skipped (they must be undefined on every rank).
  void allreduce_mean(const std::vector<torch::Tensor>& tensors, const std::string& what);
  void barrier(const std::string& what);

  struct Impl;

 private:
  friend class GradientReducer;
  DistEnv env_;
  DistOptions options_;
  bool grouped_ = false;
  std::unique_ptr<Impl> impl_;
  std::vector<torch::Tensor> attached_;
  std::vector<int64_t> owners_;
  std::unique_ptr<GradientReducer> reducer_;
};

// The gradient all-reduce overlapped with backward. Buckets of at most DistOptions::bucket_bytes
// (the first one 1 MiB, so that communication starts early) over the parameters in reverse order;
// a post-hook on each parameter's AccumulateGrad node marks it ready. Buckets are launched strictly
// in bucket order (every rank issues the same collectives in the same order whatever order autograd
// runs the hooks in). Only parameters with requires_grad count; one that gets no gradient (unused,
// or a hook that never ran) holds its bucket and the later ones back until finish(), which launches
// them. With gradient accumulation only the backward after arm() communicates.
//
//   reducer.arm();          // before the step's last backward pass
//   loss.backward();        // buckets start as their gradients become final
//   reducer.finish();       // waits; every defined gradient is now the mean over ranks
//
// World 1: arm and finish do nothing. Failures are DistContext's error lines ("all-reduce of
// gradients failed: lost rank 1 ..."), thrown from finish().
class GradientReducer {
 public:
  // owners (one per parameter, or empty): a bucket holds one owner's parameters and is reduced to
  // that rank only; the other ranks drop those gradients when the bucket is launched and free the
  // sent copy once the reduction has completed.
  GradientReducer(DistContext& dist, const std::vector<torch::Tensor>& params,
                  const std::vector<int64_t>& owners = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The next backward pass launches the buckets.
  void arm();
  void finish();
  int64_t buckets() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// The launcher side of TORCHELASTIC_USE_AGENT_STORE: a TCPStore server on addr:port (0 = a free
// port) that lives as long as the object. port() is the port it listens on.
class StoreServer {
 public:
  StoreServer(const std::string& addr, int port, double timeout_s);
  ~StoreServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cemfrac

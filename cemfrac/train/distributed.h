// Data-parallel training on PyTorch's c10d: a TCPStore for the rendezvous and a Gloo process group
// for the collectives (NCCL for CUDA tensors where LibTorch 2.x has it, see core/compat.h). The
// environment is torchrun's, so `torchrun --no_python`, `cemfrac launch` (cli/launch.cpp) and
// hand-set variables on several machines all start the same thing:
//
//   MASTER_ADDR, MASTER_PORT   the store (TCPStore) every rank connects to
//   RANK, WORLD_SIZE           this process and the number of processes
//   LOCAL_RANK, LOCAL_WORLD_SIZE  place on this machine (information only on CPU)
//   TORCHELASTIC_USE_AGENT_STORE  "True"/"1": the launcher hosts the store; else rank 0 does
//   TORCHELASTIC_RESTART_COUNT    keys of a restarted attempt are kept apart from the last one's
//   GLOO_SOCKET_IFNAME            network interface for Gloo (several machines)
//   CEMFRAC_CONNECT_TIMEOUT, CEMFRAC_COLLECTIVE_TIMEOUT  seconds (defaults 60 and 60)
//
// World size 1 (WORLD_SIZE unset or 1) creates no store and no process group: every call below is a
// no-op and training is exactly the one-process code path.
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

namespace cemfrac {

struct DistEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int port = 29500;
  bool agent_store = false;  // the launcher (torchrun's agent, cemfrac launch) hosts the store
  int64_t restart_count = 0;
};

// torchrun's variables (above). WORLD_SIZE unset means world 1. Throws cemfrac::Error naming the
// variable for a malformed or inconsistent value (RANK outside [0, WORLD_SIZE), a bad port).
DistEnv dist_env_from_environment();

struct DistOptions {
  double connect_timeout_s = 60;     // reaching the store and meeting every rank
  double collective_timeout_s = 60;  // one collective (a hung peer is reported after this)
  int64_t bucket_bytes = 25 << 20;   // gradient all-reduce bucket size
};

// CEMFRAC_CONNECT_TIMEOUT / CEMFRAC_COLLECTIVE_TIMEOUT (seconds, > 0) over the defaults.
DistOptions dist_options_from_environment();

// "True", "true", "1", "yes" -> true (TORCHELASTIC_USE_AGENT_STORE is Python's str(True)).
bool env_flag_true(const char* value);

class DistContext {
 public:
  // World 1: nothing. Otherwise connects to the store (or hosts it on rank 0 without an agent
  // store) and creates the process group; throws cemfrac::Error within connect_timeout_s when the
  // store or a peer cannot be reached.
  DistContext(const DistEnv& env, const DistOptions& options);
  ~DistContext();
  DistContext(const DistContext&) = delete;
  DistContext& operator=(const DistContext&) = delete;

  bool active() const { return env_.world_size > 1; }
  int64_t rank() const { return env_.rank; }
  int64_t world_size() const { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  const DistOptions& options() const { return options_; }
  std::string backend() const;   // "gloo", "nccl" or "none" (world 1)
  std::string describe() const;  // one line: world, backend, rank layout, store

  // Every rank passes its value; all ranks fail with one line unless all values equal rank 0's.
  void check_same(const std::string& what, const std::string& value);
  // Overwrites every tensor with rank 0's (bucketed), then checks that all ranks hold the same
  // bytes.
  void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors, const std::string& what);
  // In place: each tensor becomes the mean over ranks (bucketed sum, then / world). Undefined
  // tensors are skipped (they must be undefined on every rank).
  void allreduce_mean(const std::vector<torch::Tensor>& tensors, const std::string& what);
  // Sum over ranks of a few doubles (loss, flags), in float64. timed = false: not counted in
  // reduce_seconds() and reduce_steps() (validation).
  std::vector<double> allreduce_sum(const std::vector<double>& values, const std::string& what,
                                    bool timed = true);
  void barrier(const std::string& what);
  // Wall time of the all-reduces so far (including waits for slower ranks), and the number of
  // allreduce_sum calls (the trainer makes one per step). reduce_seconds: allreduce_mean and
  // allreduce_sum calls, plus for GradientReducer the span from its first bucket's launch to its
  // last bucket's completion. exposed_reduce_seconds: the part of that the training thread spent
  // waiting, i.e. not overlapped with backward (all of it without GradientReducer).
  double reduce_seconds() const;
  double exposed_reduce_seconds() const;
  int64_t reduce_steps() const;
  // Test fault injection (CEMFRAC_FAULT=RANK:STEP:kill|hang|nan): called by the trainer before the
  // gradient all-reduce of 1-based step `step`; "nan" poisons `grads` (the first defined one).
  void fault_point(int64_t step, const std::vector<torch::Tensor>& grads);
  // End of a successful run: a last barrier (so the store's host does not leave first), then stops
  // the heartbeat. Without it the destructor only stops the heartbeat.
  void finish();

  struct Impl;

 private:
  friend class GradientReducer;
  DistEnv env_;
  DistOptions options_;
  std::unique_ptr<Impl> impl_;
};

// The gradient all-reduce overlapped with backward. Buckets of at most DistOptions::bucket_bytes
// (the first one 1 MiB, so that communication starts early) over the parameters in reverse order;
// a post-hook on each parameter's AccumulateGrad node marks it ready. Buckets are launched strictly
// in bucket order (every rank issues the same collectives in the same order whatever order autograd
// runs the hooks in). Only parameters with requires_grad count; one that gets no gradient (unused,
// or a hook that never ran) holds its bucket and the later ones back until finish(), which launches
// them. With gradient accumulation only the backward after arm() communicates.
//
//   reducer.arm(step);      // before the step's last backward pass
//   loss.backward();        // buckets start as their gradients become final
//   reducer.finish();       // waits; every defined gradient is now the mean over ranks
//
// World 1: arm and finish do nothing. Failures are DistContext's error lines ("all-reduce of
// gradients failed: lost rank 1 ..."), thrown from finish().
class GradientReducer {
 public:
  GradientReducer(DistContext& dist, const std::vector<torch::Tensor>& params);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The next backward pass launches the buckets; `step` (1-based) is for DistContext::fault_point.
  void arm(int64_t step);
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

// Whether this LibTorch has the Gloo process group (always, for Debian's 1.13) and NCCL.
bool dist_has_gloo();
bool dist_has_nccl();

}  // namespace cemfrac

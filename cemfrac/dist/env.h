// Where this process sits in a data-parallel job, from torchrun's environment, so that
// `torchrun --no_python`, `cemfrac launch` (cli/launch.cpp) and hand-set variables on several
// machines all start the same thing:
//
//   MASTER_ADDR, MASTER_PORT   the store (TCPStore) every rank connects to
//   RANK, WORLD_SIZE           this process and the number of processes
//   LOCAL_RANK, LOCAL_WORLD_SIZE  place on this machine (a CUDA rank's device is cuda:LOCAL_RANK)
//   TORCHELASTIC_USE_AGENT_STORE  "True"/"1": the launcher hosts the store; else rank 0 does
//   TORCHELASTIC_RESTART_COUNT    keys of a restarted attempt are kept apart from the last one's
//   GLOO_SOCKET_IFNAME            network interface for Gloo (several machines)
//   CEMFRAC_CONNECT_TIMEOUT, CEMFRAC_COLLECTIVE_TIMEOUT  seconds (defaults 60 and 60)
//
// No c10d header is needed to read them (dist/process_group.h is the one place that uses c10d).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

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
  // World size 1 normally makes no store and no group (the one-process path). true: make both
  // anyway, a group of one rank (what a one-GPU cluster job of torchrun runs; the cuda tests use it
  // to run the NCCL path on a single GPU).
  bool group_for_one_rank = false;
};

// CEMFRAC_CONNECT_TIMEOUT / CEMFRAC_COLLECTIVE_TIMEOUT (seconds, > 0) over the defaults.
DistOptions dist_options_from_environment();

// The device a data-parallel rank trains on (world size > 1), from the one the command was given:
// cpu stays cpu; cuda, written without an index, becomes cuda:LOCAL_RANK (torchrun's convention: one
// GPU per local rank), which must be one of the `visible_gpus`; an explicit cuda:N is kept only
// with one rank per machine (else every rank would share GPU N). meta (a one-process dry run) and
// anything else are refused in one line.
c10::Device data_parallel_device(const c10::Device& device, bool index_given, const DistEnv& env,
                                 int64_t visible_gpus);

// "True", "true", "1", "yes" -> true (TORCHELASTIC_USE_AGENT_STORE is Python's str(True)).
bool env_flag_true(const char* value);

// Whether this LibTorch has the Gloo process group (always, for Debian's 1.13) and NCCL.
bool dist_has_gloo();
bool dist_has_nccl();

}  // namespace cemfrac

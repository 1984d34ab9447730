// torchrun's environment read into DistEnv / DistOptions (see env.h).
#include "cemfrac/dist/env.h"

#include <cerrno>
#include <cstdlib>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  CEMFRAC_CHECK(errno == 0 && end != v && *end == '\0' && x >= lo && x <= hi,
                "environment variable {}='{}' is not an integer in [{}, {}]", name, v, lo, hi);
  return x;
}

double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  CEMFRAC_CHECK(end != v && *end == '\0' && x > 0 && x < 1e7,
                "environment variable {}='{}' is not a positive number of seconds", name, v);
  return x;
}

}  // namespace

c10::Device data_parallel_device(const c10::Device& device, bool index_given, const DistEnv& env,
                                 int64_t visible_gpus) {
  if (device.is_cpu()) return device;
  CEMFRAC_CHECK(device.is_cuda(),
                "rank {} of {}: data-parallel ranks run on cpu or cuda, not {} (a meta dry run "
                "is one process: run it without launch or torchrun)",
                env.rank, env.world_size, device.str());
  if (index_given) {
    CEMFRAC_CHECK(env.local_world_size == 1,
                  "rank {} of {}: {} names one GPU for all {} ranks on this machine; give cuda "
                  "(each rank takes cuda:LOCAL_RANK) or set CUDA_VISIBLE_DEVICES per rank",
                  env.rank, env.world_size, device.str(), env.local_world_size);
    return device;
  }
  CEMFRAC_CHECK(env.local_rank < visible_gpus,
                "rank {} of {}: LOCAL_RANK {} needs cuda:{}, but only {} GPU(s) are visible; "
                "start at most {} rank(s) per machine",
                env.rank, env.world_size, env.local_rank, env.local_rank, visible_gpus,
                visible_gpus);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

bool env_flag_true(const char* value) {
  if (value == nullptr) return false;
  const std::string v = value;
  return v == "1" || v == "True" || v == "true" || v == "TRUE" || v == "yes";
}

DistEnv dist_env_from_environment() {
  DistEnv e;
  e.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  e.rank = env_int("RANK", 0, 0, e.world_size - 1);
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size, 1, 1 << 20);
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0, 1 << 20);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  e.port = static_cast<int>(env_int("MASTER_PORT", e.world_size > 1 ? -1 : 29500, 1, 65535));
  CEMFRAC_CHECK(e.world_size == 1 || e.port > 0,
                "WORLD_SIZE={} but MASTER_PORT is not set (torchrun's variables: MASTER_ADDR, "
                "MASTER_PORT, RANK, WORLD_SIZE; or use cemfrac launch)",
                e.world_size);
  e.agent_store = env_flag_true(std::getenv("TORCHELASTIC_USE_AGENT_STORE"));
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30);
  return e;
}

DistOptions dist_options_from_environment() {
  DistOptions o;
  o.connect_timeout_s = env_seconds("CEMFRAC_CONNECT_TIMEOUT", o.connect_timeout_s);
  o.collective_timeout_s = env_seconds("CEMFRAC_COLLECTIVE_TIMEOUT", o.collective_timeout_s);
  return o;
}

}  // namespace cemfrac

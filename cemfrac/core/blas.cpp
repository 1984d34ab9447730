#include "cemfrac/core/blas.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

// OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH cores that matter here, generic first. Zen and Haswell run
// the same AVX2 kernels; they share a rank.
struct CoreRank {
  const char* name;
  int rank;
};
constexpr CoreRank kCores[] = {
    {"Prescott", 0}, {"Nehalem", 1},  {"Sandybridge", 2}, {"Haswell", 3},
    {"Zen", 3},      {"SkylakeX", 4}, {"Cooperlake", 5},
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool has_all(const CpuFeatures& cpu, std::initializer_list<const char*> flags) {
  for (const char* f : flags)
    if (!cpu.flags.count(f)) return false;
  return true;
}

// Optional OpenBLAS entry points, looked up at run time so that another BLAS still links and runs.
template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string loaded_core() {
  auto fn = blas_symbol<char* (*)()>("openblas_get_corename");
  return fn ? std::string(fn()) : std::string();
}

std::string loaded_config() {
  auto fn = blas_symbol<char* (*)()>("openblas_get_config");
  if (fn) return std::string(fn());
  // A pip torch links MKL into libtorch_cpu and loads no OpenBLAS.
  return at::hasMKL() ? std::string("MKL, linked into LibTorch (not OpenBLAS)")
                      : std::string("unknown (not OpenBLAS)");
}

// Canonical spelling of a core name ("skylakex" -> "SkylakeX"); the input when unknown.
std::string canonical_core(const std::string& core) {
  for (const auto& c : kCores)
    if (lower(c.name) == lower(core)) return c.name;
  return core;
}

[[noreturn]] void reexec(char** argv, const std::string& core, const std::string& why) {
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  setenv("CEMFRAC_BLAS_REEXEC", why.c_str(), 1);
  execv("/proc/self/exe", argv);
  fail("could not re-execute with OPENBLAS_CORETYPE={} ({}); set it yourself and run again", core,
       std::strerror(errno));
}

BlasStatus& status_storage() {
  static BlasStatus status;
  return status;
}

}  // namespace

CpuFeatures parse_cpu_features(const std::string& cpuinfo) {
  CpuFeatures cpu;
  std::istringstream in(cpuinfo);
  std::string line;
  bool have_flags = false;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (key == "vendor_id" && cpu.vendor.empty()) cpu.vendor = value;
    if (key == "model name" && cpu.model_name.empty()) cpu.model_name = value;
    if (key == "flags" && !have_flags) {
      std::istringstream words(value);
      std::string flag;
      while (words >> flag) cpu.flags.insert(flag);
      have_flags = true;
    }
  }
  return cpu;
}

CpuFeatures read_cpu_features() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_cpu_features(buffer.str());
}

std::string best_openblas_core(const CpuFeatures& cpu) {
  if (has_all(cpu, {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}))
    return cpu.flags.count("avx512_bf16") ? "Cooperlake" : "SkylakeX";
  if (has_all(cpu, {"avx2", "fma"})) return cpu.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  if (has_all(cpu, {"avx"})) return "Sandybridge";
  if (has_all(cpu, {"sse4_2"})) return "Nehalem";
  return "Prescott";
}

int openblas_core_rank(const std::string& core) {
  for (const auto& c : kCores)
    if (lower(c.name) == lower(core)) return c.rank;
  return -1;
}

std::string openblas_core_below(const std::string& core, const CpuFeatures& cpu) {
  const int rank = openblas_core_rank(core);
  if (rank <= 0) return "";
  // The highest-ranked core below `rank` (Haswell, not Zen, for an Intel CPU).
  std::string best;
  int best_rank = -1;
  for (const auto& c : kCores) {
    if (c.rank >= rank || c.rank < best_rank) continue;
    if (std::string(c.name) == "Zen" && cpu.vendor != "AuthenticAMD") continue;
    if (std::string(c.name) == "Haswell" && cpu.vendor == "AuthenticAMD" && best == "Zen") continue;
    best = c.name;
    best_rank = c.rank;
  }
  return best;
}

double sgemm_check_error(int m, int k, int n) {
  // Deterministic, well-conditioned inputs: entries in [-1, 1] from a fixed integer pattern.
  auto a = at::empty({m, k}, at::kFloat);
  auto b = at::empty({k, n}, at::kFloat);
  float* pa = a.data_ptr<float>();
  float* pb = b.data_ptr<float>();
  for (int i = 0; i < m * k; ++i) pa[i] = static_cast<float>((i * 7919 % 2001) - 1000) / 1000.0f;
  for (int i = 0; i < k * n; ++i) pb[i] = static_cast<float>((i * 104729 % 2001) - 1000) / 1000.0f;
  auto c = at::mm(a, b);
  const float* pc = c.data_ptr<float>();
  double worst = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0, scale = 0;
      for (int p = 0; p < k; ++p) {
        ref += static_cast<double>(pa[i * k + p]) * pb[p * n + j];
        scale += std::fabs(static_cast<double>(pa[i * k + p]) * pb[p * n + j]);
      }
      const double err = std::fabs(pc[i * n + j] - ref) / std::max(scale, 1e-30);
      worst = std::max(worst, std::isfinite(err) ? err : INFINITY);
    }
  }
  return worst;
}

BlasStatus configure_blas(char** argv, const std::string& override_core) {
  BlasStatus& st = status_storage();
  const CpuFeatures cpu = read_cpu_features();
  st.library = loaded_config();
  st.core = loaded_core();
  st.best = best_openblas_core(cpu);
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const char* reexec_note = std::getenv("CEMFRAC_BLAS_REEXEC");
  const bool is_openblas = !st.core.empty();

  const bool overridden = !override_core.empty() && lower(override_core) != "auto";
  if (overridden)
    CEMFRAC_CHECK(openblas_core_rank(canonical_core(override_core)) >= 0,
                  "--blas-core '{}' is not a known OpenBLAS core (use auto, Prescott, Nehalem, "
                  "Sandybridge, Haswell, Zen, SkylakeX or Cooperlake)",
                  override_core);
  if (!is_openblas) {
    CEMFRAC_CHECK(!overridden, "--blas-core {}: this LibTorch's BLAS is {}: there is no core to choose",
                  override_core, st.library);
    st.source = "BLAS is not OpenBLAS: kernels chosen by the library";
  } else if (reexec_note && *reexec_note) {
    // Second pass after our own re-exec: OPENBLAS_CORETYPE was set by us.
    st.source = reexec_note;
    unsetenv("CEMFRAC_BLAS_REEXEC");
  } else if (overridden) {
    const std::string want = canonical_core(override_core);
    CEMFRAC_CHECK(openblas_core_rank(want) <= openblas_core_rank(st.best),
                  "--blas-core {}: this CPU cannot run its instructions (best it runs: {})", want,
                  st.best);
    if (lower(st.core) != lower(want))
      reexec(argv, want, fmt::format("--blas-core {} (user override)", want));
    st.source = fmt::format("--blas-core {} (user override)", want);
  } else if (env_core && *env_core && lower(override_core) != "auto") {
    st.source = fmt::format("OPENBLAS_CORETYPE={} from the environment", env_core);
    if (openblas_core_rank(st.core) < openblas_core_rank(st.best))
      st.notes.push_back(fmt::format(
          "OPENBLAS_CORETYPE={} runs slower kernels than this CPU supports ({}); unset it or pass "
          "--blas-core auto",
          env_core, st.best));
  } else if (openblas_core_rank(st.core) < openblas_core_rank(st.best)) {
    reexec(
        argv, st.best,
        fmt::format(
            "auto: OpenBLAS detected {}, the CPU flags allow {}: re-ran with OPENBLAS_CORETYPE={}",
            st.core, st.best, st.best));
  } else {
    st.source = fmt::format("auto: OpenBLAS's own detection ({}) matches the CPU flags", st.core);
  }

  st.max_rel_error = sgemm_check_error();
  // Float32 rounding over k = 131 terms stays below k * 2^-24 ~ 8e-6 of the absolute sum; a wrong
  // kernel is off by O(1).
  st.verified = st.max_rel_error < 1e-4;
  if (!st.verified && is_openblas) {
    const std::string below = openblas_core_below(st.core, cpu);
    const bool automatic = override_core.empty() || lower(override_core) == "auto";
    if (automatic && !below.empty())
      reexec(argv, below,
             fmt::format("auto: {} failed the sgemm check (rel. error {:.2e}); stepped down to {}",
                         st.core, st.max_rel_error, below));
    st.notes.push_back(fmt::format("sgemm check FAILED on core {} (max rel. error {:.2e})", st.core,
                                   st.max_rel_error));
  }
  return st;
}

const BlasStatus& blas_status() {
  BlasStatus& st = status_storage();
  if (st.library.empty()) {
    st.library = loaded_config();
    st.core = loaded_core();
    st.best = best_openblas_core(read_cpu_features());
    st.source = "not configured (library default)";
  }
  return st;
}

double measure_sgemm_gflops(int n, int reps) {
  return measure_matmul_gflops(n, reps, c10::Device(c10::kCPU), at::kFloat);
}

double measure_matmul_gflops(int n, int reps, c10::Device device, c10::ScalarType dtype) {
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  auto a = at::rand({n, n}, opts);
  auto b = at::rand({n, n}, opts);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  auto c = at::mm(a, b);  // warm-up: thread pools, page faults, the CUDA context and its kernels
  sync();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    sync();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

int default_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

int set_threads(int n) {
  if (n <= 0) n = default_threads();
  at::set_num_threads(n);
  if (auto fn = blas_symbol<void (*)(int)>("openblas_set_num_threads")) fn(n);
  return n;
}

int parallel_for_team() {
  const int64_t n = at::get_num_threads();
  std::vector<std::atomic<int>> seen(static_cast<size_t>(std::max<int64_t>(n, 1)));
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    if (tid >= 0 && tid < n) seen[tid].store(1);
  });
  int team = 0;
  for (const auto& s : seen) team += s.load();
  return team;
}

std::string blas_threading() {
  auto fn = blas_symbol<int (*)()>("openblas_get_parallel");
  if (fn == nullptr) return "unknown";
  switch (fn()) {
    case 0: return "serial";
    case 1: return "pthreads";
    case 2: return "OpenMP";
    default: return "unknown";
  }
}

}  // namespace cemfrac

// Choosing, checking and reporting the BLAS kernels that every LibTorch matmul runs on.
//
// Debian's OpenBLAS 0.3.21 is a DYNAMIC_ARCH build: at load time it picks a kernel set ("core")
// from CPUID. On CPUs it does not know (recent Xeons) it falls back to generic Prescott kernels,
// ~6x slower than the SkylakeX ones the CPU can run. The core can only be chosen through
// OPENBLAS_CORETYPE before the library loads, so configure_blas() runs first in main(): it derives
// the best core from the CPU flags, asks the loaded OpenBLAS which core it picked, and re-executes
// the program once with OPENBLAS_CORETYPE set when the pick is worse. It then checks one sgemm
// against a float64 reference; an automatic choice that fails the check steps down to the next
// core.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <set>
#include <string>
#include <vector>

namespace cemfrac {

struct CpuFeatures {
  std::string vendor;           // "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;       // /proc/cpuinfo "model name"
  std::set<std::string> flags;  // /proc/cpuinfo "flags" (features the kernel lets user code run)
};

CpuFeatures read_cpu_features();  // from /proc/cpuinfo
CpuFeatures parse_cpu_features(const std::string& cpuinfo);

// The best OpenBLAS 0.3.21 x86-64 core whose instructions the CPU really runs, from its flags:
// AVX-512 F/CD/BW/DQ/VL -> SkylakeX (+ AVX512_BF16 -> Cooperlake); AVX2+FMA -> Haswell (Zen on
// AMD); AVX -> Sandybridge; SSE4.2 -> Nehalem; else Prescott.
std::string best_openblas_core(const CpuFeatures& cpu);

// Cores ordered from generic to newest; -1 for names not in the table. Case-insensitive.
int openblas_core_rank(const std::string& core);
// The next core down that the same CPU can run ("" below Prescott).
std::string openblas_core_below(const std::string& core, const CpuFeatures& cpu);

struct BlasStatus {
  std::string library;  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." or "unknown (not OpenBLAS)"
  std::string core;     // the core the loaded library runs, e.g. "Haswell"
  std::string best;     // best_openblas_core() for this CPU
  std::string source;   // how the core was chosen, one line for humans
  bool verified = false;           // the sgemm check passed
  double max_rel_error = 0;        // of that check
  std::vector<std::string> notes;  // fallbacks, warnings
};

// Call first thing in main(), before anything runs a matmul. `override_core` is --blas-core's value
// ("" when absent, "auto" to ignore OPENBLAS_CORETYPE from the environment). May re-execute the
// process (execv of /proc/self/exe with the same argv); returns the final status otherwise.
BlasStatus configure_blas(char** argv, const std::string& override_core);

// The status as configured (configure_blas must have run; otherwise reports the library as loaded).
const BlasStatus& blas_status();

// One sgemm of size m x k x n through at::mm against a float64 triple loop; returns max relative
// error.
double sgemm_check_error(int m = 97, int k = 131, int n = 89);

// Measured sgemm rate through at::mm (n x n x n, float32), best of `reps` after one warm-up.
double measure_sgemm_gflops(int n = 2048, int reps = 3);

// Measured matmul rate through at::mm (n x n x n) of `dtype` on `device` (CPU or CUDA; the device
// is synchronised around each repetition), best of `reps` after one warm-up. The denominator of a
// step's MFU in that precision: a bf16 step is measured against a bf16 matmul, never against the
// float32 sgemm (which would let bf16 MFU pass 100%).
double measure_matmul_gflops(int n, int reps, c10::Device device, c10::ScalarType dtype);

// Sets LibTorch's intra-op threads and OpenBLAS's threads to n (n <= 0: number of cores).
int set_threads(int n);
int default_threads();

// How many threads an at::parallel_for compiled into this library really runs on, with one item per
// intra-op thread. at::parallel_for is a header template: built without OpenMP it runs everything
// on the calling thread, whatever at::get_num_threads() says. 1 then; the thread count otherwise.
int parallel_for_team();

// How the loaded OpenBLAS runs its own threads: "pthreads" (its own pool, beside LibTorch's OpenMP
// one), "OpenMP" (the same libgomp pool as LibTorch), "serial", or "unknown" (not OpenBLAS).
std::string blas_threading();

}  // namespace cemfrac

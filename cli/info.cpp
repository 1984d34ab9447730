// cemfrac info: what this build runs on. Version, LibTorch, threads, the BLAS library and the
// kernel set ("core") it runs, how that core was chosen, the sgemm check, and the measured sgemm
// rate.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/compat.h"
#include "cemfrac/dist/env.h"
#include "cli/build_info.h"
#include "cli/commands.h"

namespace cemfrac::cli {

Command add_info(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    bool json = false;
    int sgemm_size = 2048;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app =
      root.add_subcommand("info", "Version, LibTorch, threads, BLAS core, measured GFLOP/s");
  app->add_flag("--json", flags->json, "Print one JSON object");
  app->add_option("--sgemm-size", flags->sgemm_size, "Matrix size n of the timed n x n x n sgemm")
      ->check(CLI::Range(16, 8192));
  auto run = [flags]() {
    const BlasStatus& blas = blas_status();
    const CpuFeatures cpu = read_cpu_features();
    const double gflops = measure_sgemm_gflops(flags->sgemm_size, 3);
    const int team = parallel_for_team();
    // Data parallel: what this process would join (torchrun's variables), without connecting.
    const DistEnv dist = dist_env_from_environment();
    const std::string backends =
        std::string(dist_has_gloo() ? "gloo" : "") + (dist_has_nccl() ? ", nccl" : "");
    const std::string layout =
        dist.world_size > 1
            ? fmt::format("rank {} of {} (local {} of {}), store {}:{} hosted by {}", dist.rank,
                          dist.world_size, dist.local_rank, dist.local_world_size, dist.master_addr,
                          dist.port, dist.agent_store ? "the launcher" : "rank 0")
            : "one process (WORLD_SIZE unset or 1)";
    nlohmann::json j = {
        {"version", CEMFRAC_VERSION},
        {"commit", build_commit()},
        {"libtorch", compat::torch_version()},
        {"cpu", cpu.model_name},
        {"threads", at::get_num_threads()},
        {"parallel_for_team", team},
        {"blas",
         {{"library", blas.library},
          {"core", blas.core},
          {"best_core_for_cpu", blas.best},
          {"threading", blas_threading()},
          {"choice", blas.source},
          {"sgemm_check", blas.verified ? "pass" : "FAIL"},
          {"sgemm_check_max_rel_error", blas.max_rel_error},
          {"notes", blas.notes}}},
        {"sgemm_gflops", gflops},
        {"sgemm_size", flags->sgemm_size},
        {"distributed",
         {{"backends", backends},
          {"world_size", dist.world_size},
          {"rank", dist.rank},
          {"local_rank", dist.local_rank},
          {"layout", layout}}},
    };
    if (flags->json) {
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("cemfrac      {} (commit {})\n", CEMFRAC_VERSION, build_commit());
    fmt::print("LibTorch     {}\n", compat::torch_version());
    fmt::print("CPU          {}\n", cpu.model_name);
    fmt::print("threads      {} (a parallel_for of cemfrac's kernels runs on {})\n",
               at::get_num_threads(), team);
    fmt::print("BLAS         {}\n", blas.library);
    fmt::print("BLAS threads {}\n", blas_threading());
    fmt::print("BLAS core    {} (best for this CPU: {})\n", blas.core, blas.best);
    fmt::print("  chosen by  {}\n", blas.source);
    fmt::print("  check      sgemm vs float64 reference: {} (max rel. error {:.1e})\n",
               blas.verified ? "pass" : "FAIL", blas.max_rel_error);
    for (const auto& note : blas.notes) fmt::print("  note       {}\n", note);
    fmt::print("sgemm        {:.1f} GFLOP/s ({}^3, float32, best of 3)\n", gflops,
               flags->sgemm_size);
    fmt::print("distributed  c10d {} (cemfrac launch / torchrun); world {}: {}\n", backends,
               dist.world_size, layout);
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

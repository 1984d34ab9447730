// The subcommands of the one CLI. Each add_* declares its flags on `root` and returns how to run
// it; cemfrac_main.cpp runs the one the user named. This is the only layer that sees argv.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace cemfrac::cli {

struct GlobalOptions {
  int threads = 0;              // --threads; 0 = number of cores
  std::string blas_core;        // --blas-core; "" = auto unless OPENBLAS_CORETYPE is set
  bool flush_denormal = false;  // --flush-denormal: subnormal floats read and written as 0
  std::string device;  // --device (cli/device_util.h); "" = the run config's train.device, or cpu
};

// Exit codes: 0 success, 1 an error (one line on stderr), 2 a command-line usage error, and
// kExitInterrupted for a `train` stopped by SIGINT/SIGTERM after saving its checkpoint.
inline constexpr int kExitInterrupted = 3;

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the exit code; throws cemfrac::Error for user errors
};

Command add_info(CLI::App& root, const GlobalOptions& global);
Command add_tokenize(CLI::App& root, const GlobalOptions& global);
Command add_prepare(CLI::App& root, const GlobalOptions& global);
Command add_bench(CLI::App& root, const GlobalOptions& global);
Command add_params(CLI::App& root, const GlobalOptions& global);
// `cemfrac bench train` (cli/bench_train.cpp), registered by add_bench on its `bench` app.
Command add_bench_train(CLI::App& bench, const GlobalOptions& global);
// `cemfrac bench layers` (cli/bench_layers.cpp), likewise.
Command add_bench_layers(CLI::App& bench, const GlobalOptions& global);
// `cemfrac bench generate` (cli/bench_generate.cpp), likewise.
Command add_bench_generate(CLI::App& bench, const GlobalOptions& global);
Command add_train(CLI::App& root, const GlobalOptions& global);
// `cemfrac bench train --nproc N` (cli/bench_train_dist.cpp): data-parallel scaling.
int run_train_bench_nproc(const std::string& config, const std::vector<std::string>& sets,
                          int nproc, int steps, int warmup, bool as_json);
// `cemfrac launch` (cli/launch.cpp): N data-parallel ranks of a command on this machine.
Command add_launch(CLI::App& root, const GlobalOptions& global);
Command add_eval(CLI::App& root, const GlobalOptions& global);
Command add_generate(CLI::App& root, const GlobalOptions& global);
// `cemfrac gp` (cli/gp.cpp): the CEM paper's Gaussian-process experiment.
Command add_gp(CLI::App& root, const GlobalOptions& global);
// `cemfrac compare` (cli/compare.cpp): train, evaluate and test the claims of a suite of runs.
Command add_compare(CLI::App& root, const GlobalOptions& global);
// `cemfrac finetune` (cli/finetune.cpp): a classification head on a checkpoint, GLUE's metrics.
Command add_finetune(CLI::App& root, const GlobalOptions& global);
// `cemfrac export` / `cemfrac import` (cli/hf.cpp): Hugging Face transformers directories.
Command add_export(CLI::App& root, const GlobalOptions& global);
Command add_import(CLI::App& root, const GlobalOptions& global);

}  // namespace cemfrac::cli

// cemfrac: one CLI for preparing data, training, evaluating and benchmarking CEM / CoFrGeNet
// language models. main() chooses the BLAS kernels first (that may re-execute the program once),
// then parses flags and runs one subcommand. Every user error ends as one line on stderr and a
// non-zero exit.
#include <ATen/Context.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <regex>
#include <string>
#include <vector>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/device.h"
#include "cemfrac/core/warn.h"
#include "cli/build_info.h"
#include "cli/commands.h"

namespace {

// --blas-core must be known before CLI11 runs (before any matmul), so it is read from argv here
// too.
std::string find_blas_core_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--blas-core") == 0 && i + 1 < argc) return argv[i + 1];
    if (std::strncmp(a, "--blas-core=", 12) == 0) return a + 12;
  }
  return "";
}

// The first positional word when it names no subcommand ("cemfrac trian ..."), else "".
std::string unknown_command(int argc, char** argv, const CLI::App& app) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" || a == "--blas-core" || a == "--device") {
      ++i;  // skip the option's value
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->check_name(a)) return "";
    }
    return a;
  }
  return "";
}

// --threads may exceed the core count by this factor (with a warning above the count).
constexpr int kMaxThreadsPerCore = 4;

std::string memory_advice() {
  const double total = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return fmt::format(
      "this machine has {:.1f} GiB; use a smaller model, train.micro_batch or "
      "train.seq_len (cemfrac params shows a model's size)",
      total / (1u << 30));
}

// LibTorch's allocation failures and size overflows as one user-facing line; "" for other errors.
std::string resource_error(const std::string& what) {
  static const std::regex kAlloc("tried to allocate ([0-9]+) bytes");
  std::smatch m;
  if (std::regex_search(what, m, kAlloc)) {
    const double bytes = std::stod(m[1].str());
    return fmt::format("out of memory: one allocation of {:.1f} GiB failed; {}", bytes / (1u << 30),
                       memory_advice());
  }
  if (what.find("can't allocate memory") != std::string::npos ||
      what.find("out of memory") != std::string::npos)
    return "out of memory: " + memory_advice();
  if (what.find("size calculation overflowed") != std::string::npos)
    return "a tensor size overflows 64 bits: some dimension of the model or batch is far too large";
  return "";
}

// "filesystem error: cannot create directories: Permission denied [/proc/x]" ->
// "/proc/x: cannot create directories: Permission denied".
std::string filesystem_line(const std::filesystem::filesystem_error& e) {
  std::string what = e.what();
  const std::string prefix = "filesystem error: ";
  if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
  const size_t bracket = what.find(" [");
  if (bracket != std::string::npos) what = what.substr(0, bracket);
  if (e.path1().empty()) return what;
  return e.path1().string() + ": " + what;
}

int report(const char* kind, const std::string& what) {
  std::string line = what.substr(0, what.find('\n'));
  std::fprintf(stderr, "cemfrac: %s%s\n", kind, line.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cemfrac;
  cli::GlobalOptions global;
  CLI::App app{
      "cemfrac: train, evaluate and run CEM and CoFrGeNet language models (and GPT-2 / Llama "
      "baselines) on CPU (--device for others)"};
  app.set_version_flag("--version",
                       fmt::format("cemfrac {} (commit {})", CEMFRAC_VERSION, cli::build_commit()));
  app.require_subcommand(1);
  app.fallthrough();
  app.add_option("--threads", global.threads,
                 "Intra-op and BLAS threads (default: number of cores; at most 4 x the cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--blas-core", global.blas_core,
                 "OpenBLAS kernel set: auto (from the CPU flags; also ignores OPENBLAS_CORETYPE), "
                 "Prescott, Nehalem, Sandybridge, Haswell, Zen, SkylakeX, Cooperlake");
  app.add_flag("--flush-denormal", global.flush_denormal,
               "Treat subnormal floats as 0 (the CPU's FTZ and DAZ modes, set before any thread "
               "starts, which inherit it): arithmetic on them is many times slower on x86, e.g. "
               "in exp() of very negative attention scores; changes results by < 1e-38 per value");

  app.add_option("--device", global.device,
                 "Where to compute: cpu (default), cuda, cuda:N, or meta (a dry run of shapes: "
                 "everything runs up to the first value that must be read); overrides the run "
                 "config's train.device");

  std::vector<cli::Command> commands = {
      cli::add_info(app, global),   cli::add_tokenize(app, global), cli::add_prepare(app, global),
      cli::add_bench(app, global),  cli::add_params(app, global),   cli::add_train(app, global),
      cli::add_launch(app, global), cli::add_eval(app, global),     cli::add_generate(app, global),
      cli::add_gp(app, global),     cli::add_compare(app, global),  cli::add_finetune(app, global),
      cli::add_export(app, global), cli::add_import(app, global),
  };

  // An unknown command is a usage error also with --help or --version after it ("cemfrac finetune
  // --help"): a script must be able to tell that the command does not exist.
  auto refuse_unknown = [&]() -> bool {
    const std::string unknown = unknown_command(argc, argv, app);
    if (unknown.empty()) return false;
    std::fprintf(stderr, "cemfrac: error: unknown command '%s' (see cemfrac --help)\n",
                 unknown.c_str());
    return true;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return refuse_unknown() ? 2 : app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return refuse_unknown() ? 2 : app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return refuse_unknown() ? 2 : app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (!refuse_unknown())
      std::fprintf(stderr, "cemfrac: error: %s (see cemfrac --help)\n", e.what());
    return 2;
  }

  try {
    // More threads than cores only slows a CPU-bound run; thousands of them take minutes to start.
    const int cores = default_threads();
    const int max_threads = kMaxThreadsPerCore * cores;
    CEMFRAC_CHECK(
        global.threads <= max_threads,
        "--threads {}: at most {} ({} x the {} core(s) of this machine; 0 = one per core)",
        global.threads, max_threads, kMaxThreadsPerCore, cores);
    if (global.flush_denormal)
      CEMFRAC_CHECK(at::globalContext().setFlushDenormal(true),
                    "--flush-denormal: this CPU cannot flush subnormal floats to zero");
    configure_blas(argv, find_blas_core_flag(argc, argv));
    if (global.threads > cores)
      warn(
          "--threads {} is more than the {} core(s) of this machine: threads will share cores, "
          "which is slower, not faster",
          global.threads, cores);
    set_threads(global.threads);
    if (!global.device.empty()) parse_device(global.device, "--device");  // one line, before work
    for (auto& command : commands)
      if (command.app->parsed()) return command.run();
    return report("error: ", "no subcommand given (see cemfrac --help)");
  } catch (const Error& e) {
    return report("error: ", e.what());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (is_meta_read_error(what)) return report("error: ", meta_dry_run_message(what));
    if (const std::string line = resource_error(what); !line.empty())
      return report("error: ", line);
    return report("internal error: ", what);
  } catch (const std::bad_alloc&) {
    return report("error: ", "out of memory: " + memory_advice());
  } catch (const std::filesystem::filesystem_error& e) {
    return report("error: ", filesystem_line(e));
  } catch (const std::exception& e) {
    return report("internal error: ", e.what());
  }
}

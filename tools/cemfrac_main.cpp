// cemfrac: one CLI for preparing data, training, evaluating and benchmarking CEM / CoFrGeNet language
// models. main() chooses the BLAS kernels first (that may re-execute the program once), then parses
// flags and runs one subcommand. Every user error ends as one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cli/commands.h"

namespace {

// --blas-core must be known before CLI11 runs (before any matmul), so it is read from argv here too.
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
    if (a == "--threads" || a == "--blas-core") {
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

int report(const char* kind, const std::string& what) {
  std::string line = what.substr(0, what.find('\n'));
  std::fprintf(stderr, "cemfrac: %s%s\n", kind, line.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cemfrac;
  cli::GlobalOptions global;
  CLI::App app{"cemfrac: train, evaluate and run CEM and CoFrGeNet language models (and GPT-2 / Llama "
               "baselines) on CPU"};
  app.set_version_flag("--version", std::string("cemfrac ") + CEMFRAC_VERSION);
  app.require_subcommand(1);
  app.fallthrough();
  app.add_option("--threads", global.threads, "Intra-op and BLAS threads (default: number of cores)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--blas-core", global.blas_core,
                 "OpenBLAS kernel set: auto (from the CPU flags; also ignores OPENBLAS_CORETYPE), "
                 "Prescott, Nehalem, Sandybridge, Haswell, Zen, SkylakeX, Cooperlake");

  std::vector<cli::Command> commands = {
      cli::add_info(app, global),
      cli::add_tokenize(app, global),
      cli::add_prepare(app, global),
      cli::add_bench(app, global),
      cli::add_params(app, global),
      cli::add_train(app, global),
      cli::add_eval(app, global),
      cli::add_generate(app, global),
      cli::add_gp(app, global),
      cli::add_compare(app, global),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string unknown = unknown_command(argc, argv, app);
    if (!unknown.empty()) {
      std::fprintf(stderr, "cemfrac: error: unknown command '%s' (see cemfrac --help)\n",
                   unknown.c_str());
    } else {
      std::fprintf(stderr, "cemfrac: error: %s (see cemfrac --help)\n", e.what());
    }
    return 2;
  }

  try {
    configure_blas(argv, find_blas_core_flag(argc, argv));
    set_threads(global.threads);
    for (auto& command : commands)
      if (command.app->parsed()) return command.run();
    return report("error: ", "no subcommand given (see cemfrac --help)");
  } catch (const Error& e) {
    return report("error: ", e.what());
  } catch (const c10::Error& e) {
    return report("internal error: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report("internal error: ", e.what());
  }
}

// PLACEHOLDER: being written (issue in progress).
#include "cemfrac/core/check.h"
#include "cli/commands.h"
namespace cemfrac::cli {
Command add_prepare(CLI::App& root, const GlobalOptions&) {
  CLI::App* app = root.add_subcommand("prepare", "(in progress)");
  return {app, [] { fail("'prepare' is not implemented yet"); return 1; }};
}
}  // namespace cemfrac::cli

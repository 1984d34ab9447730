// cemfrac compare --suite FILE: the flags of the suite engine (cemfrac/compare/engine.h, which
// trains and evaluates a suite of runs and tests its claims; format in docs/compare.md).
#include <filesystem>
#include <memory>

#include "cemfrac/compare/engine.h"
#include "cli/build_info.h"
#include "cli/commands.h"

namespace cemfrac::cli {

Command add_compare(CLI::App& root, const GlobalOptions& global) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* app = root.add_subcommand(
      "compare", "Train and evaluate a suite of runs (configs/suites/*.toml) and test its claims");
  app->add_option("--suite", o->suite,
                  "Suite file (TOML: [suite], [[run]], [[claim]]; docs/compare.md)")
      ->required();
  app->add_option("--out", o->out, "Output folder (default runs/suites/<suite name>)");
  app->add_option("--jobs", o->jobs,
                  "Trainings/evaluations at once; --threads is split between them")
      ->check(CLI::Range(1, 64));
  app->add_option("--eval-text", o->eval_text,
                  "Also evaluate every final run on this text file (repeatable)");
  app->add_flag("--plan", o->plan_only, "Print the plan (with the timed steps) and stop");
  app->add_flag("--report", o->report_only,
                "Write the report from the jobs finished so far and run nothing (results.md says "
                "how many final runs it holds)")
      ->excludes("--plan");
  const GlobalOptions* g = &global;
  auto run = [o, g]() {
    CompareOptions options = *o;
    options.threads = g->threads;
    options.flush_denormal = g->flush_denormal;
    options.device = g->device;
    options.exe = std::filesystem::read_symlink("/proc/self/exe").string();
    options.commit = build_commit();  // the binary's, not the working directory's
    return run_compare(options);
  };
  return {app, run};
}

}  // namespace cemfrac::cli

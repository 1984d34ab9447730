// `cemfrac compare --suite FILE`, the whole of it: trains and evaluates a suite of runs
// (configs/suites/*.toml, format in docs/compare.md) and tests its claims. Every training and
// evaluation is a child process of the cemfrac binary (`cemfrac train` / `eval` / `gp --one`,
// runner.h), so each job is exactly what a user would run by hand, keeps its own log, checkpoints
// and exact resume, and a crash or Ctrl-C in one job loses nothing else. Everything is written
// under the output folder.
//
//   1. plan:   a 3-step timed training of every run (s/token), the budget and the estimated time;
//   2. lr:     each run that chooses its own learning rate trains at every grid value for
//              lr_search_tokens with its first seed; the lowest final validation loss wins;
//   3. final:  every run at its full budget with each of its seeds (seed = init and data order);
//   4. eval:   every final run on the eval split, each test-time variant, and each eval text;
//   5. report: results.json, results.md (mean ± sd over seeds, claims with paired 95% intervals
//              and verdicts) and plots/*.svg.
//
// A finished job is reused, an interrupted training resumed; a job whose settings changed is
// refused. A row with task = "gp" is a GP in-context regression model instead (docs/compare.md,
// "GP runs"): its job is `cemfrac gp --one`, which trains it and scores the validation set (the
// grid) or the validation and test sets at every evaluated T (final runs) itself.
#pragma once
#include <string>
#include <vector>

namespace cemfrac {

struct CompareOptions {
  std::string suite;                   // the suite file
  std::string out;                     // "" = runs/suites/<suite name>
  int jobs = 1;                        // children at once; the threads are split between them
  std::vector<std::string> eval_text;  // more eval texts besides the suite's
  bool plan_only = false;              // print the plan (with the timed steps) and stop
  bool report_only = false;            // write the report from what is finished, run nothing
  // The invocation's global flags (every child gets them) and the binary that runs the children.
  int threads = 0;  // 0 = every hardware thread
  bool flush_denormal = false;
  std::string device;  // --device of this invocation, passed to every job ("" = each run's own)
  std::string exe;     // the cemfrac binary
  std::string commit;  // its commit (logs and the report's provenance)
};

// Runs the suite; returns the exit code (0). Errors are cemfrac::Error, one line each.
int run_compare(const CompareOptions& options);

}  // namespace cemfrac

// A comparison suite (`cemfrac compare --suite FILE`, configs/suites/*.toml): the runs to train,
// their budget, seeds and learning-rate grid, the eval sets, and the claims to test. The format is
// documented in docs/compare.md; every problem in a file is one cemfrac::Error naming file:line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cemfrac {

// An evaluation of a trained run with fields changed at test time (e.g. model.cem.steps=4).
struct SuiteVariant {
  std::string name;               // "T=4"
  std::vector<std::string> sets;  // passed to `cemfrac eval --set`
  int64_t cem_steps = 0;          // > 0 when the variant only sets model.cem.steps (steps plot)
};

struct SuiteRun {
  std::string name;
  std::string config;             // run config TOML path (relative to the working directory)
  std::vector<std::string> sets;  // the suite's `set`, then the run's own
  int64_t tokens = 0;             // final training budget (the suite's unless the run names one)
  std::vector<uint64_t> seeds;    // the suite's unless the run names its own
  std::vector<double> lr;         // the learning-rate grid (the suite's unless the run names one)
  std::string lr_from;            // take the learning rate another run chose ("" = choose own)
  std::vector<SuiteVariant> variants;  // test-time variants evaluated on every final run
};

// A claim: every run of `a` against `b` on `metric` (lower is better), paired over common seeds.
struct SuiteClaim {
  std::string id;
  std::string text;
  std::string source;
  std::vector<std::string> a;  // "run" or "run@variant"
  std::string b;
  std::string test = "better";       // "better": a < b; "not_worse": a < b + margin
  double margin = 0;                 // nats per token (not_worse)
  std::string metric = "test_loss";  // test_loss, val_loss, or text_loss:<name>
};

struct Suite {
  std::string path;  // the file
  std::string name;
  std::string description;
  std::string data = "data/brown";  // prepared dataset (training, validation, the test split)
  std::string eval_split = "test";
  std::vector<std::string> eval_text;  // extra text files evaluated on every final run
  int64_t lr_search_tokens = 0;        // budget of each learning-rate grid run
  double lr_min_ratio = 0.1;           // lr_min = ratio * lr_max
  int64_t val_points = 8;              // validation evaluations per final run (the loss curve)
  std::vector<SuiteRun> runs;
  std::vector<SuiteClaim> claims;

  const SuiteRun& run(const std::string& name) const;
};

// Reads and checks a suite file. Run configs and --set texts are checked by load_run_config, so a
// bad override fails here, before anything trains.
Suite load_suite(const std::string& path);

// "run@variant" -> {"run", "variant"}; "run" -> {"run", ""}.
std::pair<std::string, std::string> split_row(const std::string& row);

}  // namespace cemfrac

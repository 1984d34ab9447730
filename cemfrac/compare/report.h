// A suite's report from its results: results.json (every run, seed and claim pair), results.md
// (the runs' tables with mean ± sd over seeds, the learning-rate search, the test-time variants,
// the claims with their paired 95% intervals and verdicts) and the plots (SVG). Pure: it reads
// nothing and writes nothing.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/compare/plan.h"
#include "cemfrac/compare/results.h"
#include "cemfrac/compare/stats.h"
#include "cemfrac/compare/suite.h"

namespace cemfrac {

struct Report {
  nlohmann::json results;
  std::string markdown;
  std::map<std::string, std::string> plots;  // file name -> SVG
};

// `provenance`: command, machine, date, commit, version, wall_time, final_runs and
// final_runs_finished (fewer finished than planned makes it a partial report);
// `train_split_tokens`: the LM dataset's training split (the epochs column).
Report make_report(const Suite& suite, const std::vector<RunPlan>& plans, SuiteResults results,
                   int64_t train_split_tokens, const nlohmann::json& provenance);

// "mean ± sd" of a table cell ("—" without values, the mean alone for one).
std::string pm(const MeanSd& m, const char* fmt_spec = "{:.3f}");

}  // namespace cemfrac

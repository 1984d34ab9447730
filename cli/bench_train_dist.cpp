// cemfrac bench train --nproc N: data-parallel scaling on this machine. Three real
// training runs of the same config and the same global batch (N x micro_batch x seq_len tokens per
// step):
//   dp      N ranks x 1 thread   (cemfrac launch --nproc N -- --threads 1 train ...)
//   1x1     1 rank  x 1 thread   (N accumulation micro-batches per step)
//   1xN     1 rank  x N threads  (likewise)
// each for warmup + steps optimizer steps on the config's prepared data. The rate of a run is the
// median over the timed steps of metrics.jsonl's tokens_per_s (global tokens over the step's wall
// time, evaluation and checkpoints excluded). The dp run also reports its all-reduce time per step
// (the gradient and loss reductions, including any wait for the slower rank) and the part of it
// that was exposed (the training thread waiting after backward); with train.dist_overlap (the
// default) the rest overlapped the backward pass. --set train.dist_overlap=false measures the
// after-backward path.
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/train/run_config.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/peer_util.h"

namespace cemfrac::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string name;
  double tokens_per_s = 0;
  double allreduce_ms = -1;  // dp only
  double exposed_ms = -1;    // dp only
};

}  // namespace

namespace {

// Runs `exe args` with its output in <tmp>/<name>.out; a failure removes tmp and names the run's
// error line.
void run_case(const std::string& exe, const std::vector<std::string>& args, const fs::path& tmp,
              const std::string& name) {
  // Not "/proc/self/exe" itself: std::system runs the line through /bin/sh, where that names the
  // shell.
  std::string cmd = quote_for_shell(exe);
  for (const auto& a : args) cmd += " " + quote_for_shell(a);
  const std::string out = (tmp / (name + ".out")).string();
  cmd += " >" + quote_for_shell(out) + " 2>&1";
  if (std::system(cmd.c_str()) == 0) return;
  const std::string text = slurp(out);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fail("bench train --nproc: the {} run failed: {}", name,
       text.substr(
           0, text.find('\n', text.rfind("error") == std::string::npos ? 0 : text.rfind("error"))));
}

// One run's median tokens/s after the warm-up (metrics.jsonl) and its all-reduce times (the
// train command's last lines, in <name>.out).
Case read_case(const fs::path& tmp, const std::string& name, int warmup) {
  Case c;
  c.name = name;
  std::vector<double> rates;
  std::istringstream lines(slurp((tmp / name / "metrics.jsonl").string()));
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (j["step"].get<int64_t>() > warmup) rates.push_back(j["tokens_per_s"].get<double>());
  }
  CEMFRAC_CHECK(!rates.empty(), "bench train --nproc: no timed steps in the {} run", name);
  c.tokens_per_s = summarize_times(rates).median_ms;  // the median of the values
  const std::string text = slurp((tmp / (name + ".out")).string());
  if (const size_t at = text.find("all-reduce "); at != std::string::npos) {
    const size_t ms = text.find("ms/step", at);
    if (ms != std::string::npos) {
      const size_t open = text.rfind('(', ms);
      c.allreduce_ms = std::atof(text.substr(open + 1, ms - open - 1).c_str());
    }
    if (const size_t e = text.find("exposed ", at); e != std::string::npos)
      c.exposed_ms = std::atof(text.c_str() + e + 8);
  }
  return c;
}

// The human-readable table of one run_train_bench_nproc.
void print_dp_bench(const json& j) {
  const int nproc = j["nproc"].get<int>();
  const double dp = j["tokens_per_s"]["dp"].get<double>(),
               one = j["tokens_per_s"]["1x1"].get<double>(),
               many = j["tokens_per_s"][fmt::format("1x{}", nproc)].get<double>();
  const double overlap = j["allreduce_overlap_with_backward"].get<double>();
  const std::string config = j["config"].get<std::string>();
  const int64_t global_tokens = j["global_tokens_per_step"].get<int64_t>();
  const int steps = j["steps"].get<int>(), warmup = j["warmup"].get<int>();
  const bool dist_overlap = j["dist_overlap"].get<bool>();
  const double allreduce_ms = j["allreduce_ms_per_step"].get<double>(),
               exposed_ms = j["allreduce_exposed_ms_per_step"].get<double>();
  fmt::print(
      "bench train --nproc {} ({}; global batch {} tokens; median of {} steps after {} warm-up)\n",
      nproc, config, global_tokens, steps, warmup);
  fmt::print("  {:<14} {:>12}\n", "run", "tokens/s");
  fmt::print("  {:<14} {:>12.0f}\n", fmt::format("{} ranks x 1", nproc), dp);
  fmt::print("  {:<14} {:>12.0f}\n", "1 rank x 1", one);
  fmt::print("  {:<14} {:>12.0f}\n", fmt::format("1 rank x {}", nproc), many);
  fmt::print("speed-up over 1x1 {:.2f} (scaling efficiency {:.0f}%), over 1x{} {:.2f}\n", dp / one,
             100 * dp / (one * nproc), nproc, dp / many);
  fmt::print(
      "all-reduce {:.1f} ms/step, exposed {:.1f} ms/step (waiting after backward): {:.0f}% "
      "overlapped with backward (train.dist_overlap = {})\n",
      allreduce_ms, exposed_ms, 100 * overlap, dist_overlap);
  fmt::print(
      "(targets: >= 1.8x over 1x1 and not slower than 1x{}; measure on a quiet "
      "machine)\n",
      nproc);
}

}  // namespace

int run_train_bench_nproc(const std::string& config, const std::vector<std::string>& sets,
                          int nproc, int steps, int warmup, bool as_json) {
  CEMFRAC_CHECK(nproc >= 2, "--nproc {} must be at least 2", nproc);
  const RunConfig rc = load_run_config(config, sets);
  const int64_t S = rc.train.seq_len > 0 ? rc.train.seq_len : rc.model.context;
  const int64_t global_tokens = nproc * rc.train.micro_batch * S;
  CEMFRAC_CHECK(fs::exists(fs::path(rc.data.path) / "meta.json"),
                "bench train --nproc trains on the config's data: data.path '{}' is not a prepared "
                "dataset (run cemfrac prepare --out {} first)",
                rc.data.path, rc.data.path);
  std::string tmpl = (fs::temp_directory_path() / "cemfrac-bench-dp-XXXXXX").string();
  CEMFRAC_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot create a temporary directory");
  const fs::path tmp = tmpl;

  auto train_args = [&](const std::string& name) {
    std::vector<std::string> a = {"train",   "--config", config,
                                  "--quiet", "--out",    (tmp / name).string()};
    for (const auto& s : sets) a.insert(a.end(), {"--set", s});
    for (const std::string& s :
         {fmt::format("train.steps={}", warmup + steps),
          fmt::format("train.tokens_per_step={}", global_tokens), std::string("train.eval_every=0"),
          fmt::format("train.eval_tokens={}", S), std::string("train.checkpoint_every=0"),
          std::string("train.log_every=1"), std::string("train.keep_checkpoints=1")})
      a.insert(a.end(), {"--set", s});
    return a;
  };
  struct Spec {
    std::string name;
    std::vector<std::string> prefix;
  };
  const std::vector<Spec> specs = {
      {"dp",
       {"--threads", "1", "launch", "--nproc", std::to_string(nproc), "--", "--threads", "1"}},
      {"1x1", {"--threads", "1"}},
      {fmt::format("1x{}", nproc), {"--threads", std::to_string(nproc)}},
  };
  std::error_code exe_ec;
  const std::string self_exe = fs::read_symlink("/proc/self/exe", exe_ec).string();
  CEMFRAC_CHECK(!exe_ec,
                "bench train --nproc: cannot find this program's path (/proc/self/exe: {})",
                exe_ec.message());
  std::vector<Case> cases;
  for (const Spec& spec : specs) {
    std::vector<std::string> args = spec.prefix;
    for (const auto& x : train_args(spec.name)) args.push_back(x);
    if (!as_json) fmt::print(stderr, "running {} ...\n", spec.name);
    run_case(self_exe, args, tmp, spec.name);
    cases.push_back(read_case(tmp, spec.name, warmup));
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);

  const double dp = cases[0].tokens_per_s, one = cases[1].tokens_per_s,
               many = cases[2].tokens_per_s;
  // Fraction of the all-reduce time hidden behind backward.
  const double overlap = cases[0].allreduce_ms > 0 && cases[0].exposed_ms >= 0
                             ? std::max(0.0, 1.0 - cases[0].exposed_ms / cases[0].allreduce_ms)
                             : 0.0;
  json j = {{"bench", "train_dp"},
            {"config", config},
            {"nproc", nproc},
            {"global_tokens_per_step", global_tokens},
            {"steps", steps},
            {"warmup", warmup},
            {"tokens_per_s", {{"dp", dp}, {"1x1", one}, {cases[2].name, many}}},
            {"speedup_vs_1x1", dp / one},
            {"scaling_efficiency", dp / (one * nproc)},
            {"dp_vs_1xN", dp / many},
            {"dist_overlap", rc.train.dist_overlap},
            {"allreduce_ms_per_step", cases[0].allreduce_ms},
            {"allreduce_exposed_ms_per_step", cases[0].exposed_ms},
            {"allreduce_overlap_with_backward", overlap}};
  if (as_json) {
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  print_dp_bench(j);
  return 0;
}

}  // namespace cemfrac::cli

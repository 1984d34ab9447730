#include "cemfrac/compare/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cemfrac/compare/plan.h"
#include "cemfrac/compare/report.h"
#include "cemfrac/compare/results.h"
#include "cemfrac/compare/run_files.h"
#include "cemfrac/compare/runner.h"
#include "cemfrac/compare/suite.h"
#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/train/run_dir.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/core/format_util.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/run_config.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string machine_text() {
  std::string cpu;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  return fmt::format("{}, {} cores, BLAS core {}; load average {:.2f} at the end",
                     cpu.empty() ? "?" : cpu, std::thread::hardware_concurrency(),
                     blas_status().core, load[0]);
}

std::string report_date() {  // "2026-12-04 01:23 UTC", as the reports print it
  return utc_now("%Y-%m-%d %H:%M UTC");
}

}  // namespace

int run_compare(const CompareOptions& o) {
  const auto wall_start = Clock::now();
  Suite suite = load_suite(o.suite);
  for (const std::string& t : o.eval_text) suite.eval_text.push_back(t);
  std::set<std::string> stems;
  for (const std::string& t : suite.eval_text) {
    CEMFRAC_CHECK(fs::is_regular_file(t), "eval text '{}' not found", t);
    CEMFRAC_CHECK(stems.insert(stem(t)).second, "two eval texts named '{}'", stem(t));
  }
  for (const SuiteClaim& c : suite.claims)
    if (c.metric.rfind("text_loss:", 0) == 0)
      CEMFRAC_CHECK(stems.count(c.metric.substr(10)), "claim '{}': metric {} names no eval text",
                    c.id, c.metric);
  // The prepared dataset is for LM runs; a suite of GP runs only needs none.
  int64_t train_tokens = 0, eval_tokens = 0;
  if (suite.has_task("lm")) {
    const auto meta = read_json(suite.data + "/meta.json");
    CEMFRAC_CHECK(meta.has_value(),
                  "{}/meta.json not found: prepare the data first (cemfrac prepare --corpus "
                  "brown --tokenizer sp:4096 --out {})",
                  suite.data, suite.data);
    train_tokens = (*meta)["splits"]["train"].value("tokens", int64_t{0});
    eval_tokens = (*meta)["splits"][suite.eval_split].value("tokens", int64_t{0});
  }
  const std::string out = o.out.empty() ? "runs/suites/" + suite.name : o.out;
  const int total_threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, total_threads / o.jobs);
  // One writer per suite folder, before anything is written there (the kernel drops the lock when
  // this process dies, however it dies); a second compare on it is refused naming this one.
  const DirLock lock = DirLock::acquire(out, "compare");
  install_stop_signals();
  // Numerics flags of this invocation go to every job (a child process starts with the CPU's
  // default floating-point mode).
  std::vector<std::string> job_globals;
  if (o.flush_denormal) job_globals.push_back("--flush-denormal");
  // Every job computes where the suite was asked to (the suite's runs may set train.device too).
  if (!o.device.empty()) job_globals.insert(job_globals.end(), {"--device", o.device});
  Runner runner(o.exe, o.jobs, threads, suite.name,
                fmt::format("cemfrac {} (commit {})", CEMFRAC_VERSION, o.commit), job_globals);

  // 1. Plan: a timed 3-step training of every run (timings of another machine taken again).
  if (!o.report_only) {
    const std::string discarded = discard_other_machines_timings(out, machine_key());
    if (!discarded.empty()) fmt::print("{}\n", discarded);
  }
  std::vector<RunPlan> plans;
  std::vector<Job> timing;
  std::vector<std::string>
      reused_timings;                // timed by an earlier invocation: their rate is not "now"
  std::vector<std::string> retimed;  // timed earlier with other settings: timed again
  for (const SuiteRun& r : suite.runs) {
    RunPlan p;
    p.run = &r;
    if (r.task == "gp") {
      // Timing: 3 steps without validation or test sets, on the GP jobs' threads.
      p.gp = true;
      plans.push_back(p);
      const GpSpec t = make_gp(suite, r, "time " + r.name,
                               fmt::format("{}/plan/{}-t{}", out, r.name, suite.gp.threads), 3,
                               r.lr.empty() ? 1e-3 : r.lr.front(), 1, 0, false);
      if (o.report_only) continue;  // runs nothing, writes nothing but the report
      if (drop_stale_timing(t.dir, gp_settings(t))) retimed.push_back(r.name);
      if (auto j = gp_job(t, suite.gp, 0)) {
        j->est_s = 1;
        timing.push_back(*j);
      } else {
        reused_timings.push_back(r.name);
      }
      continue;
    }
    const RunConfig c = load_run_config(r.config, r.sets);
    p.per_step = tokens_per_step(c);
    p.params = LmModel(c.model, torch::kMeta)->num_parameters();
    plans.push_back(p);
    TrainSpec t = make_train(r, suite.data, "time " + r.name,
                             fmt::format("{}/plan/{}-t{}", out, r.name, threads), 3 * p.per_step,
                             r.lr.empty() ? 1e-3 : r.lr.front(), suite.lr_min_ratio, 1, 1,
                             {fmt::format("train.eval_tokens={}", p.per_step)});
    if (o.report_only) continue;
    if (drop_stale_timing(t.dir, train_settings(t))) retimed.push_back(r.name);
    if (auto j = train_job(t, 0)) {
      j->est_s = 1;
      timing.push_back(*j);
    } else {
      reused_timings.push_back(r.name);
    }
  }
  if (!retimed.empty())
    fmt::print("plan: timing {} again: the suite changed their settings since they were timed\n",
               fmt::join(retimed, ", "));
  if (!timing.empty() && !o.report_only) {
    fmt::print("timing 3 training steps of each run ({} thread(s) each)...\n", threads);
    std::fflush(stdout);
  }
  runner.run(timing, "timing");
  for (RunPlan& p : plans) {
    if (p.gp) {
      const auto j = read_json(
          gp_result_path(fmt::format("{}/plan/{}-t{}", out, p.run->name, suite.gp.threads)));
      if (j) {
        p.params = j->value("params", int64_t{0});
        const double train_s = j->value("train_s", 0.0);
        const int64_t done = std::max<int64_t>(1, j->value("steps_done", int64_t{1}));
        p.s_per_step = train_s / static_cast<double>(done);
      }
      continue;
    }
    const auto m =
        read_jsonl(fmt::format("{}/plan/{}-t{}/metrics.jsonl", out, p.run->name, threads));
    double rate = 0;
    for (const json& line : m)
      if (line["tokens_per_s"].is_number())
        rate = line["tokens_per_s"].get<double>();  // the last step
    p.s_per_token = rate > 0 ? 1 / rate : 0;
  }

  // Estimates: training tokens at the measured rate; validation and test scoring as forward
  // passes (a third of a training step per token, twice the tokens for half-overlapping windows).
  auto val_cost = [&](const RunPlan& p, int64_t points) {
    const RunConfig c = load_run_config(p.run->config, p.run->sets);
    return static_cast<double>(points) * static_cast<double>(c.train.eval_tokens) * p.s_per_token /
           3;
  };
  const double eval_cost_tokens = 2.0 * static_cast<double>(eval_tokens) / 3;
  double search_s = 0, final_s = 0, eval_s = 0;
  std::string table = fmt::format("{:<24} {:>11} {:>9} {:>11} {:>8} {:>5} {:>22} {:>9}\n", "run",
                                  "params", "tok/step", "tokens", "epochs", "seeds", "lr", "est.");
  // GP: steps at the measured rate; a forward pass over a sequence as a third of a training step
  // per sequence of the batch, at T' / T of the cost for a model evaluated at T' (the CEM steps
  // dominate).
  auto gp_eval_s = [&](const RunPlan& p, int64_t val_seqs, bool test) {
    const double fwd = p.s_per_step / 3 / static_cast<double>(suite.gp.batch);
    double test_runs = 1;
    for (const SuiteVariant& v : p.run->variants)
      if (v.cem_steps != p.run->gp.T)
        test_runs += static_cast<double>(v.cem_steps) / static_cast<double>(p.run->gp.T);
    return fwd * (static_cast<double>(val_seqs) +
                  (test ? static_cast<double>(suite.gp.test_seqs) * test_runs : 0.0));
  };
  auto gp_search_job_s = [&](const RunPlan& p) {
    return static_cast<double>(suite.gp.search_steps) * p.s_per_step +
           gp_eval_s(p, suite.gp.val_seqs, false);
  };
  auto gp_final_job_s = [&](const RunPlan& p) {
    return static_cast<double>(p.run->gp.steps) * p.s_per_step +
           gp_eval_s(p, suite.gp.val_seqs, true);
  };
  std::string gp_table =
      fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n", "GP run", "params",
                  "model", "variant", "T", "steps", "seeds", "lr", "est.");
  // What is left: the jobs an earlier invocation finished are not (a resumed one counts in full).

  double left_s = 0;
  size_t grid_n = 0, grid_done_n = 0, final_n = 0, final_done_n = 0;
  auto count_left = [&](const RunPlan& p, double search, double fin) {
    const SuiteRun& r = *p.run;
    if (search > 0) {
      size_t done = 0;
      for (double lr : r.lr) done += run_finished(p, lr_dir(out, r, lr));
      grid_n += r.lr.size();
      grid_done_n += done;
      left_s += search * static_cast<double>(r.lr.size() - done) / static_cast<double>(r.lr.size());
    }
    size_t done = 0;
    for (uint64_t seed : r.seeds) done += run_finished(p, final_dir(out, r, seed));
    final_n += r.seeds.size();
    final_done_n += done;
    left_s +=
        fin * static_cast<double>(r.seeds.size() - done) / static_cast<double>(r.seeds.size());
  };
  for (const RunPlan& p : plans) {
    const SuiteRun& r = *p.run;
    std::string lr = !r.lr_from.empty() ? "from " + r.lr_from
                     : r.lr.size() == 1 ? lr_text(r.lr[0])
                                        : fmt::format("grid of {}", r.lr.size());
    if (p.gp) {
      const double search = r.lr_from.empty() && r.lr.size() > 1
                                ? static_cast<double>(r.lr.size()) * gp_search_job_s(p)
                                : 0;
      const double fin = static_cast<double>(r.seeds.size()) * gp_final_job_s(p);
      search_s += search;
      final_s += fin;
      count_left(p, search, fin);
      const bool cem = r.gp.model == "cem";
      gp_table += fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n", r.name,
                              with_commas(p.params), r.gp.model, cem ? r.gp.variant : "-",
                              cem ? std::to_string(r.gp.T) : "-", with_commas(r.gp.steps),
                              r.seeds.size(), lr, format_duration((fin + search) / o.jobs));
      continue;
    }
    const int64_t tokens = ((r.tokens + p.per_step - 1) / p.per_step) * p.per_step;
    const double fin =
        static_cast<double>(r.seeds.size()) *
        (static_cast<double>(tokens) * p.s_per_token + val_cost(p, suite.val_points + 1));
    const double search =
        r.lr_from.empty() && r.lr.size() > 1
            ? static_cast<double>(r.lr.size()) *
                  (static_cast<double>(suite.lr_search_tokens) * p.s_per_token + val_cost(p, 2))
            : 0;
    const double ev = static_cast<double>(r.seeds.size()) * p.s_per_token *
                      (eval_cost_tokens * static_cast<double>(1 + r.variants.size()));
    search_s += search;
    final_s += fin;
    eval_s += ev;
    count_left(p, search, fin + ev);
    table += fmt::format(
        "{:<24} {:>11} {:>9} {:>11} {:>8.2f} {:>5} {:>22} {:>9}\n", r.name, with_commas(p.params),
        p.per_step, with_commas(tokens),
        train_tokens ? static_cast<double>(tokens) / static_cast<double>(train_tokens) : 0,
        r.seeds.size(), lr, format_duration((fin + search + ev) / o.jobs));
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  if (!o.report_only) {
    fmt::print("suite {} ({}) -> {}\n{}\n\n", suite.name, suite.path, out, suite.description);
    if (suite.has_task("lm")) fmt::print("{}\n", table);
    if (suite.has_task("gp"))
      fmt::print(
          "{}(GP jobs: {} thread(s) each; their validation and test sets are scored inside the "
          "job, in its estimate)\n\n",
          gp_table, suite.gp.threads);
    std::string timed_when;
    if (reused_timings.empty()) {
      timed_when = fmt::format("timed now (load average {:.2f})", load[0]);
    } else {
      timed_when = fmt::format(
          "{} of {} timed by an earlier invocation and reused ({}; delete {}/plan to time them "
          "again), "
          "load average now {:.2f}",
          reused_timings.size(), plans.size(), fmt::join(reused_timings, ", "), out, load[0]);
    }
    fmt::print(
        "estimated time: {} (learning-rate search {}, final runs {}, evaluations {}), {} job(s) "
        "x "
        "{} "
        "thread(s), from 3 training steps per run: {}\n",
        format_duration((search_s + final_s + eval_s) / o.jobs), format_duration(search_s / o.jobs),
        format_duration(final_s / o.jobs), format_duration(eval_s / o.jobs), o.jobs, threads,
        timed_when);
    if (grid_done_n + final_done_n > 0)
      fmt::print(
          "left: {} ({} of {} grid runs and {} of {} final runs finished by an earlier "
          "invocation; a run resumed from its checkpoint counts in full)\n",
          format_duration(left_s / o.jobs), grid_done_n, grid_n, final_done_n, final_n);
    std::fflush(stdout);
  }
  if (o.plan_only) return 0;

  // 2. Learning rates.
  std::vector<Job> search;
  for (RunPlan& p : plans) {
    const SuiteRun& r = *p.run;
    if (!searches_lr(p)) continue;
    if (p.gp) {
      // Chosen on the validation set at a short budget; the test set is not drawn.
      for (double lr : r.lr) {
        const GpSpec t =
            make_gp(suite, r, fmt::format("lr {} {}", r.name, lr_text(lr)), lr_dir(out, r, lr),
                    suite.gp.search_steps, lr, r.seeds.front(), suite.gp.val_seqs, false);
        if (o.report_only) continue;
        if (auto j = gp_job(t, suite.gp, gp_search_job_s(p))) search.push_back(*j);
      }
      continue;
    }
    for (double lr : r.lr) {
      TrainSpec t = make_train(r, suite.data, fmt::format("lr {} {}", r.name, lr_text(lr)),
                               lr_dir(out, r, lr), suite.lr_search_tokens, lr, suite.lr_min_ratio,
                               r.seeds.front(), 1);
      if (o.report_only) continue;
      if (auto j = train_job(t, p.s_per_token)) search.push_back(*j);
    }
  }
  runner.run(search, "lr search");
  choose_learning_rates(plans, out);

  // 3. Final runs, each evaluated (4) as soon as it is trained: the evaluation split, every
  // test-time variant and every eval text. A run's folder is then finished on its own, so it
  // can be kept without its checkpoints (a committed suite) and is reused as it is.
  auto eval_jobs = [&](const RunPlan& p, uint64_t seed, const std::string& dir) {
    std::vector<Job> evals;
    auto add = [&](const std::string& label, const std::string& path, std::vector<std::string> args,
                   double tokens) {
      if (fs::exists(path)) return;
      Job j;
      j.label = label;
      j.capture = path;
      j.log = dir + "/eval.log";
      j.est_s = tokens * p.s_per_token;
      j.args = {"eval", "--checkpoint", dir, "--json"};
      j.args.insert(j.args.end(), args.begin(), args.end());
      evals.push_back(j);
    };
    const std::string data = suite.data + ":" + suite.eval_split;
    add(fmt::format("eval {} s{}", p.run->name, seed), eval_path(dir, suite.eval_split, ""),
        {"--data", data}, eval_cost_tokens);
    for (const SuiteVariant& v : p.run->variants) {
      std::vector<std::string> args = {"--data", data};
      for (const std::string& s : v.sets) {
        args.push_back("--set");
        args.push_back(s);
      }
      add(fmt::format("eval {} s{} {}", p.run->name, seed, v.name),
          eval_path(dir, suite.eval_split, v.name), args, eval_cost_tokens);
    }
    for (const std::string& t : suite.eval_text)
      add(fmt::format("eval {} s{} {}", p.run->name, seed, stem(t)), text_eval_path(dir, t),
          {"--text", t}, static_cast<double>(fs::file_size(t)) / 2);
    return evals;
  };
  // Seed-major: every run's first seed, then every run's second, and so on, so that a suite cut
  // short (a sitting ends) has every run at one seed before any at its next, not a few runs with
  // all their seeds and the rest with none.
  std::vector<Job> finals;
  size_t most_seeds = 0;
  for (const RunPlan& p : plans) most_seeds = std::max(most_seeds, p.run->seeds.size());
  for (size_t k = 0; k < most_seeds && !o.report_only; ++k) {
    for (const RunPlan& p : plans) {
      if (k >= p.run->seeds.size()) continue;
      const uint64_t seed = p.run->seeds[k];
      if (p.gp) {  // a GP job evaluates its model itself
        const GpSpec t = make_gp(suite, *p.run, fmt::format("{} s{}", p.run->name, seed),
                                 final_dir(out, *p.run, seed), p.run->gp.steps, p.lr, seed,
                                 suite.gp.val_seqs, true);
        if (auto j = gp_job(t, suite.gp, gp_final_job_s(p))) finals.push_back(*j);
        continue;
      }
      const std::string dir = final_dir(out, *p.run, seed);
      TrainSpec t = make_train(*p.run, suite.data, fmt::format("{} s{}", p.run->name, seed), dir,
                               p.run->tokens, p.lr, suite.lr_min_ratio, seed, suite.val_points);
      if (auto j = train_job(t, p.s_per_token)) {
        j->then = eval_jobs(p, seed, dir);
        finals.push_back(*j);
        continue;
      }
      if (run_status(dir) != RunStatus::kCompleted) continue;  // diverged: reported as such
      std::vector<Job> evals = eval_jobs(p, seed, dir);
      CEMFRAC_CHECK(evals.empty() || has_checkpoint(dir),
                    "{} is trained but has no checkpoint left to evaluate ({} missing; a suite "
                    "kept without its checkpoints): remove that directory to train it again",
                    dir, evals.front().capture);
      finals.insert(finals.end(), evals.begin(), evals.end());
    }
  }
  if (!o.report_only) runner.run(finals, "final");

  // 5. Report. A final run is finished when it is trained (or diverged) and evaluated.
  int64_t n_final = 0, n_finished = 0;
  for (const RunPlan& p : plans)
    for (uint64_t seed : p.run->seeds) {
      const std::string dir = final_dir(out, *p.run, seed);
      ++n_final;
      const RunStatus st = run_status(dir);
      n_finished += p.gp ? fs::exists(gp_result_path(dir))
                         : st == RunStatus::kDiverged ||
                               (st == RunStatus::kCompleted && eval_jobs(p, seed, dir).empty());
    }
  // Runs whose process was killed outright: summary.json still says "running" but nothing holds
  // them (train/run_dir.h). The report names them; the same command resumes them.
  json died = json::array();
  for (const RunPlan& p : plans) {
    std::vector<std::string> dirs;
    for (double lr : p.run->lr) dirs.push_back(lr_dir(out, *p.run, lr));
    for (uint64_t seed : p.run->seeds) dirs.push_back(final_dir(out, *p.run, seed));
    for (const std::string& d : dirs)  // named relative to the suite's folder
      if (run_status(d) == RunStatus::kDied) died.push_back(d.substr(out.size() + 1));
  }
  std::string command = "cemfrac";
  if (o.threads > 0) command += fmt::format(" --threads {}", o.threads);
  if (o.flush_denormal) command += " --flush-denormal";
  if (!o.device.empty()) command += " --device " + o.device;
  command += " compare --suite " + o.suite;
  if (!o.out.empty()) command += " --out " + o.out;
  if (o.report_only) command += " --report";
  if (o.jobs != 1) command += fmt::format(" --jobs {}", o.jobs);
  for (const std::string& t : o.eval_text) command += " --eval-text " + t;
  const std::string commit = o.commit;  // the binary's, not the working directory's
  json provenance = {
      {"command", command},
      {"machine", machine_text()},
      {"date", report_date()},
      {"commit", commit},
      {"version", CEMFRAC_VERSION},
      {"final_runs", n_final},
      {"final_runs_finished", n_finished},
      {"wall_time",
       format_duration(seconds_since(wall_start)) +
           " (jobs already finished by an earlier invocation were reused, not timed)"}};
  if (!died.empty())
    provenance["runs_died"] = died;  // absent when none (reports stay as they were)
  const Report rep =
      make_report(suite, plans, collect_results(suite, plans, out), train_tokens, provenance);
  fs::create_directories(out + "/plots");
  for (const auto& [name, svg] : rep.plots) write_file_atomic(out + "/plots/" + name, svg);
  write_file_atomic(out + "/results.json", rep.results.dump(2) + "\n");
  write_file_atomic(out + "/results.md", rep.markdown);
  fmt::print("\n{}", rep.markdown);
  fmt::print("results: {}/results.md, {}/results.json; plots: {}/plots/\n", out, out, out);
  return 0;
}

}  // namespace cemfrac

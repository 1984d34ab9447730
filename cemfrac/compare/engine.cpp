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
#include <utility>

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
#include "cemfrac/tasks/glue.h"  // read_finetune_task: a fine-tuning's examples, for its estimate
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

// ---- the state one invocation's phases share

struct Session {
  Session(const CompareOptions& options, Suite loaded) : o(options), suite(std::move(loaded)) {}

  const CompareOptions& o;
  Suite suite;
  std::string out;                          // the suite's folder
  int threads = 1;                          // per job
  int64_t train_tokens = 0;                 // of the prepared dataset's training split (LM suites)
  int64_t eval_tokens = 0;                  // of its evaluation split
  std::vector<RunPlan> plans;               // one per run, in suite order
  std::vector<std::string> reused_timings;  // timed by an earlier invocation: not "now"
  std::vector<std::string> retimed;         // timed earlier with other settings: timed again
};

// The suite, its eval texts (the suite's and --eval-text's, each found, stems distinct) and the
// claims that name one.
Suite load_checked_suite(const CompareOptions& o) {
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
  return suite;
}

// The token counts of the prepared dataset's splits; a suite of GP runs only needs none.
void read_split_tokens(Session& s) {
  if (!s.suite.has_task(SuiteTask::kLm)) return;
  const auto meta = read_json(s.suite.data + "/meta.json");
  CEMFRAC_CHECK(meta.has_value(),
                "{}/meta.json not found: prepare the data first (cemfrac prepare --corpus "
                "brown --tokenizer sp:4096 --out {})",
                s.suite.data, s.suite.data);
  s.train_tokens = (*meta)["splits"]["train"].value("tokens", int64_t{0});
  s.eval_tokens = (*meta)["splits"][s.suite.eval_split].value("tokens", int64_t{0});
}

std::string timing_dir(const Session& s, const SuiteRun& r) {
  return fmt::format("{}/plan/{}-t{}", s.out, r.name,
                     r.task == SuiteTask::kGp ? s.suite.gp.threads : s.threads);
}

// 1. Plan: every run's RunPlan, and the timed 3-step trainings still to run (a timing of another
// machine, or with settings the suite no longer gives, is taken again).
std::vector<Job> plan_runs(Session& s) {
  const CompareOptions& o = s.o;
  if (!o.report_only) {
    const std::string discarded = discard_other_machines_timings(s.out, machine_key());
    if (!discarded.empty()) fmt::print("{}\n", discarded);
  }
  std::vector<Job> timing;
  auto add = [&](const SuiteRun& r, std::optional<Job> job) {
    if (job) {
      job->est_s = 1;
      timing.push_back(*job);
    } else {
      s.reused_timings.push_back(r.name);
    }
  };
  for (const SuiteRun& r : s.suite.runs) {
    RunPlan p;
    p.run = &r;
    const double lr = r.lr.empty() ? 1e-3 : r.lr.front();
    if (r.task == SuiteTask::kGp) {
      // Timing: 3 steps without validation or test sets, on the GP jobs' threads.
      p.gp = true;
      s.plans.push_back(p);
      const GpSpec t = make_gp(s.suite, r, "time " + r.name, timing_dir(s, r), 3, lr, 1, 0, false);
      if (o.report_only) continue;  // runs nothing, writes nothing but the report
      if (drop_stale_timing(t.dir, gp_settings(t))) s.retimed.push_back(r.name);
      add(r, gp_job(t, s.suite.gp, 0));
      continue;
    }
    const RunConfig c = load_run_config(r.config, r.sets);
    p.per_step = tokens_per_step(c);
    p.params = LmModel(c.model, torch::kMeta)->num_parameters();
    s.plans.push_back(p);
    TrainSpec t =
        make_train(r, s.suite.data, "time " + r.name, timing_dir(s, r), 3 * p.per_step, lr,
                   s.suite.lr_min_ratio, 1, 1, {fmt::format("train.eval_tokens={}", p.per_step)});
    if (o.report_only) continue;
    if (drop_stale_timing(t.dir, train_settings(t))) s.retimed.push_back(r.name);
    add(r, train_job(t, 0));
  }
  if (!s.retimed.empty())
    fmt::print("plan: timing {} again: the suite changed their settings since they were timed\n",
               fmt::join(s.retimed, ", "));
  if (!timing.empty() && !o.report_only) {
    fmt::print("timing 3 training steps of each run ({} thread(s) each)...\n", s.threads);
    std::fflush(stdout);
  }
  return timing;
}

// The measured rates of the timed trainings: GP seconds per step, LM seconds per token (the last
// step's rate).
void read_timings(Session& s) {
  for (RunPlan& p : s.plans) {
    const std::string dir = timing_dir(s, *p.run);
    if (p.gp) {
      if (const auto j = read_json(gp_result_path(dir))) {
        p.params = j->value("params", int64_t{0});
        const double train_s = j->value("train_s", 0.0);
        const int64_t done = std::max<int64_t>(1, j->value("steps_done", int64_t{1}));
        p.s_per_step = train_s / static_cast<double>(done);
      }
      continue;
    }
    double rate = 0;
    for (const json& line : read_jsonl(dir + "/metrics.jsonl"))
      if (line["tokens_per_s"].is_number()) rate = line["tokens_per_s"].get<double>();
    p.s_per_token = rate > 0 ? 1 / rate : 0;
  }
}

// The training examples of each fine-tuning's task (read once: the estimates need them).
int64_t finetune_examples(const SuiteFinetune& f) {
  static std::map<std::string, int64_t> examples;
  const std::string key = f.task + "\n" + f.data;
  if (!examples.count(key))
    examples[key] = static_cast<int64_t>(read_finetune_task(f.task, f.data).train.examples.size());
  return examples[key];
}

// What a zero-shot task and a fine-tuning cost, roughly: a task as a pass over the evaluation
// split; a fine-tuning as training on epochs x examples x max_len tokens, plus its evaluations
// (a third of that again).
// A fine-tuning's cost: training on epochs x examples x max_len tokens, plus its evaluations (a
// third of that again).
double finetune_est_s(const RunPlan& p, const SuiteFinetune& f) {
  const RunConfig c = load_run_config(p.run->config, p.run->sets);
  const int64_t len = f.max_len > 0 ? f.max_len : c.model.context;
  return 4.0 / 3 * f.epochs * static_cast<double>(finetune_examples(f) * len) * p.s_per_token;
}

// What each job is expected to cost, from the timed rates: training tokens (LM) or steps (GP) at
// the measured rate; validation and test scoring as forward passes (a third of a training step per
// token, twice the tokens for half-overlapping windows); a GP model evaluated at T' costs T' / T of
// its trained T (the CEM steps dominate).
class Estimates {
 public:
  explicit Estimates(const Session& s) : s_(s) {}

  double eval_split_tokens() const { return 2.0 * static_cast<double>(s_.eval_tokens) / 3; }
  double lm_val(const RunPlan& p, int64_t points) const {
    const RunConfig c = load_run_config(p.run->config, p.run->sets);
    return static_cast<double>(points) * static_cast<double>(c.train.eval_tokens) * p.s_per_token /
           3;
  }
  int64_t lm_tokens(const RunPlan& p) const {  // the budget rounded up to whole steps
    return ((p.run->tokens + p.per_step - 1) / p.per_step) * p.per_step;
  }
  double lm_final(const RunPlan& p) const {  // every seed
    return static_cast<double>(p.run->seeds.size()) *
           (static_cast<double>(lm_tokens(p)) * p.s_per_token + lm_val(p, s_.suite.val_points + 1));
  }
  double lm_search(const RunPlan& p) const {  // the whole grid; 0 without one
    if (!p.run->lr_from.empty() || p.run->lr.size() <= 1) return 0;
    return static_cast<double>(p.run->lr.size()) *
           (static_cast<double>(s_.suite.lr_search_tokens) * p.s_per_token + lm_val(p, 2));
  }
  double lm_evals(const RunPlan& p) const {  // every seed: the split, variants, downstream jobs
    double finetunes = 0;
    for (const SuiteFinetune& f : s_.suite.finetunes)
      finetunes += static_cast<double>(f.seeds.size()) * finetune_est_s(p, f);
    return static_cast<double>(p.run->seeds.size()) *
           (p.s_per_token * eval_split_tokens() *
                static_cast<double>(1 + p.run->variants.size() + s_.suite.tasks.size()) +
            finetunes);
  }
  double gp_eval(const RunPlan& p, int64_t val_seqs, bool test) const {
    const SuiteGp& g = s_.suite.gp;
    const double fwd = p.s_per_step / 3 / static_cast<double>(g.batch);
    double test_runs = 1;
    for (const SuiteVariant& v : p.run->variants)
      if (v.cem_steps != p.run->gp.T)
        test_runs += static_cast<double>(v.cem_steps) / static_cast<double>(p.run->gp.T);
    return fwd * (static_cast<double>(val_seqs) +
                  (test ? static_cast<double>(g.test_seqs) * test_runs : 0.0));
  }
  double gp_search_job(const RunPlan& p) const {
    return static_cast<double>(s_.suite.gp.search_steps) * p.s_per_step +
           gp_eval(p, s_.suite.gp.val_seqs, false);
  }
  double gp_final_job(const RunPlan& p) const {
    return static_cast<double>(p.run->gp.steps) * p.s_per_step +
           gp_eval(p, s_.suite.gp.val_seqs, true);
  }
  double gp_search(const RunPlan& p) const {
    return p.run->lr_from.empty() && p.run->lr.size() > 1
               ? static_cast<double>(p.run->lr.size()) * gp_search_job(p)
               : 0;
  }
  double gp_final(const RunPlan& p) const {
    return static_cast<double>(p.run->seeds.size()) * gp_final_job(p);
  }

 private:
  const Session& s_;
};

// The plan's totals and what is left of them (jobs an earlier invocation finished are not left; a
// resumed one counts in full).
struct PlanTotals {
  double search_s = 0, final_s = 0, eval_s = 0, left_s = 0;
  size_t grid_n = 0, grid_done_n = 0, final_n = 0, final_done_n = 0;

  void count(const std::string& out, const RunPlan& p, double search, double fin) {
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
  }
};

std::string lr_column(const SuiteRun& r) {
  return !r.lr_from.empty() ? "from " + r.lr_from
         : r.lr.size() == 1 ? lr_text(r.lr[0])
                            : fmt::format("grid of {}", r.lr.size());
}

// The plan's two tables (LM runs, GP runs), summing the totals on the way.
std::pair<std::string, std::string> plan_tables(const Session& s, const Estimates& e,
                                                PlanTotals& totals) {
  std::string table = fmt::format("{:<24} {:>11} {:>9} {:>11} {:>8} {:>5} {:>22} {:>9}\n", "run",
                                  "params", "tok/step", "tokens", "epochs", "seeds", "lr", "est.");
  std::string gp_table =
      fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n", "GP run", "params",
                  "model", "variant", "T", "steps", "seeds", "lr", "est.");
  const double jobs = s.o.jobs;
  for (const RunPlan& p : s.plans) {
    const SuiteRun& r = *p.run;
    if (p.gp) {
      const double search = e.gp_search(p), fin = e.gp_final(p);
      totals.search_s += search;
      totals.final_s += fin;
      totals.count(s.out, p, search, fin);
      const bool cem = r.gp.model == GpModelKind::kCem;
      gp_table +=
          fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n", r.name,
                      with_commas(p.params), enum_name(r.gp.model), cem ? r.gp.variant : "-",
                      cem ? std::to_string(r.gp.T) : "-", with_commas(r.gp.steps), r.seeds.size(),
                      lr_column(r), format_duration((fin + search) / jobs));
      continue;
    }
    const double fin = e.lm_final(p), search = e.lm_search(p), ev = e.lm_evals(p);
    totals.search_s += search;
    totals.final_s += fin;
    totals.eval_s += ev;
    totals.count(s.out, p, search, fin + ev);
    const int64_t tokens = e.lm_tokens(p);
    table += fmt::format(
        "{:<24} {:>11} {:>9} {:>11} {:>8.2f} {:>5} {:>22} {:>9}\n", r.name, with_commas(p.params),
        p.per_step, with_commas(tokens),
        s.train_tokens ? static_cast<double>(tokens) / static_cast<double>(s.train_tokens) : 0,
        r.seeds.size(), lr_column(r), format_duration((fin + search + ev) / jobs));
  }
  return {table, gp_table};
}

// Prints the plan: the tables, the estimated time and what is left of it.
void print_plan(const Session& s, const Estimates& e) {
  PlanTotals t;
  const auto [table, gp_table] = plan_tables(s, e, t);
  if (s.o.report_only) return;
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  const double jobs = s.o.jobs;
  fmt::print("suite {} ({}) -> {}\n{}\n\n", s.suite.name, s.suite.path, s.out, s.suite.description);
  if (s.suite.has_task(SuiteTask::kLm)) fmt::print("{}\n", table);
  if (s.suite.has_task(SuiteTask::kGp))
    fmt::print(
        "{}(GP jobs: {} thread(s) each; their validation and test sets are scored inside the "
        "job, in its estimate)\n\n",
        gp_table, s.suite.gp.threads);
  const std::string timed_when =
      s.reused_timings.empty()
          ? fmt::format("timed now (load average {:.2f})", load[0])
          : fmt::format(
                "{} of {} timed by an earlier invocation and reused ({}; delete {}/plan to time "
                "them again), load average now {:.2f}",
                s.reused_timings.size(), s.plans.size(), fmt::join(s.reused_timings, ", "), s.out,
                load[0]);
  fmt::print(
      "estimated time: {} (learning-rate search {}, final runs {}, evaluations {}), {} job(s) x "
      "{} thread(s), from 3 training steps per run: {}\n",
      format_duration((t.search_s + t.final_s + t.eval_s) / jobs),
      format_duration(t.search_s / jobs), format_duration(t.final_s / jobs),
      format_duration(t.eval_s / jobs), s.o.jobs, s.threads, timed_when);
  if (t.grid_done_n + t.final_done_n > 0)
    fmt::print(
        "left: {} ({} of {} grid runs and {} of {} final runs finished by an earlier "
        "invocation; a run resumed from its checkpoint counts in full)\n",
        format_duration(t.left_s / jobs), t.grid_done_n, t.grid_n, t.final_done_n, t.final_n);
  std::fflush(stdout);
}

// 2. The learning-rate grids still to train: each value of each run that chooses its own, with its
// first seed, at the search budget (GP: scored on the validation set only).
std::vector<Job> search_jobs(Session& s, const Estimates& e) {
  std::vector<Job> jobs;
  for (RunPlan& p : s.plans) {
    const SuiteRun& r = *p.run;
    if (!searches_lr(p)) continue;
    for (double lr : r.lr) {
      const std::string label = fmt::format("lr {} {}", r.name, lr_text(lr));
      if (p.gp) {
        const GpSpec t = make_gp(s.suite, r, label, lr_dir(s.out, r, lr), s.suite.gp.search_steps,
                                 lr, r.seeds.front(), s.suite.gp.val_seqs, false);
        if (s.o.report_only) continue;
        if (auto j = gp_job(t, s.suite.gp, e.gp_search_job(p))) jobs.push_back(*j);
        continue;
      }
      TrainSpec t =
          make_train(r, s.suite.data, label, lr_dir(s.out, r, lr), s.suite.lr_search_tokens, lr,
                     s.suite.lr_min_ratio, r.seeds.front(), 1);
      if (s.o.report_only) continue;
      if (auto j = train_job(t, p.s_per_token)) jobs.push_back(*j);
    }
  }
  return jobs;
}

double task_est_s(const Session& s, const RunPlan& p) {
  return Estimates(s).eval_split_tokens() * p.s_per_token;
}

// Whether every evaluation of a trained LM run is kept: the evaluation split, every test-time
// variant, every eval text, every zero-shot task and every fine-tuning at each of its seeds.
bool evaluated(const Session& s, const RunPlan& p, const std::string& dir) {
  if (!fs::exists(eval_path(dir, s.suite.eval_split, ""))) return false;
  for (const SuiteVariant& v : p.run->variants)
    if (!fs::exists(eval_path(dir, s.suite.eval_split, v.name))) return false;
  for (const std::string& t : s.suite.eval_text)
    if (!fs::exists(text_eval_path(dir, t))) return false;
  for (const std::string& t : s.suite.tasks)
    if (!fs::exists(task_eval_path(dir, task_key(t)))) return false;
  for (const SuiteFinetune& f : s.suite.finetunes)
    for (uint64_t k : f.seeds)
      if (!fs::exists(finetune_dir(dir, f.name, k) + "/finetune.json")) return false;
  return true;
}

// 4. The evaluations of one trained LM run still missing: the evaluation split, every test-time
// variant, every eval text, then the downstream jobs: zero-shot tasks and fine-tunings.
std::vector<Job> eval_jobs(const Session& s, const RunPlan& p, uint64_t seed,
                           const std::string& dir) {
  const double split_tokens = Estimates(s).eval_split_tokens();
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
  const std::string data = s.suite.data + ":" + s.suite.eval_split;
  add(fmt::format("eval {} s{}", p.run->name, seed), eval_path(dir, s.suite.eval_split, ""),
      {"--data", data}, split_tokens);
  for (const SuiteVariant& v : p.run->variants) {
    std::vector<std::string> args = {"--data", data};
    for (const std::string& set : v.sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    add(fmt::format("eval {} s{} {}", p.run->name, seed, v.name),
        eval_path(dir, s.suite.eval_split, v.name), args, split_tokens);
  }
  for (const std::string& t : s.suite.eval_text)
    add(fmt::format("eval {} s{} {}", p.run->name, seed, stem(t)), text_eval_path(dir, t),
        {"--text", t}, static_cast<double>(fs::file_size(t)) / 2);
  for (const std::string& t : s.suite.tasks)
    if (auto j = task_job(dir, t, fmt::format("task {} s{} {}", p.run->name, seed, task_key(t)),
                          task_est_s(s, p)))
      evals.push_back(*j);
  for (const SuiteFinetune& f : s.suite.finetunes)
    for (uint64_t k : f.seeds)
      if (auto j =
              finetune_job(dir, f, k, fmt::format("ft {} s{} {} s{}", p.run->name, seed, f.name, k),
                           finetune_est_s(p, f)))
        evals.push_back(*j);
  return evals;
}

// The jobs that finish one run at one seed: its training (followed by its evaluations), or the
// evaluations a trained run still lacks. A GP job evaluates its model itself.
std::vector<Job> final_jobs_of(const Session& s, const Estimates& e, const RunPlan& p,
                               uint64_t seed) {
  const std::string dir = final_dir(s.out, *p.run, seed),
                    label = fmt::format("{} s{}", p.run->name, seed);
  if (p.gp) {
    const GpSpec t = make_gp(s.suite, *p.run, label, dir, p.run->gp.steps, p.lr, seed,
                             s.suite.gp.val_seqs, true);
    if (auto j = gp_job(t, s.suite.gp, e.gp_final_job(p))) return {*j};
    return {};
  }
  TrainSpec t = make_train(*p.run, s.suite.data, label, dir, p.run->tokens, p.lr,
                           s.suite.lr_min_ratio, seed, s.suite.val_points);
  if (auto j = train_job(t, p.s_per_token)) {
    j->then = eval_jobs(s, p, seed, dir);
    return {*j};
  }
  if (run_status(dir) != RunStatus::kCompleted) return {};  // diverged: reported as such
  std::vector<Job> evals = eval_jobs(s, p, seed, dir);
  CEMFRAC_CHECK(evals.empty() || has_checkpoint(dir),
                "{} is trained but has no checkpoint left to evaluate ({} missing; a suite kept "
                "without its checkpoints): remove that directory to train it again",
                dir, evals.front().capture);
  return evals;
}

// 3. Final runs, each evaluated (4) as soon as it is trained, so that a run's folder is finished
// on its own (kept without its checkpoints in a committed suite, reused as it is). Seed-major:
// every run's first seed, then every run's second, and so on, so that a suite cut short (a sitting
// ends) has every run at one seed before any at its next.
std::vector<Job> final_jobs(const Session& s, const Estimates& e) {
  std::vector<Job> finals;
  if (s.o.report_only) return finals;
  size_t most_seeds = 0;
  for (const RunPlan& p : s.plans) most_seeds = std::max(most_seeds, p.run->seeds.size());
  for (size_t k = 0; k < most_seeds; ++k) {
    for (const RunPlan& p : s.plans) {
      if (k >= p.run->seeds.size()) continue;
      const std::vector<Job> jobs = final_jobs_of(s, e, p, p.run->seeds[k]);
      finals.insert(finals.end(), jobs.begin(), jobs.end());
    }
  }
  return finals;
}

// The command that reproduces this invocation, as the report prints it.
std::string command_text(const CompareOptions& o) {
  std::string command = "cemfrac";
  if (o.threads > 0) command += fmt::format(" --threads {}", o.threads);
  if (o.flush_denormal) command += " --flush-denormal";
  if (!o.device.empty()) command += " --device " + o.device;
  command += " compare --suite " + o.suite;
  if (!o.out.empty()) command += " --out " + o.out;
  if (o.report_only) command += " --report";
  if (o.jobs != 1) command += fmt::format(" --jobs {}", o.jobs);
  for (const std::string& t : o.eval_text) command += " --eval-text " + t;
  return command;
}

// The report's provenance: command, machine, date, commit, how many final runs are finished (a
// final run is finished when it is trained, or diverged, and evaluated) and the runs whose process
// was killed outright (summary.json still says "running" but nothing holds them,
// train/run_dir.h; the same command resumes them).
json provenance(const Session& s, Clock::time_point wall_start) {
  int64_t n_final = 0, n_finished = 0;
  json died = json::array();
  for (const RunPlan& p : s.plans) {
    for (uint64_t seed : p.run->seeds) {
      const std::string dir = final_dir(s.out, *p.run, seed);
      ++n_final;
      const RunStatus st = run_status(dir);
      n_finished += p.gp ? fs::exists(gp_result_path(dir))
                         : st == RunStatus::kDiverged ||
                               (st == RunStatus::kCompleted && evaluated(s, p, dir));
    }
    std::vector<std::string> dirs;
    for (double lr : p.run->lr) dirs.push_back(lr_dir(s.out, *p.run, lr));
    for (uint64_t seed : p.run->seeds) dirs.push_back(final_dir(s.out, *p.run, seed));
    for (const std::string& d : dirs)  // named relative to the suite's folder
      if (run_status(d) == RunStatus::kDied) died.push_back(d.substr(s.out.size() + 1));
  }
  json j = {{"command", command_text(s.o)},
            {"machine", machine_text()},
            {"date", report_date()},
            {"commit", s.o.commit},  // the binary's, not the working directory's
            {"version", CEMFRAC_VERSION},
            {"final_runs", n_final},
            {"final_runs_finished", n_finished},
            {"wall_time",
             format_duration(seconds_since(wall_start)) +
                 " (jobs already finished by an earlier invocation were reused, not timed)"}};
  if (!died.empty()) j["runs_died"] = died;  // absent when none (reports stay as they were)
  return j;
}

// 5. Report: results.json, results.md and plots/*.svg under the suite's folder.
void write_report(const Session& s, Clock::time_point wall_start) {
  const Report rep = make_report(s.suite, s.plans, collect_results(s.suite, s.plans, s.out),
                                 s.train_tokens, provenance(s, wall_start));
  fs::create_directories(s.out + "/plots");
  for (const auto& [name, svg] : rep.plots) write_file_atomic(s.out + "/plots/" + name, svg);
  write_file_atomic(s.out + "/results.json", rep.results.dump(2) + "\n");
  write_file_atomic(s.out + "/results.md", rep.markdown);
  fmt::print("\n{}", rep.markdown);
  fmt::print("results: {}/results.md, {}/results.json; plots: {}/plots/\n", s.out, s.out, s.out);
}

}  // namespace

int run_compare(const CompareOptions& o) {
  const auto wall_start = Clock::now();
  Session s(o, load_checked_suite(o));
  read_split_tokens(s);
  s.out = o.out.empty() ? "runs/suites/" + s.suite.name : o.out;
  const int total_threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  s.threads = std::max(1, total_threads / o.jobs);
  // One writer per suite folder, before anything is written there (the kernel drops the lock when
  // this process dies, however it dies); a second compare on it is refused naming this one.
  const DirLock lock = DirLock::acquire(s.out, "compare");
  install_stop_signals();
  // Numerics flags of this invocation go to every job (a child process starts with the CPU's
  // default floating-point mode); every job computes where the suite was asked to (the suite's
  // runs may set train.device too).
  std::vector<std::string> job_globals;
  if (o.flush_denormal) job_globals.push_back("--flush-denormal");
  if (!o.device.empty()) job_globals.insert(job_globals.end(), {"--device", o.device});
  Runner runner(o.exe, o.jobs, s.threads, s.suite.name,
                fmt::format("cemfrac {} (commit {})", CEMFRAC_VERSION, o.commit), job_globals);

  runner.run(plan_runs(s), "timing");  // 1. plan
  read_timings(s);
  const Estimates estimates(s);
  print_plan(s, estimates);
  if (o.plan_only) return 0;
  runner.run(search_jobs(s, estimates), "lr search");  // 2. learning rates
  choose_learning_rates(s.plans, s.out);
  const std::vector<Job> finals = final_jobs(s, estimates);  // 3. final runs, 4. evaluations
  if (!o.report_only) runner.run(finals, "final");
  write_report(s, wall_start);  // 5. report
  return 0;
}

}  // namespace cemfrac

// cemfrac compare --suite FILE: trains and evaluates a suite of runs (configs/suites/*.toml, format
// in docs/compare.md) and tests its claims. Every training and evaluation is a child process of
// this same binary (`cemfrac train` / `eval`), so each job is exactly what a user would run by
// hand, keeps its own log, checkpoints and exact resume, and a crash or Ctrl-C in one job loses
// nothing else; --jobs N runs N children at once with the threads split between them. Everything is
// written under --out.
//
//   1. plan:   a 3-step timed training of every run (s/token), the budget and the estimated time;
//   2. lr:     each run that chooses its own learning rate trains at every grid value for
//              lr_search_tokens with its first seed; the lowest final validation loss wins;
//   3. final:  every run at its full budget with each of its seeds (seed = init and data order);
//   4. eval:   every final run on the eval split, each test-time variant, and each eval text;
//   5. report: results.json, results.md (mean +- sd over seeds, claims with paired 95% intervals
//   and
//              verdicts) and plots/*.svg.
// A finished job is reused, an interrupted training resumed; a job whose settings changed is
// refused. A row with task = "gp" is a GP in-context regression model instead (docs/compare.md,
// "GP runs"): its job is `cemfrac gp --one`, which trains it and scores the validation set (the
// grid) or the validation and test sets at every evaluated T (final runs) itself.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cemfrac/compare/plot.h"
#include "cemfrac/compare/progress.h"
#include "cemfrac/compare/stats.h"
#include "cemfrac/compare/suite.h"
#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/tasks/gp_experiment.h"  // apply_gp_variant
#include "cemfrac/train/checkpoint.h"     // list_checkpoints
#include "cemfrac/train/run_config.h"
#include "cli/build_info.h"
#include "cli/commands.h"

extern char** environ;

namespace cemfrac::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

std::string lr_text(double lr) {
  return fmt::format("{:g}", lr);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_line(const std::string& path) {
  const std::string text = file_text(path);
  auto end = text.find_last_not_of("\n");
  if (end == std::string::npos) return "";
  auto begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// The child's one-line error from its log ("cemfrac: error: ..."), else the log's last line.
std::string log_problem(const std::string& path) {
  const std::string text = file_text(path);
  const auto at = text.rfind("cemfrac: ");
  if (at != std::string::npos && (at == 0 || text[at - 1] == '\n')) {
    const auto end = text.find('\n', at);
    return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return last_line(path);
}

std::optional<json> read_json(const std::string& path) {
  if (!fs::exists(path)) return std::nullopt;
  try {
    return json::parse(file_text(path));
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(file_text(path));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception&) {
      break;  // a line cut by a crash: the lines before it stand
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Jobs: one child process each.

struct Job {
  std::string label;
  std::vector<std::string> args;  // after `cemfrac --threads K`
  std::string dir;           // training: the run directory (LM: progress from its metrics.jsonl)
  std::string log;           // stdout + stderr (training), stderr (eval)
  std::string capture;       // eval: stdout goes to this file (written when the job succeeds)
  int64_t tokens = 0;        // LM training: tokens of the whole run
  int64_t steps = 0;         // GP training: steps of the whole run (progress from its log)
  double est_s = 0;          // estimated seconds at the planned threads
  int threads = 0;           // > 0: this job's --threads (GP jobs), else the runner's
  std::vector<Job> then;     // run next, once this training completed (its evaluations)
  std::string remove_after;  // removed once the job succeeded (a GP run's checkpoints)
};

// The estimated seconds and the number of `jobs` with every job they lead to.
double total_est_s(const std::vector<Job>& jobs) {
  double s = 0;
  for (const Job& j : jobs) s += j.est_s + total_est_s(j.then);
  return s;
}
size_t total_jobs(const std::vector<Job>& jobs) {
  size_t n = 0;
  for (const Job& j : jobs) n += 1 + total_jobs(j.then);
  return n;
}

struct Running {
  Job job;  // est_s: what is left of the job when it started (a resumed training's part)
  pid_t pid = 0;
  int64_t at_start = 0;         // training: tokens (LM) or steps (GP) done when it started
  std::uintmax_t log_from = 0;  // GP training: where this invocation's part of its log begins
  bool signalled = false;
};

int64_t run_tokens_now(const std::string& dir) {
  const std::string line = last_line(dir + "/metrics.jsonl");
  if (line.empty()) return 0;
  try {
    return json::parse(line).value("tokens", int64_t{0});
  } catch (const json::exception&) {
    return 0;
  }
}

class Runner {
 public:
  // `global`: global flags every job gets besides --threads (e.g. --flush-denormal).
  Runner(std::string exe, int jobs, int threads_per_job, std::string title,
         std::vector<std::string> global = {})
      : exe_(std::move(exe)), jobs_(jobs), threads_(threads_per_job), title_(std::move(title)),
        tty_(isatty(STDERR_FILENO) != 0), global_(std::move(global)) {}

  // Runs every job (at most jobs_ at once). A training that completes puts the jobs of its `then`
  // next in the queue, so a run is evaluated as soon as it is trained (and its folder is then
  // finished, whatever happens to the rest of the suite). Throws on the first failure after the
  // running jobs end.
  void run(const std::vector<Job>& jobs_in, const std::string& phase) {
    if (jobs_in.empty()) return;
    std::vector<Job> jobs = jobs_in;
    const size_t n_jobs = total_jobs(jobs);
    phase_ = phase;
    total_est_ = total_est_s(jobs);
    done_est_ = 0;
    started_ = Clock::now();
    size_t next = 0;
    std::vector<Running> running;
    std::string failure;
    auto last_print = Clock::now() - std::chrono::hours(1);
    while (next < jobs.size() || !running.empty()) {
      while (!g_stop && failure.empty() && next < jobs.size() &&
             static_cast<int>(running.size()) < jobs_) {
        running.push_back(launch(jobs[next++]));
      }
      if (running.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      for (size_t i = 0; i < running.size();) {
        int status = 0;
        const pid_t r = waitpid(running[i].pid, &status, WNOHANG);
        if (r == 0) {
          ++i;
          continue;
        }
        bool completed = false, ended = false;
        const std::string problem = finish(running[i].job, status, completed, ended);
        done_est_ += running[i].job.est_s;
        if (ended) ++finished_;  // not a job stopped by an interrupt (it resumes next time)
        if (!problem.empty() && failure.empty()) failure = problem;
        if (completed && !g_stop) {
          const std::vector<Job> then = running[i].job.then;
          jobs.insert(jobs.begin() + static_cast<std::ptrdiff_t>(next), then.begin(), then.end());
        } else {
          done_est_ += total_est_s(running[i].job.then);  // they will not run in this invocation
        }
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (g_stop) {
        for (Running& r : running) {
          if (!r.signalled) kill(r.pid, SIGINT);  // a training checkpoints and stops
          r.signalled = true;
        }
      }
      const auto now = Clock::now();
      if (now - last_print >= std::chrono::seconds(tty_ ? 1 : 60)) {
        print_progress(running, n_jobs);
        last_print = now;
      }
    }
    if (tty_) fmt::print(stderr, "\n");
    print_progress(running, n_jobs);
    if (!tty_) fmt::print(stderr, "\n");
    finished_ = 0;
    CEMFRAC_CHECK(!g_stop,
                  "interrupted: run the same command again to resume (finished jobs are kept)");
    CEMFRAC_CHECK(failure.empty(), "{}", failure);
  }

 private:
  Running launch(const Job& job) {
    fs::create_directories(fs::path(job.log).parent_path());
    std::vector<std::string> argv_s = {exe_, "--threads",
                                       std::to_string(job.threads > 0 ? job.threads : threads_)};
    argv_s.insert(argv_s.end(), global_.begin(), global_.end());
    argv_s.insert(argv_s.end(), job.args.begin(), job.args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, job.log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (job.capture.empty()) {
      posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (job.capture + ".tmp").c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    {
      std::ofstream log(job.log, std::ios::app);
      log << "== cemfrac";
      for (size_t i = 1; i < argv_s.size(); ++i) log << ' ' << argv_s[i];
      // The binary that ran this job: a suite kept across sittings may be trained by several.
      log << "\n== binary: cemfrac " << CEMFRAC_VERSION << " (commit " << build_commit() << ")\n";
    }
    // Each job in its own process group: a terminal's Ctrl-C reaches the jobs only through the
    // runner, which forwards it once (a second SIGINT would kill a job before its checkpoint).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, exe_.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    CEMFRAC_CHECK(rc == 0, "cannot start {}: {}", exe_, std::strerror(rc));
    Running r;
    r.job = job;
    r.pid = pid;
    std::error_code ec;
    r.log_from = fs::file_size(job.log, ec);
    if (ec) r.log_from = 0;
    if (job.tokens > 0) r.at_start = run_tokens_now(job.dir);
    if (job.steps > 0) {
      const auto saved = list_checkpoints(job.dir);  // the GP trainer resumes from the newest
      r.at_start = saved.empty() ? 0 : std::min(saved.back().first, job.steps);
    }
    // A resumed training has only its rest to do: the estimate of this invocation drops the part
    // an earlier one did (else the ETA would count it as done at this invocation's speed).
    const int64_t whole = std::max(job.tokens, job.steps);
    if (whole > 0 && r.at_start > 0) {
      const double rest = 1 - static_cast<double>(r.at_start) / static_cast<double>(whole);
      total_est_ -= r.job.est_s * (1 - rest);
      r.job.est_s *= rest;
    }
    return r;
  }

  // A running training's position in its own unit (tokens of an LM run, steps of a GP run) and
  // its whole; {0, 0} for a job without progress (an evaluation).
  std::pair<int64_t, int64_t> position(const Running& r) const {
    if (r.job.tokens > 0) return {run_tokens_now(r.job.dir), r.job.tokens};
    if (r.job.steps > 0) {
      const std::string text = file_text(r.job.log);
      const int64_t k =
          last_logged_step(text.size() > r.log_from ? text.substr(r.log_from) : std::string());
      return {std::max(k, r.at_start), r.job.steps};
    }
    return {0, 0};
  }

  // "" when the job succeeded (a diverged training counts: it is a result), else the problem.
  // `completed`: a training that ran to its end (its `then` jobs may start). `ended`: the job is
  // done for good (completed, diverged, or an evaluation written), not stopped by an interrupt.
  std::string finish(const Job& job, int status, bool& completed, bool& ended) {
    completed = false;
    ended = false;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!job.capture.empty()) {
      if (code == 0) {
        fs::rename(job.capture + ".tmp", job.capture);
        if (!job.remove_after.empty()) fs::remove_all(job.remove_after);
        ended = true;
        return "";
      }
      fs::remove(job.capture + ".tmp");
      if (g_stop) return "";
      return fmt::format("{} failed (exit {}): {} (log: {})", job.label, code, log_problem(job.log),
                         job.log);
    }
    const auto summary = read_json(job.dir + "/summary.json");
    const std::string st = summary ? summary->value("status", "") : "";
    completed = st == "completed";
    ended = completed || st == "diverged";
    if (ended || g_stop) return "";  // stopped by an interrupt: it resumes next time
    return fmt::format("{} failed (exit {}): {} (log: {})", job.label, code, log_problem(job.log),
                       job.log);
  }

  void print_progress(const std::vector<Running>& running, size_t n_jobs) {
    double live = 0;
    std::string names;
    for (const Running& r : running) {
      const auto [now, whole] = position(r);
      const double frac =
          whole > 0 ? std::clamp(static_cast<double>(now) / static_cast<double>(whole), 0.0, 1.0)
                    : 0;
      if (whole > r.at_start)
        live += r.job.est_s * std::clamp(static_cast<double>(now - r.at_start) /
                                             static_cast<double>(whole - r.at_start),
                                         0.0, 1.0);
      names += fmt::format("{}{}{}", names.empty() ? "" : ", ", r.job.label,
                           whole > 0 ? fmt::format(" {:.0f}%", 100 * frac) : "");
    }
    const double elapsed = seconds_since(started_);
    const double done = done_est_ + live;
    const double eta = phase_eta_seconds(total_est_, done, elapsed,
                                         std::min<size_t>(static_cast<size_t>(jobs_), n_jobs));
    const std::string line = fmt::format(
        "[{} {}] {:.0f}% | {}/{} jobs | elapsed {} | ETA {}{}{}", title_, phase_,
        total_est_ > 0 ? 100 * done / total_est_ : 100.0, finished_, n_jobs,
        format_duration(elapsed), format_duration(eta), names.empty() ? "" : " | ", names);
    if (tty_) {
      fmt::print(stderr, "\r\033[K{}", line.substr(0, 200));
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }

  std::string exe_;
  int jobs_;
  int threads_;
  std::string title_;
  bool tty_;
  std::vector<std::string> global_;
  std::string phase_;
  double total_est_ = 0, done_est_ = 0;
  size_t finished_ = 0;
  Clock::time_point started_;
};

// ---------------------------------------------------------------------------------------------------
// Training runs.

struct TrainSpec {
  std::string label;
  std::string config;
  std::vector<std::string> sets;  // the run's, then the budget's
  std::string dir;
  int64_t tokens = 0;
  int64_t steps = 0;
};

int64_t tokens_per_step(const RunConfig& c) {
  if (c.train.tokens_per_step > 0) return c.train.tokens_per_step;
  const int64_t seq = c.train.seq_len > 0 ? c.train.seq_len : c.model.context;
  return c.train.micro_batch * seq;
}

// The budget overrides of one training: steps for `tokens`, warm-up 10%, lr and seed, validation
// `val_points` times, checkpoints for resuming.
TrainSpec make_train(const SuiteRun& run, const std::string& data, const std::string& label,
                     const std::string& dir, int64_t tokens, double lr, double lr_min_ratio,
                     uint64_t seed, int64_t val_points,
                     const std::vector<std::string>& extra = {}) {
  const RunConfig base = load_run_config(run.config, run.sets);
  const int64_t per_step = tokens_per_step(base);
  const int64_t steps = std::max<int64_t>(1, (tokens + per_step - 1) / per_step);
  TrainSpec t;
  t.label = label;
  t.config = run.config;
  t.sets = run.sets;
  t.dir = dir;
  t.steps = steps;
  t.tokens = steps * per_step;
  const std::vector<std::string> budget = {
      fmt::format("train.steps={}", steps),
      fmt::format("train.warmup_steps={}", std::max<int64_t>(1, steps / 10)),
      fmt::format("train.lr_max={}", lr_text(lr)),
      fmt::format("train.lr_min={}", lr_text(lr * lr_min_ratio)),
      fmt::format("train.seed={}", seed),
      fmt::format("train.eval_every={}", std::max<int64_t>(1, steps / val_points)),
      fmt::format("train.log_every={}", std::max<int64_t>(1, steps / 200)),
      fmt::format("train.checkpoint_every={}", std::max<int64_t>(1, steps / 5)),
      "train.keep_checkpoints=1",
  };
  t.sets.insert(t.sets.end(), budget.begin(), budget.end());
  // The suite's dataset (only when the config names another, so the recorded settings stay short).
  if (base.data.path != data) t.sets.push_back("data.path=" + data);
  t.sets.insert(t.sets.end(), extra.begin(), extra.end());
  (void)load_run_config(t.config, t.sets);  // checked now
  return t;
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir + "/checkpoints", ec)) return false;
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints", ec))
    if (e.path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

std::string train_status(const std::string& dir) {
  const auto s = read_json(dir + "/summary.json");
  return s ? s->value("status", "") : "";
}

// Refuses `dir` when it was made with other settings than `settings` (its compare-run.json), or
// not by cemfrac compare at all.
void check_settings(const std::string& dir, const json& settings) {
  const std::string stamp = dir + "/compare-run.json";
  if (const auto old = read_json(stamp)) {
    CEMFRAC_CHECK(
        *old == settings,
        "{} was trained with other settings than the suite now gives (see {}): remove that "
        "directory to train it again, or restore the suite",
        dir, stamp);
  } else if (fs::exists(dir) && !fs::is_empty(dir)) {
    fail("{} exists and was not made by cemfrac compare: remove it or choose another --out", dir);
  }
}

// An unfinished run with no checkpoint to resume from (stopped before its first one, or a folder
// kept without its checkpoints, e.g. a committed suite): what it wrote is dropped, so that it
// starts again from step 0 into a clean folder (its log and metrics start afresh). The folder is
// the suite's own (check_settings has seen its compare-run.json, which stays).
void clear_run_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() == "compare-run.json") continue;
    fs::remove_all(e.path());
  }
}

void write_settings(const std::string& dir, const json& settings) {
  fs::create_directories(dir);
  write_file_atomic(dir + "/compare-run.json", settings.dump(2) + "\n");
}

// What a training run's compare-run.json records: a folder with other settings is another run.
json train_settings(const TrainSpec& t) {
  return {{"config", t.config}, {"set", t.sets}};
}

// The job that brings `t` to completion, or nullopt when it is complete (or diverged) already.
// A directory trained with other settings is refused.
std::optional<Job> train_job(const TrainSpec& t, double est_s_per_token) {
  const json settings = train_settings(t);
  check_settings(t.dir, settings);
  const std::string status = train_status(t.dir);
  if (status == "completed" || status == "diverged") return std::nullopt;
  if (!has_checkpoint(t.dir)) clear_run_dir(t.dir);
  write_settings(t.dir, settings);
  Job j;
  j.label = t.label;
  j.dir = t.dir;
  j.log = t.dir + "/train.log";
  j.tokens = t.tokens;
  j.est_s = est_s_per_token * static_cast<double>(t.tokens);
  j.args = {"train", "--config", t.config, "--out", t.dir, "--quiet"};
  for (const std::string& s : t.sets) {
    j.args.push_back("--set");
    j.args.push_back(s);
  }
  if (has_checkpoint(t.dir)) {
    j.args.push_back("--resume");
    j.args.push_back(t.dir);
  }
  return j;
}

// ---------------------------------------------------------------------------------------------------
// GP runs (task = "gp"): one child `cemfrac gp --one` each, which trains, evaluates and prints its
// result as one JSON object, kept as <dir>/gp-run.json when the job succeeds. A finished GP run is
// reused; an interrupted one resumes from the checkpoint its child keeps in <dir>/checkpoints.

struct GpSpec {
  std::string label;
  std::string dir;
  std::vector<std::string> args;  // after `cemfrac --threads K`
  int64_t steps = 0;
};

std::string gp_result_path(const std::string& dir) {
  return dir + "/gp-run.json";
}

// `steps` optimizer steps at `lr` from `seed`; the validation set of val_seqs sequences; with
// `test`, the test set at the trained T and at each test-time T.
GpSpec make_gp(const Suite& suite, const SuiteRun& run, const std::string& label,
               const std::string& dir, int64_t steps, double lr, uint64_t seed, int64_t val_seqs,
               bool test) {
  const SuiteGp& g = suite.gp;
  GpSpec spec;
  spec.label = label;
  spec.dir = dir;
  spec.steps = steps;
  spec.args = {"gp",
               "--one",
               "--train-steps",
               std::to_string(steps),
               "--batch",
               std::to_string(g.batch),
               "--layers",
               std::to_string(g.layers),
               "--positions",
               g.positions,
               "--lr",
               lr_text(lr),
               "--seed",
               std::to_string(seed),
               "--eval-seed",
               std::to_string(g.eval_seed),
               "--val-seqs",
               std::to_string(val_seqs),
               "--eval-seqs",
               std::to_string(test ? g.test_seqs : 0)};
  if (run.gp.model == "llama") {
    spec.args.insert(spec.args.end(), {"--model", "llama"});
  } else {
    spec.args.insert(spec.args.end(),
                     {"--variants", run.gp.variant, "--steps", std::to_string(run.gp.T)});
    std::vector<std::string> ts;
    for (const SuiteVariant& v : run.variants) ts.push_back(std::to_string(v.cem_steps));
    if (test && !ts.empty())
      spec.args.insert(spec.args.end(), {"--eval-steps", fmt::format("{}", fmt::join(ts, ","))});
  }
  return spec;
}

// What a GP run's compare-run.json records (its `cemfrac gp --one` arguments).
json gp_settings(const GpSpec& spec) {
  return {{"task", "gp"}, {"args", spec.args}};
}

// A plan's timing folder is disposable: one timed with other settings than the suite now gives
// (a learning-rate grid whose first value changed, say) is removed, to be timed again, where a
// result folder with other settings is refused (check_settings). Returns whether it was removed.
bool drop_stale_timing(const std::string& dir, const json& settings) {
  const auto old = read_json(dir + "/compare-run.json");
  if (!old || *old == settings) return false;
  fs::remove_all(dir);
  return true;
}

// The job that produces <dir>/gp-run.json, or nullopt when it exists (a finished run, completed or
// diverged). A directory made with other settings is refused.
std::optional<Job> gp_job(const GpSpec& spec, const SuiteGp& g, double est_s) {
  const json settings = gp_settings(spec);
  check_settings(spec.dir, settings);
  if (read_json(gp_result_path(spec.dir))) return std::nullopt;
  write_settings(spec.dir, settings);
  Job j;
  j.label = spec.label;
  // Resumable: the child keeps its training state in <dir>/checkpoints and resumes from it (an
  // interrupted GP run goes on where it stopped); the folder is removed once gp-run.json is kept.
  // Not part of the settings: where the state lives is not what the run is.
  j.args = spec.args;
  j.args.insert(j.args.end(), {"--checkpoint-dir", spec.dir});
  j.remove_after = spec.dir + "/checkpoints";
  j.dir = spec.dir;  // its checkpoints (a resumed run's starting step)
  j.steps = spec.steps;
  j.capture = gp_result_path(spec.dir);
  j.log = spec.dir + "/gp.log";
  j.est_s = est_s;
  j.threads = static_cast<int>(g.threads);
  return j;
}

// ---------------------------------------------------------------------------------------------------
// The suite's state.

struct RunPlan {
  const SuiteRun* run = nullptr;
  bool gp = false;        // task = "gp"
  double s_per_step = 0;  // GP: measured seconds per optimizer step (at [gp].threads)
  int64_t params = 0;
  int64_t per_step = 0;
  double s_per_token = 0;  // measured, at the planned threads
  double lr = 0;           // chosen (0 until known)
  std::map<std::string, std::optional<double>>
      lr_search;  // lr text -> final val loss, GP: val RMSE (nullopt: diverged)
};

std::string stem(const std::string& path) {
  return fs::path(path).stem().string();
}

std::string eval_path(const std::string& dir, const std::string& split,
                      const std::string& variant) {
  return variant.empty() ? fmt::format("{}/eval-{}.json", dir, split)
                         : fmt::format("{}/eval-{}@{}.json", dir, split, variant);
}

std::string text_eval_path(const std::string& dir, const std::string& text) {
  return fmt::format("{}/eval-text-{}.json", dir, stem(text));
}

// ---------------------------------------------------------------------------------------------------
// Report.

struct SeedResult {
  uint64_t seed = 0;
  bool diverged = false;
  std::optional<double> val_loss;  // last validation of the run
  std::optional<double> best_val_loss;
  std::optional<double> test_loss, test_ppl, test_bpb;
  std::map<std::string, double> text_loss;     // stem -> loss
  std::map<std::string, double> variant_loss;  // variant -> loss on the eval split (GP: test RMSE)
  // GP runs: RMSE against the posterior mean (validation, test) and against the noisy targets.
  std::optional<double> val_rmse, test_rmse, test_rmse_targets, oracle_rmse_targets;
  int64_t steps_done = 0;
  double tokens_per_s = 0;  // median over logged steps
  double train_s = 0;
  std::vector<std::pair<double, double>> val_curve;  // (tokens, val loss)
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

SeedResult collect(const std::string& dir, uint64_t seed, const Suite& suite, const SuiteRun& run) {
  SeedResult r;
  r.seed = seed;
  const auto summary = read_json(dir + "/summary.json");
  r.diverged = summary && summary->value("status", "") == "diverged";
  if (summary) {
    if ((*summary)["last_val_loss"].is_number())
      r.val_loss = (*summary)["last_val_loss"].get<double>();
    if ((*summary)["best_val_loss"].is_number())
      r.best_val_loss = (*summary)["best_val_loss"].get<double>();
  }
  std::vector<double> rates;
  for (const json& m : read_jsonl(dir + "/metrics.jsonl")) {
    if (m["tokens_per_s"].is_number()) rates.push_back(m["tokens_per_s"].get<double>());
    if (m["elapsed_s"].is_number()) r.train_s = m["elapsed_s"].get<double>();
    if (m["val_loss"].is_number())
      r.val_curve.emplace_back(m["tokens"].get<double>(), m["val_loss"].get<double>());
  }
  r.tokens_per_s = median(rates);
  if (const auto e = read_json(eval_path(dir, suite.eval_split, ""))) {
    r.test_loss = (*e)["mean_loss"].get<double>();
    r.test_ppl = (*e)["perplexity"].get<double>();
    if ((*e)["bits_per_byte"].is_number()) r.test_bpb = (*e)["bits_per_byte"].get<double>();
  }
  for (const SuiteVariant& v : run.variants)
    if (const auto e = read_json(eval_path(dir, suite.eval_split, v.name)))
      r.variant_loss[v.name] = (*e)["mean_loss"].get<double>();
  for (const std::string& t : suite.eval_text)
    if (const auto e = read_json(text_eval_path(dir, t)))
      r.text_loss[stem(t)] = (*e)["mean_loss"].get<double>();
  return r;
}

// A GP run's seed, from the gp-run.json of `cemfrac gp --one`.
SeedResult collect_gp(const std::string& dir, uint64_t seed, const SuiteRun& run) {
  SeedResult r;
  r.seed = seed;
  const auto j = read_json(gp_result_path(dir));
  if (!j) return r;
  r.diverged = j->value("status", "") == "diverged";
  r.train_s = j->value("train_s", 0.0);
  r.steps_done = j->value("steps_done", int64_t{0});
  if (r.train_s > 0) r.tokens_per_s = static_cast<double>(r.steps_done) / r.train_s;  // steps/s
  auto rmse = [](const json& e, const char* key) -> std::optional<double> {
    if (!e.is_object() || !e.contains(key) || !e.at(key).is_number()) return std::nullopt;
    return e.at(key).get<double>();
  };
  if (r.diverged) return r;
  r.val_rmse = rmse(j->value("val", json()), "rmse_posterior");
  r.val_loss = r.val_rmse;
  r.test_rmse = rmse(j->value("test", json()), "rmse_posterior");
  r.test_rmse_targets = rmse(j->value("test", json()), "rmse_targets");
  if (j->contains("oracle_test_rmse_targets") && j->at("oracle_test_rmse_targets").is_number())
    r.oracle_rmse_targets = j->at("oracle_test_rmse_targets").get<double>();
  const json at = j->value("test_at_T", json::object());
  for (const SuiteVariant& v : run.variants) {
    const std::string key = std::to_string(v.cem_steps);
    if (at.contains(key))
      if (auto x = rmse(at.at(key), "rmse_posterior")) r.variant_loss[v.name] = *x;
  }
  return r;
}

std::optional<double> metric_of(const SeedResult& r, const std::string& metric,
                                const std::string& variant) {
  if (r.diverged) return std::nullopt;
  if (!variant.empty()) {
    auto it = r.variant_loss.find(variant);
    return it == r.variant_loss.end() ? std::nullopt : std::optional<double>(it->second);
  }
  if (metric == "test_loss") return r.test_loss;
  if (metric == "val_loss") return r.val_loss;
  if (metric == "test_rmse") return r.test_rmse;
  if (metric == "val_rmse") return r.val_rmse;
  if (metric == "test_rmse_targets") return r.test_rmse_targets;
  const std::string name = metric.substr(std::string("text_loss:").size());
  auto it = r.text_loss.find(name);
  return it == r.text_loss.end() ? std::nullopt : std::optional<double>(it->second);
}

std::string pm(const MeanSd& m, const char* fmt_spec = "{:.3f}") {
  if (m.n == 0) return "—";
  const std::string mean = fmt::format(fmt::runtime(fmt_spec), m.mean);
  if (m.n < 2) return mean;
  return mean + " ± " + fmt::format(fmt::runtime(fmt_spec), m.sd);
}

// A table's seeds cell: the seeds planned, or "k of n" while a partial report has k of them.
std::string seeds_cell(size_t finished, size_t planned) {
  return finished == planned ? std::to_string(planned) : fmt::format("{} of {}", finished, planned);
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

struct Report {
  json results;
  std::string markdown;
  std::map<std::string, std::string> plots;  // file name -> SVG
};

// The GP runs' table and their test-time table (markdown), and their entries of results.json's
// "runs" (appended to `runs`).
std::string gp_runs_section(const std::vector<RunPlan>& plans,
                            std::map<std::string, std::vector<SeedResult>>& results,
                            const Suite& suite, json& runs) {
  const SuiteGp& g = suite.gp;
  std::string md = fmt::format(
      "## GP runs (in-context regression, docs/gp.md)\n\n"
      "{} sequences per step, L = {}, positions {}; validation set {} and test set {} sequences "
      "(eval seed {}: the same sets for every run and seed; the seed sets the init and the "
      "training batches). RMSE against the GP posterior mean unless marked; mean ± sample "
      "standard deviation over seeds.\n\n",
      g.batch, g.layers, g.positions, with_commas(g.val_seqs), with_commas(g.test_seqs),
      g.eval_seed);
  md +=
      "| run | model | variant | trained T | params | steps | seeds | lr | val RMSE | test RMSE | "
      "test RMSE vs targets | steps/s "
      "|\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::optional<double> oracle;
  for (const RunPlan& p : plans) {
    if (!p.gp) continue;
    const SuiteRun& run = *p.run;
    const bool cem = run.gp.model == "cem";
    std::vector<double> val, test, targets, rate;
    int diverged = 0;
    size_t finished = 0;
    json seeds = json::array();
    for (const SeedResult& r : results[run.name]) {
      if (r.diverged || r.test_rmse) ++finished;
      auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
      seeds.push_back({{"seed", r.seed},
                       {"diverged", r.diverged},
                       {"val_rmse", opt(r.val_rmse)},
                       {"test_rmse", opt(r.test_rmse)},
                       {"test_rmse_targets", opt(r.test_rmse_targets)},
                       {"variant_rmse", r.variant_loss},
                       {"train_s", r.train_s},
                       {"steps_per_s", r.tokens_per_s}});
      if (r.diverged) {
        ++diverged;
        continue;
      }
      if (r.val_rmse) val.push_back(*r.val_rmse);
      if (r.test_rmse) test.push_back(*r.test_rmse);
      if (r.test_rmse_targets) targets.push_back(*r.test_rmse_targets);
      if (r.tokens_per_s > 0) rate.push_back(r.tokens_per_s);
      if (r.oracle_rmse_targets) oracle = r.oracle_rmse_targets;
    }
    md += fmt::format(
        "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", run.name,
        diverged ? fmt::format(" ({} diverged)", diverged) : "", run.gp.model,
        cem ? run.gp.variant : "–", cem ? std::to_string(run.gp.T) : "–", with_commas(p.params),
        with_commas(run.gp.steps), seeds_cell(finished, run.seeds.size()),
        p.lr > 0 ? lr_text(p.lr) + (run.lr_from.empty() ? "" : " (from " + run.lr_from + ")") : "—",
        pm(mean_sd(val), "{:.4f}"), pm(mean_sd(test), "{:.4f}"), pm(mean_sd(targets), "{:.4f}"),
        pm(mean_sd(rate), "{:.2f}"));
    json lrj = json::object();
    for (const auto& [k, v] : p.lr_search) lrj[k] = v ? json(*v) : json(nullptr);
    runs.push_back({{"name", run.name},
                    {"task", "gp"},
                    {"model", run.gp.model},
                    {"variant", cem ? json(run.gp.variant) : json(nullptr)},
                    {"T", cem ? json(run.gp.T) : json(nullptr)},
                    {"steps", run.gp.steps},
                    {"params", p.params},
                    {"lr", p.lr},
                    {"lr_from", run.lr_from},
                    {"lr_search", lrj},
                    {"seeds", seeds}});
  }
  md += "\n";
  if (oracle)
    md += fmt::format(
        "The oracle (the posterior mean itself) has RMSE {:.4f} against the noisy test targets: "
        "the floor of the \"vs targets\" column.\n\n",
        *oracle);

  bool any_variant = false;
  for (const RunPlan& p : plans) any_variant = any_variant || (p.gp && !p.run->variants.empty());
  if (any_variant) {
    // One row per run, one column per evaluated T (the union over runs): the trained T's cell is
    // the run's own test RMSE, in bold.
    std::set<int64_t> all_T;
    for (const RunPlan& p : plans)
      if (p.gp)
        for (const SuiteVariant& v : p.run->variants) all_T.insert(v.cem_steps);
    md +=
        "### GP: evaluated at T (test RMSE, the weights trained at the run's T; bold: the trained "
        "T)\n\n| run | trained T |";
    for (const int64_t T : all_T) md += fmt::format(" T = {} |", T);
    md += "\n|---|---:|";
    for (size_t i = 0; i < all_T.size(); ++i) md += "---:|";
    md += "\n";
    for (const RunPlan& p : plans) {
      if (!p.gp || p.run->variants.empty()) continue;
      md += fmt::format("| {} | {} |", p.run->name, p.run->gp.T);
      for (const int64_t T : all_T) {
        const SuiteVariant* v = nullptr;
        for (const SuiteVariant& c : p.run->variants)
          if (c.cem_steps == T) v = &c;
        if (!v) {
          md += " |";
          continue;
        }
        std::vector<double> x;
        for (const SeedResult& r : results[p.run->name]) {
          auto it = r.variant_loss.find(v->name);
          if (!r.diverged && it != r.variant_loss.end()) x.push_back(it->second);
        }
        const std::string cell = pm(mean_sd(x), "{:.4f}");
        md += T == p.run->gp.T && !x.empty() ? " **" + cell + "** |" : " " + cell + " |";
      }
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

// Test RMSE against T (log axis): per CEM reading, its runs trained at each T (evaluated at that
// T); per run with test-time steps, the same weights evaluated at each T (dashed in spirit: no
// band); the Llama baseline as a flat line over the range.
Plot gp_rmse_plot(const std::vector<RunPlan>& plans,
                  std::map<std::string, std::vector<SeedResult>>& results, const Suite& suite) {
  Plot plot;
  plot.title =
      fmt::format("{}: GP test RMSE against the posterior mean (± sd over seeds)", suite.name);
  plot.x_label = "CEM steps T";
  plot.y_label = "test RMSE";
  plot.log_x = true;
  auto stat = [&](const std::string& run, const std::string& variant) {
    std::vector<double> x;
    for (const SeedResult& r : results[run]) {
      if (r.diverged) continue;
      if (variant.empty() && r.test_rmse) x.push_back(*r.test_rmse);
      auto it = r.variant_loss.find(variant);
      if (!variant.empty() && it != r.variant_loss.end()) x.push_back(it->second);
    }
    return mean_sd(x);
  };
  auto add_point = [](PlotSeries& s, double x, const MeanSd& m) {
    s.x.push_back(x);
    s.y.push_back(m.n ? m.mean : std::nan(""));
    s.lo.push_back(m.mean - m.sd);
    s.hi.push_back(m.mean + m.sd);
  };
  std::vector<std::string> readings;
  int64_t t_lo = 1, t_hi = 1;
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->gp.model != "cem") continue;
    if (std::find(readings.begin(), readings.end(), p.run->gp.variant) == readings.end())
      readings.push_back(p.run->gp.variant);
    t_hi = std::max(t_hi, p.run->gp.T);
    for (const SuiteVariant& v : p.run->variants) t_hi = std::max(t_hi, v.cem_steps);
  }
  for (const std::string& reading : readings) {
    std::vector<std::pair<int64_t, MeanSd>> points;
    for (const RunPlan& p : plans)
      if (p.gp && p.run->gp.model == "cem" && p.run->gp.variant == reading)
        points.emplace_back(p.run->gp.T, stat(p.run->name, ""));
    std::sort(points.begin(), points.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    PlotSeries s;
    s.name = reading + " trained at T";
    s.band = false;
    for (const auto& [T, m] : points) add_point(s, static_cast<double>(T), m);
    plot.series.push_back(s);
  }
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->variants.empty()) continue;
    PlotSeries s;
    s.name = fmt::format("{} (trained at T={}) evaluated at T", p.run->name, p.run->gp.T);
    s.band = false;
    for (const SuiteVariant& v : p.run->variants)
      add_point(s, static_cast<double>(v.cem_steps), stat(p.run->name, v.name));
    plot.series.push_back(s);
  }
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->gp.model != "llama") continue;
    PlotSeries s;
    s.name = p.run->name + " (llama baseline)";
    s.band = false;
    const MeanSd m = stat(p.run->name, "");
    add_point(s, static_cast<double>(t_lo), m);
    add_point(s, static_cast<double>(t_hi), m);
    plot.series.push_back(s);
  }
  return plot;
}

Report make_report(const Suite& suite, const std::vector<RunPlan>& plans, const std::string& out,
                   int64_t train_split_tokens, const json& provenance) {
  Report rep;
  std::map<std::string, std::vector<SeedResult>> results;
  for (const RunPlan& p : plans)
    for (uint64_t seed : p.run->seeds) {
      const std::string dir = fmt::format("{}/final/{}/seed-{}", out, p.run->name, seed);
      results[p.run->name].push_back(p.gp ? collect_gp(dir, seed, *p.run)
                                          : collect(dir, seed, suite, *p.run));
    }

  json& J = rep.results;
  J["suite"] = suite.name;
  J["suite_file"] = suite.path;
  J["description"] = suite.description;
  J["provenance"] = provenance;
  J["data"] = suite.data;
  J["eval_split"] = suite.eval_split;
  J["train_split_tokens"] = train_split_tokens;

  std::string md;
  md += fmt::format("# Suite `{}`\n\n{}\n\n", suite.name, suite.description);
  md += fmt::format(
      "**Command:** `{}`  \n**Machine:** {}  \n**Date:** {}  \n**Commit:** {}  \n"
      "**Wall time of this invocation:** {}\n\n",
      provenance.value("command", ""), provenance.value("machine", ""),
      provenance.value("date", ""), provenance.value("commit", ""),
      provenance.value("wall_time", ""));
  const int64_t n_final = provenance.value("final_runs", int64_t{0});
  const int64_t n_done = provenance.value("final_runs_finished", int64_t{0});
  if (n_done < n_final)
    md += fmt::format(
        "**Partial report:** {} of {} final runs are trained and evaluated; the others show — "
        "and the claims use the seeds finished so far. Run the same command without --report "
        "to go on.\n\n",
        n_done, n_final);
  const bool has_lm = suite.has_task("lm"), has_gp = suite.has_task("gp");
  if (has_lm)
    md += fmt::format(
        "Data: `{}` (training split {} tokens); final numbers on the `{}` split. Loss in nats "
        "per token; mean ± sample standard deviation over seeds.\n\n",
        suite.data, with_commas(train_split_tokens), suite.eval_split);

  // Runs table.
  const size_t lm_begin = md.size();  // the LM table is dropped from a suite without LM runs
  md += "## Runs\n\n| run | params | tokens (epochs) | seeds | lr | val loss | " +
        suite.eval_split + " loss | " + suite.eval_split + " ppl | " + suite.eval_split +
        " bits/byte |";
  for (const std::string& t : suite.eval_text) md += fmt::format(" {} loss |", stem(t));
  md += " tokens/s (median step) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|";
  for (size_t i = 0; i < suite.eval_text.size(); ++i) md += "---:|";
  md += "---:|\n";
  json runs = json::array();
  std::vector<std::string> notes;
  for (const RunPlan& p : plans) {
    if (p.gp) continue;
    const auto& rs = results[p.run->name];
    std::vector<double> val, test, ppl, bpb, rate;
    std::map<std::string, std::vector<double>> text;
    int diverged = 0;
    size_t finished = 0;
    json seeds = json::array();
    for (const SeedResult& r : rs) {
      if (r.diverged || r.test_loss) ++finished;
      json s = {{"seed", r.seed},
                {"diverged", r.diverged},
                {"tokens_per_s", r.tokens_per_s},
                {"train_s", r.train_s}};
      auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
      s["val_loss"] = opt(r.val_loss);
      s["best_val_loss"] = opt(r.best_val_loss);
      s["test_loss"] = opt(r.test_loss);
      s["test_perplexity"] = opt(r.test_ppl);
      s["test_bits_per_byte"] = opt(r.test_bpb);
      s["text_loss"] = r.text_loss;
      s["variant_loss"] = r.variant_loss;
      s["val_curve"] = r.val_curve;
      seeds.push_back(s);
      if (r.diverged) {
        ++diverged;
        continue;
      }
      if (r.val_loss) val.push_back(*r.val_loss);
      if (r.test_loss) test.push_back(*r.test_loss);
      if (r.test_ppl) ppl.push_back(*r.test_ppl);
      if (r.test_bpb) bpb.push_back(*r.test_bpb);
      for (const auto& [k, v] : r.text_loss) text[k].push_back(v);
      if (r.tokens_per_s > 0) rate.push_back(r.tokens_per_s);  // a seed not trained yet has none
      if (r.val_loss && r.best_val_loss && *r.val_loss > *r.best_val_loss + 0.01)
        notes.push_back(
            fmt::format("{} seed {}: final validation loss {:.3f} is above its best {:.3f} "
                        "(overfitting or instability)",
                        p.run->name, r.seed, *r.val_loss, *r.best_val_loss));
    }
    const int64_t tokens = ((p.run->tokens + p.per_step - 1) / p.per_step) * p.per_step;
    const double epochs = train_split_tokens > 0 ? static_cast<double>(tokens) /
                                                       static_cast<double>(train_split_tokens)
                                                 : 0;
    md += fmt::format(
        "| {}{} | {} | {} ({:.2f}) | {} | {} | {} | {} | {} | {} |", p.run->name,
        diverged ? fmt::format(" ({} diverged)", diverged) : "", with_commas(p.params),
        with_commas(tokens), epochs, seeds_cell(finished, p.run->seeds.size()),
        p.lr > 0 ? lr_text(p.lr) + (p.run->lr_from.empty() ? "" : " (from " + p.run->lr_from + ")")
                 : "—",
        pm(mean_sd(val)), pm(mean_sd(test)), pm(mean_sd(ppl), "{:.1f}"), pm(mean_sd(bpb)));
    for (const std::string& t : suite.eval_text) md += " " + pm(mean_sd(text[stem(t)])) + " |";
    md += " " + pm(mean_sd(rate), "{:.0f}") + " |\n";
    json lrj = json::object();
    for (const auto& [k, v] : p.lr_search) lrj[k] = v ? json(*v) : json(nullptr);
    runs.push_back({{"name", p.run->name},
                    {"config", p.run->config},
                    {"set", p.run->sets},
                    {"params", p.params},
                    {"tokens", tokens},
                    {"epochs", epochs},
                    {"lr", p.lr},
                    {"lr_from", p.run->lr_from},
                    {"lr_search", lrj},
                    {"seeds", seeds}});
  }
  md += "\n";
  for (const std::string& n : notes) md += "- " + n + "\n";
  if (!notes.empty()) md += "\n";
  if (!has_lm) md.resize(lm_begin);
  if (has_gp) md += gp_runs_section(plans, results, suite, runs);
  J["runs"] = runs;

  // Learning-rate search.
  bool any_search = false;
  for (const RunPlan& p : plans) any_search = any_search || (!p.gp && !p.lr_search.empty());
  if (any_search) {
    md += fmt::format("## Learning-rate search ({} tokens, first seed, final validation loss)\n\n",
                      with_commas(suite.lr_search_tokens));
    md += "| run | lr: val loss |\n|---|---|\n";
    for (const RunPlan& p : plans) {
      if (p.gp || p.lr_search.empty()) continue;
      std::string cells;
      for (const auto& [k, v] : p.lr_search)
        cells += fmt::format("{}{}: {}", cells.empty() ? "" : ", ", k,
                             v ? fmt::format("{:.3f}", *v) : "diverged");
      md += fmt::format("| {} | {} ({}) |\n", p.run->name, cells,
                        p.lr > 0 ? "chose " + lr_text(p.lr) : "not chosen yet");
    }
    md += "\n";
  }
  bool any_gp_search = false;
  for (const RunPlan& p : plans) any_gp_search = any_gp_search || (p.gp && !p.lr_search.empty());
  if (any_gp_search) {
    md += fmt::format(
        "## GP learning-rate search ({} steps, first seed, validation RMSE against the posterior "
        "mean; the test set plays no part)\n\n",
        with_commas(suite.gp.search_steps));
    md += "| run | lr: val RMSE |\n|---|---|\n";
    for (const RunPlan& p : plans) {
      if (!p.gp || p.lr_search.empty()) continue;
      std::string cells;
      for (const auto& [k, v] : p.lr_search)
        cells += fmt::format("{}{}: {}", cells.empty() ? "" : ", ", k,
                             v ? fmt::format("{:.4f}", *v) : "diverged");
      md += fmt::format("| {} | {} ({}) |\n", p.run->name, cells,
                        p.lr > 0 ? "chose " + lr_text(p.lr) : "not chosen yet");
    }
    md += "\n";
  }

  // Test-time variants.
  bool any_variant = false;
  for (const RunPlan& p : plans) any_variant = any_variant || (!p.gp && !p.run->variants.empty());
  if (any_variant) {
    md += fmt::format("## Test-time variants ({} split, same checkpoints)\n\n", suite.eval_split);
    md += "| run | variant | set | loss | perplexity |\n|---|---|---|---:|---:|\n";
    for (const RunPlan& p : plans) {
      if (p.gp) continue;
      for (const SuiteVariant& v : p.run->variants) {
        std::vector<double> l, pp;
        for (const SeedResult& r : results[p.run->name]) {
          auto it = r.variant_loss.find(v.name);
          if (it == r.variant_loss.end() || r.diverged) continue;
          l.push_back(it->second);
          pp.push_back(std::exp(it->second));
        }
        std::string sets;
        for (const std::string& s : v.sets) sets += (sets.empty() ? "" : " ") + s;
        md += fmt::format("| {} | {} | `{}` | {} | {} |\n", p.run->name, v.name, sets,
                          pm(mean_sd(l)), pm(mean_sd(pp), "{:.1f}"));
      }
    }
    md += "\n";
  }

  // Claims.
  json claims = json::array();
  if (!suite.claims.empty()) {
    const std::string unit = !has_gp  ? "nats per token"
                             : has_lm ? "nats per token; RMSE for GP rows"
                                      : "RMSE";
    md += "## Claims\n\nd = a − b of the metric (" + unit +
          ", lower is better), paired over the seeds both "
          "rows share; 95% interval from Student's t with n − 1 degrees of freedom. `better`: "
          "supported "
          "when the interval lies below 0, contradicted when above 0; `not_worse` (margin m): "
          "supported "
          "when below +m, contradicted when above +m; otherwise, or with fewer than 2 seeds, "
          "inconclusive.\n\n";
    md +=
        "| claim | a | b | metric | test | d (mean) | 95% interval | n | verdict |\n"
        "|---|---|---|---|---|---:|---|---:|---|\n";
    for (const SuiteClaim& c : suite.claims) {
      std::vector<Verdict> vs;
      json pairs = json::array();
      std::string rows;
      for (const std::string& a : c.a) {
        const auto [an, av] = split_row(a);
        const auto [bn, bv] = split_row(c.b);
        std::vector<double> xa, xb;
        std::vector<uint64_t> used;
        for (const SeedResult& ra : results[an]) {
          for (const SeedResult& rb : results[bn]) {
            if (ra.seed != rb.seed) continue;
            const auto va = metric_of(ra, c.metric, av), vb = metric_of(rb, c.metric, bv);
            if (!va || !vb) continue;
            xa.push_back(*va);
            xb.push_back(*vb);
            used.push_back(ra.seed);
          }
        }
        const PairedDiff d = paired_difference(xa, xb);
        const Verdict v = d.diff.n == 0 ? Verdict::kInconclusive : verdict(d, c.test, c.margin);
        vs.push_back(v);
        pairs.push_back({{"a", a},
                         {"b", c.b},
                         {"seeds", used},
                         {"a_values", xa},
                         {"b_values", xb},
                         {"mean_diff", d.diff.mean},
                         {"sd_diff", d.diff.sd},
                         {"n", d.diff.n},
                         {"lo", d.has_interval ? json(d.lo) : json(nullptr)},
                         {"hi", d.has_interval ? json(d.hi) : json(nullptr)},
                         {"verdict", to_string(v)}});
        const std::string test =
            c.test == "better" ? "better" : fmt::format("not_worse (m = {:g})", c.margin);
        rows += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", c.id, a, c.b,
                            c.metric, test, d.diff.n ? fmt::format("{:+.4f}", d.diff.mean) : "—",
                            d.has_interval ? fmt::format("[{:+.4f}, {:+.4f}]", d.lo, d.hi) : "—",
                            d.diff.n, to_string(v));
      }
      const Verdict overall = combine(vs);
      md += rows;
      claims.push_back({{"id", c.id},
                        {"text", c.text},
                        {"source", c.source},
                        {"test", c.test},
                        {"margin", c.margin},
                        {"metric", c.metric},
                        {"pairs", pairs},
                        {"verdict", to_string(overall)}});
    }
    md += "\n| claim | statement | source | verdict |\n|---|---|---|---|\n";
    for (const json& c : claims)
      md += fmt::format("| {} | {} | {} | **{}** |\n", c["id"].get<std::string>(),
                        c["text"].get<std::string>(), c["source"].get<std::string>(),
                        c["verdict"].get<std::string>());
    md += "\n";
  }
  J["claims"] = claims;

  // Plots.
  if (has_gp) rep.plots["gp_rmse_vs_T.svg"] = to_svg(gp_rmse_plot(plans, results, suite));
  if (has_lm) {
    std::vector<RunPlan> lm_plans;  // the plots below are of the LM runs only
    for (const RunPlan& p : plans)
      if (!p.gp) lm_plans.push_back(p);
    Plot val;
    val.title =
        fmt::format("{}: validation loss during training (band: ± sd over seeds)", suite.name);
    val.x_label = "training tokens";
    val.y_label = "validation loss (nats/token)";
    for (const RunPlan& p : lm_plans) {
      PlotSeries s;
      s.name = p.run->name;
      std::map<double, std::vector<double>> at;
      for (const SeedResult& r : results[p.run->name])
        if (!r.diverged)
          for (const auto& [t, v] : r.val_curve) at[t].push_back(v);
      for (const auto& [t, v] : at) {
        const MeanSd m = mean_sd(v);
        s.x.push_back(t);
        s.y.push_back(m.mean);
        s.lo.push_back(m.mean - m.sd);
        s.hi.push_back(m.mean + m.sd);
      }
      val.series.push_back(s);
    }
    rep.plots["val_loss.svg"] = to_svg(val);

    Plot ppl;
    ppl.title = fmt::format("{}: {} perplexity (error bars: ± sd over seeds)", suite.name,
                            suite.eval_split);
    ppl.y_label = suite.eval_split + " perplexity";
    Plot pvp;
    pvp.title = fmt::format("{}: parameters against {} perplexity", suite.name, suite.eval_split);
    pvp.x_label = "parameters";
    pvp.y_label = suite.eval_split + " perplexity";
    PlotSeries bars;
    bars.name = suite.eval_split + " perplexity";
    bars.line = false;
    bars.band = false;
    for (size_t i = 0; i < lm_plans.size(); ++i) {
      std::vector<double> v;
      for (const SeedResult& r : results[lm_plans[i].run->name])
        if (!r.diverged && r.test_ppl) v.push_back(*r.test_ppl);
      const MeanSd m = mean_sd(v);
      ppl.categories.push_back(lm_plans[i].run->name);
      const double y = m.n ? m.mean : std::nan("");
      bars.x.push_back(static_cast<double>(i));
      bars.y.push_back(y);
      bars.lo.push_back(y - m.sd);
      bars.hi.push_back(y + m.sd);
      PlotSeries pt;
      pt.name = lm_plans[i].run->name;
      pt.line = false;
      pt.band = false;
      pt.x = {static_cast<double>(lm_plans[i].params)};
      pt.y = {y};
      pt.lo = {y - m.sd};
      pt.hi = {y + m.sd};
      pvp.series.push_back(pt);
    }
    ppl.series.push_back(bars);
    rep.plots["perplexity.svg"] = to_svg(ppl);
    rep.plots["params_vs_perplexity.svg"] = to_svg(pvp);

    Plot steps;
    steps.title = fmt::format("{}: CEM steps T at test time ({} perplexity, ± sd over seeds)",
                              suite.name, suite.eval_split);
    steps.x_label = "model.cem.steps at evaluation";
    steps.y_label = suite.eval_split + " perplexity";
    steps.log_x = true;
    for (const RunPlan& p : lm_plans) {
      PlotSeries s;
      s.name = p.run->name;
      for (const SuiteVariant& v : p.run->variants) {
        if (v.cem_steps <= 0) continue;
        std::vector<double> pp;
        for (const SeedResult& r : results[p.run->name]) {
          auto it = r.variant_loss.find(v.name);
          if (!r.diverged && it != r.variant_loss.end()) pp.push_back(std::exp(it->second));
        }
        const MeanSd m = mean_sd(pp);
        s.x.push_back(static_cast<double>(v.cem_steps));
        s.y.push_back(m.n ? m.mean : std::nan(""));
        s.lo.push_back(m.mean - m.sd);
        s.hi.push_back(m.mean + m.sd);
      }
      s.band = false;
      if (!s.x.empty()) steps.series.push_back(s);
    }
    if (!steps.series.empty()) rep.plots["cem_test_time_steps.svg"] = to_svg(steps);
  }
  md += "## Plots\n\n";
  for (const auto& [name, svg] : rep.plots) md += fmt::format("- [{}](plots/{})\n", name, name);
  md += "\n";
  rep.markdown = md;
  return rep;
}

// ---------------------------------------------------------------------------------------------------

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

// What makes one machine's timed steps say nothing about another's: the CPU (vendor, model name,
// how many flags it shows), its hardware threads and the BLAS core this process runs.
std::string machine_key() {
  const CpuFeatures cpu = read_cpu_features();
  return fmt::format("{} {} ({} CPU flags), {} hardware threads, BLAS core {}", cpu.vendor,
                     cpu.model_name, cpu.flags.size(), std::thread::hardware_concurrency(),
                     blas_status().core);
}

// The plan's timed steps are reused only on the machine that took them: OUT/plan/machine.txt
// records it, and timings from another machine, or from before the record existed, are deleted
// (they are the suite's own 3-step runs) so the plan times them again. Returns the line to print,
// "" when nothing was deleted.
std::string discard_other_machines_timings(const std::string& out) {
  const fs::path plan = fs::path(out) / "plan";
  const fs::path marker = plan / "machine.txt";
  const std::string here = machine_key();
  std::string there, line;
  if (fs::exists(marker)) {
    there = file_text(marker.string());
    while (!there.empty() && (there.back() == '\n' || there.back() == '\r')) there.pop_back();
  }
  std::vector<fs::path> timed;
  if (fs::is_directory(plan))
    for (const auto& e : fs::directory_iterator(plan))
      if (e.is_directory()) timed.push_back(e.path());
  if (!timed.empty() && there != here) {
    line = fmt::format(
        "plan: the {} timed run(s) in {} were taken {}; timing again on this machine ({})",
        timed.size(), plan.string(),
        there.empty() ? "on a machine not recorded" : "on another machine (" + there + ")", here);
    for (const fs::path& d : timed) fs::remove_all(d);
  }
  fs::create_directories(plan);
  if (there != here) write_file_atomic(marker.string(), here + "\n");
  return line;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace

Command add_compare(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string suite;
    std::string out;
    int jobs = 1;
    std::vector<std::string> eval_text;
    bool plan_only = false;
    bool report_only = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "compare", "Train and evaluate a suite of runs (configs/suites/*.toml) and test its claims");
  app->add_option("--suite", f->suite,
                  "Suite file (TOML: [suite], [[run]], [[claim]]; docs/compare.md)")
      ->required();
  app->add_option("--out", f->out, "Output folder (default runs/suites/<suite name>)");
  app->add_option("--jobs", f->jobs,
                  "Trainings/evaluations at once; --threads is split between them")
      ->check(CLI::Range(1, 64));
  app->add_option("--eval-text", f->eval_text,
                  "Also evaluate every final run on this text file (repeatable)");
  app->add_flag("--plan", f->plan_only, "Print the plan (with the timed steps) and stop");
  app->add_flag("--report", f->report_only,
                "Write the report from the jobs finished so far and run nothing (results.md says "
                "how many final runs it holds)")
      ->excludes("--plan");
  const GlobalOptions* g = &global;
  auto run = [f, g]() {
    const auto wall_start = Clock::now();
    Suite suite = load_suite(f->suite);
    for (const std::string& t : f->eval_text) suite.eval_text.push_back(t);
    std::set<std::string> stems;
    for (const std::string& t : suite.eval_text) {
      CEMFRAC_CHECK(fs::is_regular_file(t), "eval text '{}' not found", t);
      CEMFRAC_CHECK(stems.insert(stem(t)).second, "two eval texts named '{}'", stem(t));
    }
    for (const SuiteClaim& c : suite.claims)
      if (c.metric.rfind("text_loss:", 0) == 0)
        CEMFRAC_CHECK(stems.count(c.metric.substr(10)), "claim '{}': metric {} names no eval text",
                      c.id, c.metric);
    // A GP variant name is checked here (apply_gp_variant is in tasks/, beside compare/).
    for (const SuiteRun& r : suite.runs) {
      if (r.task != "gp" || r.gp.model != "cem") continue;
      try {
        ModelConfig probe;
        apply_gp_variant(probe, r.gp.variant);
      } catch (const Error& e) {
        fail("{}: run '{}': {}", r.gp.variant_at, r.name, e.what());
      }
    }
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
    const std::string out = f->out.empty() ? "runs/suites/" + suite.name : f->out;
    const int total_threads =
        g->threads > 0 ? g->threads : static_cast<int>(std::thread::hardware_concurrency());
    const int threads = std::max(1, total_threads / f->jobs);
    const std::string exe = fs::read_symlink("/proc/self/exe").string();
    fs::create_directories(out);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    // Numerics flags of this invocation go to every job (a child process starts with the CPU's
    // default floating-point mode).
    std::vector<std::string> job_globals;
    if (g->flush_denormal) job_globals.push_back("--flush-denormal");
    // Every job computes where the suite was asked to (the suite's runs may set train.device too).
    if (!g->device.empty()) job_globals.insert(job_globals.end(), {"--device", g->device});
    Runner runner(exe, f->jobs, threads, suite.name, job_globals);

    // 1. Plan: a timed 3-step training of every run (timings of another machine taken again).
    if (!f->report_only) {
      const std::string discarded = discard_other_machines_timings(out);
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
        if (f->report_only) continue;  // runs nothing, writes nothing but the report
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
      if (f->report_only) continue;
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
    if (!timing.empty() && !f->report_only) {
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
      return static_cast<double>(points) * static_cast<double>(c.train.eval_tokens) *
             p.s_per_token / 3;
    };
    const double eval_cost_tokens = 2.0 * static_cast<double>(eval_tokens) / 3;
    double search_s = 0, final_s = 0, eval_s = 0;
    std::string table =
        fmt::format("{:<24} {:>11} {:>9} {:>11} {:>8} {:>5} {:>22} {:>9}\n", "run", "params",
                    "tok/step", "tokens", "epochs", "seeds", "lr", "est.");
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
        fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n", "GP run",
                    "params", "model", "variant", "T", "steps", "seeds", "lr", "est.");
    // What is left: the jobs an earlier invocation finished are not (a resumed one counts in full).
    auto finished = [&](const RunPlan& p, const std::string& dir) {
      if (p.gp) return fs::exists(gp_result_path(dir));
      const std::string st = train_status(dir);
      return st == "completed" || st == "diverged";
    };
    double left_s = 0;
    size_t grid_n = 0, grid_done_n = 0, final_n = 0, final_done_n = 0;
    auto count_left = [&](const RunPlan& p, double search, double fin) {
      const SuiteRun& r = *p.run;
      if (search > 0) {
        size_t done = 0;
        for (double lr : r.lr)
          done += finished(p, fmt::format("{}/lr/{}/lr-{}", out, r.name, lr_text(lr)));
        grid_n += r.lr.size();
        grid_done_n += done;
        left_s +=
            search * static_cast<double>(r.lr.size() - done) / static_cast<double>(r.lr.size());
      }
      size_t done = 0;
      for (uint64_t seed : r.seeds)
        done += finished(p, fmt::format("{}/final/{}/seed-{}", out, r.name, seed));
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
        gp_table += fmt::format("{:<24} {:>9} {:>6} {:>16} {:>3} {:>9} {:>5} {:>22} {:>9}\n",
                                r.name, with_commas(p.params), r.gp.model, cem ? r.gp.variant : "-",
                                cem ? std::to_string(r.gp.T) : "-", with_commas(r.gp.steps),
                                r.seeds.size(), lr, format_duration((fin + search) / f->jobs));
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
          r.seeds.size(), lr, format_duration((fin + search + ev) / f->jobs));
    }
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    if (!f->report_only) {
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
          format_duration((search_s + final_s + eval_s) / f->jobs),
          format_duration(search_s / f->jobs), format_duration(final_s / f->jobs),
          format_duration(eval_s / f->jobs), f->jobs, threads, timed_when);
      if (grid_done_n + final_done_n > 0)
        fmt::print(
            "left: {} ({} of {} grid runs and {} of {} final runs finished by an earlier "
            "invocation; a run resumed from its checkpoint counts in full)\n",
            format_duration(left_s / f->jobs), grid_done_n, grid_n, final_done_n, final_n);
      std::fflush(stdout);
    }
    if (f->plan_only) return 0;

    // 2. Learning rates.
    std::vector<Job> search;
    for (RunPlan& p : plans) {
      const SuiteRun& r = *p.run;
      if (!r.lr_from.empty()) continue;
      if (r.lr.size() == 1) {
        p.lr = r.lr[0];
        continue;
      }
      if (p.gp) {
        // Chosen on the validation set at a short budget; the test set is not drawn.
        for (double lr : r.lr) {
          const GpSpec t =
              make_gp(suite, r, fmt::format("lr {} {}", r.name, lr_text(lr)),
                      fmt::format("{}/lr/{}/lr-{}", out, r.name, lr_text(lr)),
                      suite.gp.search_steps, lr, r.seeds.front(), suite.gp.val_seqs, false);
          if (f->report_only) continue;
          if (auto j = gp_job(t, suite.gp, gp_search_job_s(p))) search.push_back(*j);
        }
        continue;
      }
      for (double lr : r.lr) {
        TrainSpec t =
            make_train(r, suite.data, fmt::format("lr {} {}", r.name, lr_text(lr)),
                       fmt::format("{}/lr/{}/lr-{}", out, r.name, lr_text(lr)),
                       suite.lr_search_tokens, lr, suite.lr_min_ratio, r.seeds.front(), 1);
        if (f->report_only) continue;
        if (auto j = train_job(t, p.s_per_token)) search.push_back(*j);
      }
    }
    runner.run(search, "lr search");
    for (RunPlan& p : plans) {
      const SuiteRun& r = *p.run;
      if (!r.lr_from.empty() || r.lr.size() == 1) continue;
      double best = std::numeric_limits<double>::infinity();
      bool grid_done = true;  // false only with --report, before the search has finished
      for (double lr : r.lr) {
        const std::string dir = fmt::format("{}/lr/{}/lr-{}", out, r.name, lr_text(lr));
        std::optional<double> v;
        const bool done =
            p.gp ? fs::exists(gp_result_path(dir))
                 : (train_status(dir) == "completed" || train_status(dir) == "diverged");
        if (!done) {
          grid_done = false;
          continue;
        }
        if (p.gp) {
          // The validation RMSE against the posterior mean (a diverged value has none).
          const auto s = read_json(gp_result_path(dir));
          const json val = s ? s->value("val", json()) : json();
          if (s && s->value("status", "") == "completed" && val.is_object() &&
              val.contains("rmse_posterior") && val.at("rmse_posterior").is_number())
            v = val.at("rmse_posterior").get<double>();
        } else {
          const auto s = read_json(dir + "/summary.json");
          if (s && s->value("status", "") == "completed" && (*s)["last_val_loss"].is_number())
            v = (*s)["last_val_loss"].get<double>();
        }
        p.lr_search[lr_text(lr)] = v;
        if (v && *v < best) {
          best = *v;
          p.lr = lr;
        }
      }
      if (!grid_done) {
        p.lr = 0;  // not chosen yet: the report shows the grid values finished so far
        continue;
      }
      CEMFRAC_CHECK(p.lr > 0, "run '{}': every learning rate of the grid diverged", r.name);
    }
    for (RunPlan& p : plans)
      if (!p.run->lr_from.empty())
        for (const RunPlan& q : plans)
          if (q.run->name == p.run->lr_from) p.lr = q.lr;

    // 3. Final runs, each evaluated (4) as soon as it is trained: the evaluation split, every
    // test-time variant and every eval text. A run's folder is then finished on its own, so it
    // can be kept without its checkpoints (a committed suite) and is reused as it is.
    auto eval_jobs = [&](const RunPlan& p, uint64_t seed, const std::string& dir) {
      std::vector<Job> evals;
      auto add = [&](const std::string& label, const std::string& path,
                     std::vector<std::string> args, double tokens) {
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
    for (size_t k = 0; k < most_seeds && !f->report_only; ++k) {
      for (const RunPlan& p : plans) {
        if (k >= p.run->seeds.size()) continue;
        const uint64_t seed = p.run->seeds[k];
        if (p.gp) {  // a GP job evaluates its model itself
          const GpSpec t = make_gp(suite, *p.run, fmt::format("{} s{}", p.run->name, seed),
                                   fmt::format("{}/final/{}/seed-{}", out, p.run->name, seed),
                                   p.run->gp.steps, p.lr, seed, suite.gp.val_seqs, true);
          if (auto j = gp_job(t, suite.gp, gp_final_job_s(p))) finals.push_back(*j);
          continue;
        }
        const std::string dir = fmt::format("{}/final/{}/seed-{}", out, p.run->name, seed);
        TrainSpec t = make_train(*p.run, suite.data, fmt::format("{} s{}", p.run->name, seed), dir,
                                 p.run->tokens, p.lr, suite.lr_min_ratio, seed, suite.val_points);
        if (auto j = train_job(t, p.s_per_token)) {
          j->then = eval_jobs(p, seed, dir);
          finals.push_back(*j);
          continue;
        }
        if (train_status(dir) != "completed") continue;  // diverged: reported as such
        std::vector<Job> evals = eval_jobs(p, seed, dir);
        CEMFRAC_CHECK(evals.empty() || has_checkpoint(dir),
                      "{} is trained but has no checkpoint left to evaluate ({} missing; a suite "
                      "kept without its checkpoints): remove that directory to train it again",
                      dir, evals.front().capture);
        finals.insert(finals.end(), evals.begin(), evals.end());
      }
    }
    if (!f->report_only) runner.run(finals, "final");

    // 5. Report. A final run is finished when it is trained (or diverged) and evaluated.
    int64_t n_final = 0, n_finished = 0;
    for (const RunPlan& p : plans)
      for (uint64_t seed : p.run->seeds) {
        const std::string dir = fmt::format("{}/final/{}/seed-{}", out, p.run->name, seed);
        ++n_final;
        const std::string st = train_status(dir);
        n_finished +=
            p.gp ? fs::exists(gp_result_path(dir))
                 : st == "diverged" || (st == "completed" && eval_jobs(p, seed, dir).empty());
      }
    std::string command = "cemfrac";
    if (g->threads > 0) command += fmt::format(" --threads {}", g->threads);
    if (g->flush_denormal) command += " --flush-denormal";
    command += " compare --suite " + f->suite;
    if (!f->out.empty()) command += " --out " + f->out;
    if (f->report_only) command += " --report";
    if (f->jobs != 1) command += fmt::format(" --jobs {}", f->jobs);
    for (const std::string& t : f->eval_text) command += " --eval-text " + t;
    const std::string commit = build_commit();  // the binary's, not the working directory's
    const json provenance = {
        {"command", command},
        {"machine", machine_text()},
        {"date", utc_now()},
        {"commit", commit},
        {"version", CEMFRAC_VERSION},
        {"final_runs", n_final},
        {"final_runs_finished", n_finished},
        {"wall_time",
         format_duration(seconds_since(wall_start)) +
             " (jobs already finished by an earlier invocation were reused, not timed)"}};
    const Report rep = make_report(suite, plans, out, train_tokens, provenance);
    fs::create_directories(out + "/plots");
    for (const auto& [name, svg] : rep.plots) write_file_atomic(out + "/plots/" + name, svg);
    write_file_atomic(out + "/results.json", rep.results.dump(2) + "\n");
    write_file_atomic(out + "/results.md", rep.markdown);
    fmt::print("\n{}", rep.markdown);
    fmt::print("results: {}/results.md, {}/results.json; plots: {}/plots/\n", out, out, out);
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

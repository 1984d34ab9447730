// The suite's process scheduler: every training and evaluation of `cemfrac compare` is a child
// process of the same binary (`cemfrac train`, `eval`, `gp --one`), at most `jobs` at once, each
// with its own log. A Ctrl-C (SIGINT/SIGTERM) is forwarded to the running children once (a training
// checkpoints and stops), and the children die with the runner: a killed `compare` leaves no
// training behind (PR_SET_PDEATHSIG, then a check that the parent is still the one that forked).
// The progress line (stderr) shows the phase, the jobs done and the ETA (progress.h).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cemfrac {

// One child process.
struct Job {
  std::string label;
  std::vector<std::string> args;  // after `cemfrac --threads K`
  std::string dir;        // training: the run directory (LM: progress from its metrics.jsonl)
  std::string log;        // stdout + stderr (training), stderr (eval)
  std::string capture;    // eval: stdout goes to this file (under a temporary name unique to this
                          // process until the job succeeds)
  int64_t tokens = 0;     // LM training: tokens of the whole run
  int64_t steps = 0;      // GP training: steps of the whole run (progress from its log)
  double est_s = 0;       // estimated seconds at the planned threads
  int threads = 0;        // > 0: this job's --threads (GP jobs), else the runner's
  std::vector<Job> then;  // run next, once this training completed (its evaluations)
  std::string remove_after;  // removed once the job succeeded (a GP run's checkpoints)
  // (path, text) files written just before the job starts: the settings record of a fine-tuning,
  // which may not exist in its run's folder before that run is trained.
  std::vector<std::pair<std::string, std::string>> write_first;
};

// The estimated seconds and the number of `jobs` with every job they lead to.
double total_est_s(const std::vector<Job>& jobs);
size_t total_jobs(const std::vector<Job>& jobs);

// SIGINT and SIGTERM set the runner's stop flag (the running children are asked to stop once).
void install_stop_signals();
bool stop_requested();

class Runner {
 public:
  // `exe`: the cemfrac binary; `binary`: how each job's log names it ("cemfrac 0.1 (commit ...)");
  // `global`: global flags every job gets besides --threads (e.g. --flush-denormal).
  Runner(std::string exe, int jobs, int threads_per_job, std::string title, std::string binary,
         std::vector<std::string> global = {});

  // Runs every job (at most `jobs` at once). A training that completes puts the jobs of its `then`
  // next in the queue, so a run is evaluated as soon as it is trained (and its folder is then
  // finished, whatever happens to the rest of the suite). Throws on the first failure after the
  // running jobs end, or when interrupted.
  void run(const std::vector<Job>& jobs, const std::string& phase);

 private:
  struct Running {
    Job job;  // est_s: what is left of the job when it started (a resumed training's part)
    pid_t pid = 0;
    std::string capture_tmp;      // where the child's stdout goes until it succeeds
    int64_t at_start = 0;         // training: tokens (LM) or steps (GP) done when it started
    std::uintmax_t log_from = 0;  // GP training: where this invocation's part of its log begins
    bool signalled = false;
  };

  Running launch(const Job& job);
  std::pair<int64_t, int64_t> position(const Running& r) const;
  std::string finish(const Running& r, int status, bool& completed, bool& ended);
  void print_progress(const std::vector<Running>& running, size_t n_jobs);

  std::string exe_;
  int jobs_;
  int threads_;
  std::string title_;
  std::string binary_;
  bool tty_;
  std::vector<std::string> global_;
  std::string phase_;
  double total_est_ = 0, done_est_ = 0;
  size_t finished_ = 0;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace cemfrac

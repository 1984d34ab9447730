#include "cemfrac/compare/runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cemfrac/compare/progress.h"
#include "cemfrac/compare/run_files.h"
#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/tasks/gp_experiment.h"  // last_logged_step
#include "cemfrac/train/checkpoint.h"     // list_checkpoints
#include "cemfrac/train/run_dir.h"

extern char** environ;

namespace cemfrac {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

// A descriptor that closes itself (and never leaks into another child: all are close-on-exec).
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Starts `argv[0]` with stdin from /dev/null, stderr appended to `log` and stdout into `out_path`
// (truncated) or the log. The child has its own process group (a terminal's Ctrl-C reaches it
// only through the runner) and dies with the runner: PR_SET_PDEATHSIG, then a check that the
// parent is still the one that forked it (it may have died before the call). Between fork and
// exec the child only makes system calls. Throws when the binary cannot be started.
pid_t spawn_child(const std::vector<std::string>& argv_s, const std::string& log,
                  const std::string& out_path) {
  std::vector<char*> argv;
  for (const std::string& s : argv_s) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  const Fd in(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const Fd err(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  CEMFRAC_CHECK(err.fd >= 0, "cannot open {}: {}", log, std::strerror(errno));
  const Fd out(out_path.empty()
                   ? -1
                   : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  CEMFRAC_CHECK(out_path.empty() || out.fd >= 0, "cannot open {}: {}", out_path,
                std::strerror(errno));
  int report[2];  // the child's exec errno, if exec fails (closed by a successful exec)
  CEMFRAC_CHECK(::pipe2(report, O_CLOEXEC) == 0, "cannot create a pipe: {}", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the runner dying takes its jobs with it
    if (::getppid() != parent) ::_exit(125);
    ::close(report[0]);
    if (in.fd >= 0) ::dup2(in.fd, STDIN_FILENO);
    ::dup2(err.fd, STDERR_FILENO);
    ::dup2(out.fd >= 0 ? out.fd : err.fd, STDOUT_FILENO);
    ::execve(argv[0], argv.data(), environ);
    const int e = errno;
    [[maybe_unused]] const ssize_t w = ::write(report[1], &e, sizeof e);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    fail("cannot start {}: {}", argv_s[0], std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also here, so the group exists whichever side runs first
  int child_errno = 0;
  ssize_t got = 0;
  do {
    got = ::read(report[0], &child_errno, sizeof child_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    fail("cannot start {}: {}", argv_s[0], std::strerror(child_errno));
  }
  return pid;
}

}  // namespace

void install_stop_signals() {
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
}

bool stop_requested() {
  return g_stop != 0;
}

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

Runner::Runner(std::string exe, int jobs, int threads_per_job, std::string title,
               std::string binary, std::vector<std::string> global)
    : exe_(std::move(exe)), jobs_(jobs), threads_(threads_per_job), title_(std::move(title)),
      binary_(std::move(binary)), tty_(isatty(STDERR_FILENO) != 0), global_(std::move(global)) {}

void Runner::run(const std::vector<Job>& jobs_in, const std::string& phase) {
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
      const std::string problem = finish(running[i], status, completed, ended);
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

Runner::Running Runner::launch(const Job& job) {
  for (const auto& [path, text] : job.write_first) {
    fs::create_directories(fs::path(path).parent_path());
    write_file_atomic(path, text);
  }
  fs::create_directories(fs::path(job.log).parent_path());
  std::vector<std::string> argv_s = {exe_, "--threads",
                                     std::to_string(job.threads > 0 ? job.threads : threads_)};
  argv_s.insert(argv_s.end(), global_.begin(), global_.end());
  argv_s.insert(argv_s.end(), job.args.begin(), job.args.end());
  {
    std::ofstream log(job.log, std::ios::app);
    log << "== cemfrac";
    for (size_t i = 1; i < argv_s.size(); ++i) log << ' ' << argv_s[i];
    // The binary that ran this job: a suite kept across sittings may be trained by several.
    log << "\n== binary: " << binary_ << "\n";
  }
  Running r;
  r.job = job;
  if (!job.capture.empty()) r.capture_tmp = unique_temp_path(job.capture);
  r.pid = spawn_child(argv_s, job.log, r.capture_tmp);
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
std::pair<int64_t, int64_t> Runner::position(const Running& r) const {
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
std::string Runner::finish(const Running& r, int status, bool& completed, bool& ended) {
  const Job& job = r.job;
  completed = false;
  ended = false;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (!job.capture.empty()) {
    if (code == 0) {
      commit_temp_file(r.capture_tmp, job.capture);
      if (!job.remove_after.empty()) fs::remove_all(job.remove_after);
      ended = true;
      return "";
    }
    std::error_code ec;
    fs::remove(r.capture_tmp, ec);
    if (g_stop) return "";
    return fmt::format("{} failed (exit {}): {} (log: {})", job.label, code, log_problem(job.log),
                       job.log);
  }
  const RunStatus st = run_status(job.dir);
  completed = st == RunStatus::kCompleted;
  ended = run_ended(st);
  if (ended || g_stop) return "";  // stopped by an interrupt: it resumes next time
  return fmt::format("{} failed (exit {}): {} (log: {})", job.label, code, log_problem(job.log),
                     job.log);
}

void Runner::print_progress(const std::vector<Running>& running, size_t n_jobs) {
  double live = 0;
  std::string names;
  for (const Running& r : running) {
    const auto [now, whole] = position(r);
    const double frac =
        whole > 0 ? std::clamp(static_cast<double>(now) / static_cast<double>(whole), 0.0, 1.0) : 0;
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
      total_est_ > 0 ? 100 * done / total_est_ : 100.0, finished_, n_jobs, format_duration(elapsed),
      format_duration(eta), names.empty() ? "" : " | ", names);
  if (tty_) {
    fmt::print(stderr, "\r\033[K{}", line.substr(0, 200));
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  std::fflush(stderr);
}

}  // namespace cemfrac

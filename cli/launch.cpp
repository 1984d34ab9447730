// cemfrac launch --nproc N -- <cemfrac arguments>: starts N ranks of this cemfrac on this machine
// with torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, TORCHELASTIC_USE_AGENT_STORE=True), hosts the TCPStore itself, and supervises
// the ranks:
// - a rank that fails (non-zero exit or a signal) makes the launcher wait --grace seconds for the
//   others to notice on their own (they exit naming the lost rank), then kill what is left, and
//   exit 1 naming the first failed rank;
// - SIGINT/SIGTERM to the launcher is forwarded once to every rank (each is in its own process
//   group, so a terminal's Ctrl-C reaches them only through the launcher): the ranks agree on the
//   step to stop at and rank 0 saves one checkpoint; ranks that exit 3 (interrupted, as `train`),
//   with none failed, make the launcher exit 3 too.
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cemfrac/core/check.h"
#include "cemfrac/dist/process_group.h"
#include "cli/commands.h"

namespace cemfrac::cli {
namespace {

std::atomic<int> g_forward_signal{0};
void on_launcher_signal(int sig) {
  g_forward_signal.store(sig);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "stopped";
}

// A rank stopped by SIGINT/SIGTERM after its checkpoint (`train` exits kExitInterrupted).
bool interrupted(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == kExitInterrupted;
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !interrupted(status);
}

}  // namespace

// The flags, one declaration each (which makes this function long), then the command they run.
Command add_launch(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    int nproc = 2;
    std::string master_addr = "127.0.0.1";
    int master_port = 0;
    double grace = 10;
    double connect_timeout = 0;
    double collective_timeout = 0;
    std::vector<std::string> command;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Run a cemfrac command as N data-parallel ranks on this machine (torchrun's environment; "
      "e.g. cemfrac launch --nproc 2 -- train --config configs/small-llama.toml)");
  app->footer(
      "Exit codes: 0 every rank exited 0; 1 a rank failed (named; the others are stopped, then "
      "killed after --grace); 2 usage error; 3 ranks interrupted by SIGINT/SIGTERM (exit 3, "
      "checkpoint saved) and none failed.");
  app->add_option("--nproc", f->nproc, "Number of ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app->add_option("--master-addr", f->master_addr, "Address the store listens on")
      ->capture_default_str();
  app->add_option("--master-port", f->master_port, "Store port (0 = a free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app->add_option("--grace", f->grace,
                  "Seconds the other ranks get to exit on their own after one fails, before they "
                  "are killed")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--connect-timeout", f->connect_timeout,
                  "Passed to the ranks as CEMFRAC_CONNECT_TIMEOUT (seconds)")
      ->check(CLI::PositiveNumber);
  app->add_option("--collective-timeout", f->collective_timeout,
                  "Passed to the ranks as CEMFRAC_COLLECTIVE_TIMEOUT (seconds)")
      ->check(CLI::PositiveNumber);
  app->add_option("command", f->command, "The cemfrac arguments of every rank, after --")
      ->required();
  auto run = [f, &global]() {
    const int n = f->nproc;
    StoreServer store(f->master_addr, f->master_port,
                      f->connect_timeout > 0 ? f->connect_timeout : 60.0);
    const int port = store.port();

    std::vector<std::string> argv_s;
    argv_s.push_back("/proc/self/exe");
    // The launcher's --device reaches every rank (each then checks it; with cuda each rank takes
    // cuda:LOCAL_RANK: dist/env.h, data_parallel_device).
    if (!global.device.empty()) argv_s.insert(argv_s.end(), {"--device", global.device});
    for (const auto& a : f->command) argv_s.push_back(a);

    // Forwarded signals: installed before the first fork so none is lost.
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    struct sigaction old_int {
    }, old_term{};
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    std::vector<pid_t> pids(n, -1);
    const pid_t launcher = getpid();
    for (int r = 0; r < n; ++r) {
      const pid_t pid = fork();
      CEMFRAC_CHECK(pid >= 0, "launch: fork failed: {}", std::strerror(errno));
      if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // the launcher dying takes the ranks with it
        if (getppid() != launcher) _exit(125);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        setenv("MASTER_ADDR", f->master_addr.c_str(), 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("GROUP_RANK", "0", 1);
        setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
        setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
        if (f->connect_timeout > 0)
          setenv("CEMFRAC_CONNECT_TIMEOUT", fmt::format("{}", f->connect_timeout).c_str(), 1);
        if (f->collective_timeout > 0)
          setenv("CEMFRAC_COLLECTIVE_TIMEOUT", fmt::format("{}", f->collective_timeout).c_str(), 1);
        std::vector<char*> argv;
        for (auto& a : argv_s) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        std::fprintf(stderr, "cemfrac: error: launch: cannot run %s: %s\n", argv[0],
                     std::strerror(errno));
        _exit(127);
      }
      pids[r] = pid;
    }

    using Clock = std::chrono::steady_clock;
    std::vector<int> statuses(n, 0);
    int alive = n;
    int first_failed = -1;
    Clock::time_point kill_at{};
    bool forwarded = false, killed = false;
    while (alive > 0) {
      const int sig = g_forward_signal.load();
      if (sig != 0 && !forwarded) {
        for (int r = 0; r < n; ++r)
          if (pids[r] > 0) kill(pids[r], sig);
        forwarded = true;
      }
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        for (int r = 0; r < n; ++r) {
          if (pids[r] != pid) continue;
          pids[r] = -1;
          statuses[r] = status;
          --alive;
          if (failed(status) && first_failed < 0) {
            first_failed = r;
            kill_at =
                Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(f->grace * 1000));
          }
        }
        continue;
      }
      if (first_failed >= 0 && !killed && Clock::now() >= kill_at) {
        for (int r = 0; r < n; ++r)
          if (pids[r] > 0) kill(pids[r], SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    if (first_failed >= 0) {
      fail("launch: rank {} of {} {}; the other ranks were {}", first_failed, n,
           describe_status(statuses[first_failed]),
           killed ? "killed after the grace period" : "stopped");
    }
    // Interrupted ranks and none failed: the launcher exits as `train` does, 3.
    int stopped = 0;
    for (int r = 0; r < n; ++r) stopped += interrupted(statuses[r]) ? 1 : 0;
    if (stopped > 0) {
      fmt::print(stderr, "cemfrac: launch: {} of {} rank(s) interrupted (exit code 3)\n", stopped,
                 n);
      return kExitInterrupted;
    }
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

// Shared test helpers.
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace cemfrac::test {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the built cemfrac executable with `args` (each passed as one argument), optional stdin text.
RunResult run_cemfrac(const std::vector<std::string>& args, const std::string& stdin_text = "");
// The same with another executable (a test build of the CLI, e.g. cemfrac_faults).
RunResult run_program(const std::string& exe, const std::vector<std::string>& args,
                      const std::string& stdin_text = "");

// Expects a failed run that printed exactly one line on stderr, "cemfrac: error: ...", containing
// `needle`, and exited non-zero without a signal.
void expect_one_line_error(const RunResult& r, const std::string& needle);

// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);

// Path of a file in the source tree (tests/fixtures/..., configs/...).
std::string source_path(const std::string& relative);

// Whether `checkpoints` (a run's checkpoints/ folder) holds a complete checkpoint: an entry that is
// not a save still being written (".tmp-"). For waiting on a background training.
bool has_complete_checkpoint(const std::string& checkpoints);

// Whether the BLAS in this process (the LibTorch the tests link, as the CLI does) is OpenBLAS: Debian's
// LibTorch loads it; a pip torch carries MKL instead, and there is no OpenBLAS core to report or choose.
bool blas_is_openblas();

// A cemfrac process running in the background, stdout and stderr to `log_dir`/stdout and /stderr
// (killed with SIGKILL by the destructor if it still runs: a failed assertion leaves nothing behind).
struct Background {
  Background(const std::vector<std::string>& args, const std::string& log_dir);
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  // Polls `ready` every millisecond (up to 60 s) while the process lives; true when it held.
  bool wait_for(const std::function<bool()>& ready);
  // Sends `sig` (unless it already ended) and returns the exit code (128 + signal when killed).
  int stop(int sig);
  int wait();  // the exit code, as stop()
  std::string err() const;

  pid_t pid = -1;
  std::string log_dir;
  bool exited = false;
  int exit_status = 0;
};

}  // namespace cemfrac::test

// Shared test helpers.
#pragma once
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

// Expects a failed run that printed exactly one line on stderr, "cemfrac: error: ...", containing
// `needle`, and exited non-zero without a signal.
void expect_one_line_error(const RunResult& r, const std::string& needle);

// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& tag);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);

// Path of a file in the source tree (tests/fixtures/..., configs/...).
std::string source_path(const std::string& relative);

}  // namespace cemfrac::test

#include "tests/test_util.h"

#include "cemfrac/core/atomic_file.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace cemfrac::test {
namespace fs = std::filesystem;

namespace {
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit([] {
      for (const auto& d : temp_dirs()) {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    });
  }
  return dirs;
}
}  // namespace

std::string temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("cemfrac-test-" + tag + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  temp_dirs().push_back(pattern);
  return pattern;
}

std::string read_file(const std::string& path) {
  return cemfrac::read_file(path);
}

bool has_complete_checkpoint(const std::string& checkpoints) {
  std::error_code ec;
  if (!std::filesystem::is_directory(checkpoints, ec)) return false;
  for (const auto& e : std::filesystem::directory_iterator(checkpoints, ec))
    if (e.path().filename().string().find(".tmp-") == std::string::npos) return true;
  return false;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string source_path(const std::string& relative) {
  return std::string(CEMFRAC_SOURCE_DIR) + "/" + relative;
}

void expect_one_line_error(const RunResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_EQ(r.err.rfind("cemfrac: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

RunResult run_cemfrac(const std::vector<std::string>& args, const std::string& stdin_text) {
  return run_program(CEMFRAC_EXE, args, stdin_text);
}

RunResult run_program(const std::string& exe, const std::vector<std::string>& args,
                      const std::string& stdin_text) {
  const std::string dir = temp_dir("run");
  const std::string in = dir + "/stdin", out = dir + "/stdout", err = dir + "/stderr";
  write_file(in, stdin_text);
  std::string cmd = shell_quote(exe);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " <" + shell_quote(in) + " >" + shell_quote(out) + " 2>" + shell_quote(err);
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

namespace {
int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
}  // namespace

Background::Background(const std::vector<std::string>& args, const std::string& logs)
    : log_dir(logs) {
  std::vector<std::string> all = {CEMFRAC_EXE};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, (log_dir + "/stdout").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, (log_dir + "/stderr").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
}

Background::~Background() {
  if (!exited && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &exit_status, 0);
  }
}

bool Background::wait_for(const std::function<bool()>& ready) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      exit_status = status;
      return ready();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

int Background::stop(int sig) {
  if (!exited) {
    kill(pid, sig);
    waitpid(pid, &exit_status, 0);
    exited = true;
  }
  return exit_code_of(exit_status);
}

int Background::wait() {
  if (!exited) waitpid(pid, &exit_status, 0);
  exited = true;
  return exit_code_of(exit_status);
}

std::string Background::err() const {
  return read_file(log_dir + "/stderr");
}

bool blas_is_openblas() {
  return dlsym(RTLD_DEFAULT, "openblas_get_corename") != nullptr;
}

}  // namespace cemfrac::test

// Helpers of the reliability tests (ctest label `reliability`): a tiny prepared byte-level dataset
// and a run config of a model that trains in milliseconds per step, as tests/cli/train_cli_test.cpp
// uses them.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac::rel {

// A prepared byte-level dataset: 24 documents of ~300 bytes (val and test get ~2 each).
inline const std::string& data_dir() {
  static const std::string dir = [] {
    const std::string src = test::temp_dir("rel-src");
    for (int d = 0; d < 24; ++d) {
      std::string text;
      for (int i = 0; text.size() < 300; ++i)
        text += "document " + std::to_string(d) + " says line " + std::to_string(i) + ". ";
      test::write_file(src + "/doc" + std::to_string(d) + ".txt", text);
    }
    const std::string out = test::temp_dir("rel-data") + "/data";
    const test::RunResult r = test::run_cemfrac(
        {"prepare", "--text", src, "--tokenizer", "byte", "--out", out, "--split", "80,10,10"});
    if (r.exit_code != 0) throw std::runtime_error("prepare failed: " + r.err);
    return out;
  }();
  return dir;
}

// <dir>/run.toml: a tiny model trained for `steps` steps into `out`, a checkpoint every step.
inline std::string write_config(const std::string& dir, const std::string& out, int64_t steps,
                                const std::string& extra_train = "") {
  const std::string path = dir + "/run.toml";
  test::write_file(path,
                   "[model]\nvocab_size = 257\nd_model = 16\nn_layers = 1\nn_heads = 2\n"
                   "d_ff = 32\ncontext = 16\n\n[data]\npath = \"" +
                       data_dir() + "\"\n\n[train]\nsteps = " + std::to_string(steps) +
                       "\nmicro_batch = 2\nwarmup_steps = 2\nlog_every = 1\neval_every = 0\n"
                       "eval_tokens = 64\ncheckpoint_every = 1\nkeep_checkpoints = 3\nout = \"" +
                       out + "\"\n" + extra_train);
  return path;
}

// test::write_file, creating the parent directories first.
inline void put(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  test::write_file(path, content);
}

// A failed run whose last stderr line is the error, "cemfrac: error: ..." containing `needle`
// (commands with progress lines on stderr, such as prepare, print those first).
inline void expect_last_line_error(const test::RunResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  const std::string last =
      err.substr(err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("cemfrac: error: ", 0), 0u) << r.err;
  EXPECT_NE(last.find(needle), std::string::npos) << "wanted: " << needle << "\n" << r.err;
}

inline std::vector<std::string> train_args(const std::string& config,
                                           std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--threads", "1", "train", "--config", config, "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

inline size_t metrics_lines(const std::string& run) {
  std::error_code ec;
  if (!std::filesystem::exists(run + "/metrics.jsonl", ec)) return 0;
  const std::string text = test::read_file(run + "/metrics.jsonl");
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace cemfrac::rel

// The CLI's contract with users: clear one-line errors with a non-zero exit, never a crash or a raw
// exception dump; `info --json` reports what the program runs on.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

using test::expect_one_line_error;

TEST(Cli, NoCommand) {
  expect_one_line_error(run_cemfrac({}), "subcommand is required");
}

TEST(Cli, UnknownCommand) {
  expect_one_line_error(run_cemfrac({"trian"}), "unknown command 'trian'");
  // Also with --help or --version after it: exit 2, never the top-level help.
  for (const char* flag : {"--help", "-h", "--version"}) {
    const test::RunResult r = run_cemfrac({"--threads", "1", "fine-tune", flag});
    expect_one_line_error(r, "unknown command 'fine-tune'");
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_EQ(r.out, "") << flag;
  }
  EXPECT_EQ(run_cemfrac({"train", "--help"}).exit_code, 0);
  EXPECT_EQ(run_cemfrac({"--help"}).exit_code, 0);
}

TEST(Cli, UnknownFlag) {
  expect_one_line_error(run_cemfrac({"info", "--bogus"}), "--bogus");
}

TEST(Cli, BadThreads) {
  expect_one_line_error(run_cemfrac({"--threads", "many", "info"}), "--threads");
  expect_one_line_error(run_cemfrac({"--threads", "-2", "info"}), "--threads");
}

TEST(Cli, UnknownBlasCore) {
  expect_one_line_error(run_cemfrac({"--blas-core", "Pentium9", "info"}), "Pentium9");
}

TEST(Cli, HelpAndVersionExitZero) {
  auto help = run_cemfrac({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* cmd : {"info", "tokenize", "prepare", "bench"})
    EXPECT_NE(help.out.find(cmd), std::string::npos) << cmd << " missing from --help";
  auto version = run_cemfrac({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("cemfrac "), std::string::npos);
}

TEST(Cli, InfoJson) {
  auto r = run_cemfrac({"--threads", "1", "info", "--json", "--sgemm-size", "128"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_FALSE(j["libtorch"].get<std::string>().empty());
  EXPECT_EQ(j["blas"]["sgemm_check"], "pass");
  EXPECT_GT(j["sgemm_gflops"].get<double>(), 0.1);
  if (test::blas_is_openblas()) {
    EXPECT_FALSE(j["blas"]["core"].get<std::string>().empty()) << "OpenBLAS core not reported";
  } else {  // a pip torch: MKL inside LibTorch, said so, and no core
    EXPECT_EQ(j["blas"]["core"], "");
    EXPECT_NE(j["blas"]["library"].get<std::string>().find("not OpenBLAS"), std::string::npos);
  }
}

TEST(Cli, BlasOverrideIsReported) {
  auto r = run_cemfrac({"--blas-core", "Prescott", "info", "--json", "--sgemm-size", "64"});
  if (!test::blas_is_openblas()) {  // nothing to choose: a named core is a one-line error
    test::expect_one_line_error(r, "not OpenBLAS");
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["blas"]["core"], "Prescott");
  EXPECT_NE(j["blas"]["choice"].get<std::string>().find("user override"), std::string::npos);
}

TEST(Cli, AutoIgnoresSlowEnvironmentCore) {
  // `--blas-core auto` replaces a slower OPENBLAS_CORETYPE from the environment by the CPU's best.
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  auto r = run_cemfrac({"--blas-core", "auto", "info", "--json", "--sgemm-size", "64"});
  unsetenv("OPENBLAS_CORETYPE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  if (!test::blas_is_openblas()) {  // auto is accepted; there is no core to set
    EXPECT_EQ(j["blas"]["core"], "");
    return;
  }
  EXPECT_EQ(j["blas"]["core"], j["blas"]["best_core_for_cpu"]);
}

}  // namespace
}  // namespace cemfrac

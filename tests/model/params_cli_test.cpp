// cemfrac params: exact counts of the published shapes, the table adds up, --set applies, errors
// are one line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

nlohmann::json params_json(const std::string& preset, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"params", "--config",
                                   test::source_path("configs/" + preset + ".toml"), "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  const test::RunResult r = run_cemfrac(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

void expect_consistent(const nlohmann::json& j) {
  int64_t sum = 0;
  for (const auto& t : j["tensors"]) {
    int64_t numel = 1;
    for (int64_t d : t["shape"]) numel *= d;
    EXPECT_EQ(numel, t["numel"].get<int64_t>()) << t["name"];
    sum += numel;
  }
  int64_t by_kind = 0;
  for (const auto& item : j["by_kind"].items()) by_kind += item.value().get<int64_t>();
  EXPECT_EQ(sum, j["total"].get<int64_t>());
  EXPECT_EQ(by_kind, j["total"].get<int64_t>());
  EXPECT_EQ(j["non_embedding"].get<int64_t>(),
            j["total"].get<int64_t>() - j["by_kind"]["embedding"].get<int64_t>());
}

TEST(ParamsCli, Gpt2SmallIs124439808) {
  const nlohmann::json j = params_json("gpt2-124m");
  EXPECT_EQ(j["total"].get<int64_t>(), 124439808);
  EXPECT_EQ(j["tied"], "head.weight = wte.weight");
  expect_consistent(j);
}

TEST(ParamsCli, Llama162mIs162220800) {
  const nlohmann::json j = params_json("llama-162m");
  EXPECT_EQ(j["total"].get<int64_t>(), 162220800);
  EXPECT_EQ(j["by_kind"]["head"].get<int64_t>(), 50304 * 768);
  expect_consistent(j);
}

// CEM (CEM spec §4.2): tied attention 2D^2 and tied MLP 2DM per layer instead of 4D^2 and 3DM.
TEST(ParamsCli, CemBoth162mIs129190656) {
  const nlohmann::json j = params_json("cem-both-162m");
  EXPECT_EQ(j["total"].get<int64_t>(), 129190656);
  expect_consistent(j);
  EXPECT_EQ(params_json("cem-attn-only-162m")["total"].get<int64_t>(), 148065024);
  EXPECT_EQ(params_json("cem-mlp-only-162m")["total"].get<int64_t>(), 143346432);
  // T changes no parameter: --set model.cem.steps=4 keeps the count.
  EXPECT_EQ(params_json("cem-both-162m", {"--set", "model.cem.steps=4"})["total"].get<int64_t>(),
            129190656);
}

TEST(ParamsCli, TextTableAndOverrides) {
  const test::RunResult r =
      run_cemfrac({"params", "--config", test::source_path("configs/gpt2-124m.toml")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("124,439,808"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blocks.11.mlp.w_proj"), std::string::npos);
  // One layer fewer: 7,087,872 parameters fewer.
  const nlohmann::json j = params_json("gpt2-124m", {"--set", "model.n_layers=11"});
  EXPECT_EQ(j["total"].get<int64_t>(), 124439808 - 7087872);
}

TEST(ParamsCli, ErrorsAreOneLine) {
  const test::RunResult r =
      run_cemfrac({"params", "--config", test::source_path("configs/gpt2-124m.toml"), "--set",
                   "model.n_heads=7"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("cemfrac: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("model.n_heads = 7"), std::string::npos) << r.err;
  const test::RunResult missing = run_cemfrac({"params", "--config", "/nonexistent.toml"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent.toml"), std::string::npos) << missing.err;
}

// Absurd sizes are one error before anything is built (the old code allocated
// over 5 GB of module objects for n_layers = 100000000), and counting a large config allocates no
// tensor memory: a CAttnU model of context 16384 once built l^2/2 host indices (2.7 GB) even on the
// meta device. Run under a 1.5 GB data limit (RLIMIT_DATA covers malloc and anonymous mmap).
TEST(ParamsCli, AbsurdSizesAreRefusedAndLargeOnesCostNoMemory) {
  const std::string config = test::source_path("configs/gpt2-124m.toml");
  for (const auto& [set, needle] : std::vector<std::pair<std::string, std::string>>{
           {"model.n_layers=100000000", "model.n_layers = 100000000: must be at most 4096"},
           {"model.d_model=2147483648", "model.d_model = 2147483648: must be at most 131072"},
           {"model.context=99999999", "model.context = 99999999: must be at most 1048576"},
           {"model.vocab_size=1000000000",
            "model.vocab_size = 1000000000: must be at most 16777216"}}) {
    const test::RunResult r = run_cemfrac({"params", "--config", config, "--set", set});
    test::expect_one_line_error(r, needle);
  }
  const std::string au = test::source_path("configs/tiny-cofrgenet-au.toml");
  const std::string command = "ulimit -d 1500000 && " + std::string(CEMFRAC_EXE) +
                              " params --json --config " + au +
                              " --set model.context=16384 > /dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace cemfrac

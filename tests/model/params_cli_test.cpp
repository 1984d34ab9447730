// cemfrac params: exact counts of the published shapes, the table adds up, --set applies, errors are
// one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

nlohmann::json params_json(const std::string& preset, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"params", "--config", test::source_path("configs/" + preset + ".toml"),
                                   "--json"};
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

// CEM (papers/cem.md §4.2): tied attention 2D^2 and tied MLP 2DM per layer instead of 4D^2 and 3DM.
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
  const test::RunResult r = run_cemfrac({"params", "--config",
                                         test::source_path("configs/gpt2-124m.toml"), "--set",
                                         "model.n_heads=7"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("cemfrac: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("model.n_heads = 7"), std::string::npos) << r.err;
  const test::RunResult missing = run_cemfrac({"params", "--config", "/nonexistent.toml"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent.toml"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace cemfrac

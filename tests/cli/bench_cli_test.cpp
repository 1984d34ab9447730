// `cemfrac bench train` and `cemfrac bench layers`: the reports' fields on tiny shapes (no timing
// claims: speed is not a unit test), and one-line errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cemfrac/layers/registry.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

TEST(BenchTrainCli, TinyLlamaJsonHasPositiveFields) {
  auto r = run_cemfrac({"--threads", "1", "bench", "train", "--config",
                        test::source_path("configs/tiny-llama.toml"), "--steps", "2", "--warmup",
                        "1", "--no-peer", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bench"], "train");
  EXPECT_EQ(j["threads"], 1);
  EXPECT_FALSE(j["blas_core"].get<std::string>().empty());
  for (const char* key :
       {"parameters", "matmul_parameters", "tokens_per_step", "flops_per_step", "flops_per_token"})
    EXPECT_GT(j[key].get<double>(), 0) << key;
  EXPECT_EQ(j["tokens_per_step"].get<int64_t>(), 8 * 64);  // tiny-llama: micro-batch 8, context 64
  for (const char* key : {"at_n_model", "at_2048", "peak"})
    EXPECT_GT(j["sgemm_gflops"][key].get<double>(), 0) << key;
  const auto& cpp = j["cpp"];
  for (const char* key : {"median_s", "min_s", "tokens_per_s", "achieved_gflops", "mfu"})
    EXPECT_GT(cpp[key].get<double>(), 0) << key;
  EXPECT_EQ(cpp["step_s"].size(), 2u);
  EXPECT_LE(cpp["min_s"].get<double>(), cpp["median_s"].get<double>());
  EXPECT_FALSE(j.contains("peer"));
  EXPECT_TRUE(std::isfinite(cpp["last_loss"].get<double>()));
}

// --profile: one more step under the autograd profiler. Its table must name what a step is made
// of: the layer scopes cemfrac records (block.cpp), ATen ops and autograd nodes; self times are
// disjoint parts of the profiled step, so they sum to at most its wall time.
TEST(BenchTrainCli, ProfileNamesLayerScopesOpsAndBackwardNodes) {
  auto r = run_cemfrac({"--threads", "1", "bench", "train", "--config",
                        test::source_path("configs/tiny-cem-both.toml"), "--steps", "1",
                        "--warmup", "0", "--no-peer", "--json", "--profile", "--profile-top",
                        "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& p = j["cpp"]["profile"];
  const double wall = p["wall_ms"].get<double>();
  EXPECT_GT(wall, 0);
  std::set<std::string> names;
  double self_sum = 0;
  for (const auto& op : p["ops"]) {
    names.insert(op["name"].get<std::string>());
    EXPECT_GE(op["calls"].get<int64_t>(), 1);
    EXPECT_GE(op["self_ms"].get<double>(), 0) << op.dump();
    EXPECT_GE(op["total_ms"].get<double>() + 1e-9, op["self_ms"].get<double>()) << op.dump();
    self_sum += op["self_ms"].get<double>();
  }
  EXPECT_NEAR(self_sum, p["attributed_ms"].get<double>(), 1e-6 * wall + 1e-9);
  EXPECT_LE(self_sum, wall * (1 + 1e-9));
  EXPECT_TRUE(names.count("cemfrac::mixer.cem_attention")) << p.dump();
  EXPECT_TRUE(names.count("cemfrac::ffn.cem_mlp")) << p.dump();
  EXPECT_TRUE(names.count("cemfrac::step (outside any op)")) << p.dump();
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.rfind("aten::", 0) == 0;
  })) << p.dump();
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.find("Backward") != std::string::npos;
  })) << p.dump();
}

TEST(BenchTrainCli, ProfileWithNprocIsOneLineError) {
  auto r = run_cemfrac({"bench", "train", "--config", test::source_path("configs/tiny-llama.toml"),
                        "--nproc", "2", "--profile"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("--profile"), std::string::npos) << r.err;
}

TEST(BenchTrainCli, BadConfigPathIsOneLineError) {
  auto r = run_cemfrac({"bench", "train", "--config", "no/such/config.toml", "--no-peer"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_EQ(r.err.rfind("cemfrac: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("no/such/config.toml"), std::string::npos) << r.err;
}

TEST(BenchLayersCli, TinyJsonHasEveryKindAndTheBaselines) {
  auto r = run_cemfrac({"--threads", "1", "bench", "layers", "--width", "32", "--context", "16",
                        "--batch", "1", "--reps", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bench"], "layers");
  EXPECT_EQ(j["width"], 32);
  std::set<std::string> kinds;
  for (const auto& row : j["rows"]) {
    const std::string kind = row["kind"];
    kinds.insert(kind);
    EXPECT_GT(row["parameters"].get<int64_t>(), 0) << kind;
    EXPECT_GT(row["forward_ms"]["best"].get<double>(), 0) << kind;
    EXPECT_LE(row["forward_ms"]["best"].get<double>(), row["forward_ms"]["median"].get<double>())
        << kind;
    EXPECT_GT(row["forward_backward_us_per_token"].get<double>(), 0) << kind;
    EXPECT_GT(row["forward_flops_per_token"].get<double>(), 0) << kind;
    EXPECT_GT(row["mfu"].get<double>(), 0) << kind;
    // Every round's time, in round order (so per-round ratios between rows can be taken); the best
    // is their minimum.
    const auto rounds = row["forward_backward_rounds_ms"].get<std::vector<double>>();
    ASSERT_EQ(rounds.size(), 2u) << kind;
    EXPECT_DOUBLE_EQ(*std::min_element(rounds.begin(), rounds.end()),
                     row["forward_backward_ms"]["best"].get<double>())
        << kind;
    if (row["variant"] == "default" && (kind == "mha" || kind == "gelu_mlp")) {
      EXPECT_DOUBLE_EQ(row["ratio_vs_baseline"].get<double>(), 1.0) << kind;
    }
  }
  for (const std::string& k : mixer_kind_names()) EXPECT_TRUE(kinds.count(k)) << k;
  for (const std::string& k : ffn_kind_names()) EXPECT_TRUE(kinds.count(k)) << k;
}

TEST(BenchLayersCli, UnknownKindIsOneLineError) {
  auto r =
      run_cemfrac({"bench", "layers", "--kinds", "mha,nope", "--width", "32", "--context", "8"});
  test::expect_one_line_error(r, "'nope' is not a mixer or FFN kind");
}

}  // namespace
}  // namespace cemfrac

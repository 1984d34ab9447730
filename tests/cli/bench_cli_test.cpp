// `cemfrac bench train`, `cemfrac bench layers` and `cemfrac bench generate`: the reports' fields
// on tiny shapes (no timing claims: speed is not a unit test), and one-line errors for bad input.
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
  EXPECT_EQ(j["blas_core"].get<std::string>().empty(), !test::blas_is_openblas());
  for (const char* key :
       {"parameters", "matmul_parameters", "tokens_per_step", "flops_per_step", "flops_per_token"})
    EXPECT_GT(j[key].get<double>(), 0) << key;
  EXPECT_EQ(j["tokens_per_step"].get<int64_t>(), 8 * 64);  // tiny-llama: micro-batch 8, context 64
  for (const char* key : {"at_n_model", "at_large", "peak"})
    EXPECT_GT(j["sgemm_gflops"][key].get<double>(), 0) << key;
  EXPECT_EQ(j["sgemm_gflops"]["n_large"].get<int64_t>(), 2048);  // on the CPU
  EXPECT_EQ(j["device"], "cpu");
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
                        test::source_path("configs/tiny-cem-both.toml"), "--steps", "1", "--warmup",
                        "0", "--no-peer", "--json", "--profile", "--profile-top", "1000"});
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

// MFU is taken against the matmul of the step's own precision measured in the same run, and named:
// the bf16 step against a bf16 matmul (the fp32 sgemm would let it pass 100%), the fp32 step
// against the fp32 one; --peak-tflops adds the MFU against a stated peak beside them.
TEST(BenchTrainCli, EachPrecisionsMfuUsesItsOwnMatmulAndSaysSo) {
  auto r = run_cemfrac({"--threads", "1", "bench", "train", "--config",
                        test::source_path("configs/tiny-llama.toml"), "--steps", "2", "--warmup",
                        "0", "--no-peer", "--json", "--precision", "bf16", "--peak-tflops", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["stated_peak_tflops"].get<double>(), 2.0);
  struct Side {
    const char* key;
    const char* rates;
    const char* peak_name;
  };
  for (const Side& side :
       {Side{"cpp", "sgemm_gflops", "float32 matmul on cpu measured in this run"},
        Side{"cpp_bf16", "bf16_matmul_gflops", "bfloat16 matmul on cpu measured in this run"}}) {
    SCOPED_TRACE(side.key);
    const auto& s = j[side.key];
    const double peak = j[side.rates]["peak"].get<double>();
    EXPECT_GT(peak, 0);
    EXPECT_EQ(s["mfu_peak"], side.peak_name);
    EXPECT_DOUBLE_EQ(s["mfu_peak_gflops"].get<double>(), peak);
    const double achieved = s["achieved_gflops"].get<double>();
    EXPECT_NEAR(s["mfu"].get<double>(), achieved / peak, 1e-12 * achieved / peak);
    EXPECT_NEAR(s["mfu_vs_stated_peak"].get<double>(), achieved / 2000.0, 1e-12 * achieved);
  }
  EXPECT_EQ(j["bf16_matmul_gflops"]["n_large"].get<int64_t>(), 2048);
  EXPECT_TRUE(j.contains("targets"));  // the CPU's targets, on the CPU
}

// A benchmark honours --device or refuses it in one line; the meta device computes nothing to
// time, so every bench area refuses it (it used to time the CPU and exit 0).
TEST(BenchCli, MetaDeviceIsRefusedByEveryTimedArea) {
  const std::string config = test::source_path("configs/tiny-llama.toml");
  test::expect_one_line_error(
      run_cemfrac({"--device", "meta", "bench", "train", "--config", config, "--no-peer"}),
      "bench train: the meta device computes nothing to time");
  test::expect_one_line_error(run_cemfrac({"bench", "train", "--config", config, "--no-peer",
                                           "--set", "train.device=meta"}),
                              "bench train: the meta device computes nothing to time");
  test::expect_one_line_error(run_cemfrac({"--device", "meta", "bench", "ladder", "--no-peer",
                                           "--ladders", "64", "--width", "8", "--depths", "2"}),
                              "bench ladder: the meta device computes nothing to time");
  test::expect_one_line_error(
      run_cemfrac({"--device", "meta", "bench", "layers", "--width", "32", "--context", "8"}),
      "bench layers: the meta device computes nothing to time");
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

// bench generate on a tiny model: one row per mixer kind (--kinds all), two batch sizes; the
// fields are there and consistent; the cache bytes are those of the shapes (MHA: K and V for the
// whole context; CEM: K only, half) and count inside the measured peak; every batch gives prompt 0
// the same greedy tokens.
TEST(BenchGenerateCli, TinyEveryKindJson) {
  auto r = run_cemfrac({"--threads",    "1",
                        "bench",        "generate",
                        "--config",     test::source_path("configs/tiny-llama.toml"),
                        "--set",        "model.n_kv_heads=4",
                        "--kinds",      "all",
                        "--batches",    "1,3",
                        "--prompt-len", "8",
                        "--new-tokens", "5",
                        "--reps",       "2",
                        "--no-peer",    "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bench"], "generate");
  EXPECT_EQ(j["prompt_len"], 8);
  EXPECT_EQ(j["new_tokens"], 5);
  std::set<std::string> mixers;
  // tiny-llama: 2 layers, 4 heads of 16, context 64, float32.
  const int64_t kv_per_row = 2 * 2 * 4 * 64 * 16 * 4;
  EXPECT_GT(j["copy_gbs"].get<double>(), 0);
  for (const auto& row : j["rows"]) {
    const std::string label = row["label"];
    if (row["mixer"] == "mha") {  // every weight but the embedding (512 x 64, untied) per step
      EXPECT_EQ(row["weight_bytes_per_step"].get<int64_t>(),
                (row["parameters"].get<int64_t>() - 512 * 64) * 4);
    }
    mixers.insert(row["mixer"].get<std::string>());
    EXPECT_TRUE(row["row0_tokens_equal_across_batches"].get<bool>()) << label;
    ASSERT_EQ(row["batches"].size(), 2u) << label;
    for (const auto& b : row["batches"]) {
      const int64_t B = b["batch"];
      EXPECT_EQ(b["prefill_s"].size(), 2u) << label;
      EXPECT_EQ(b["decode_steps"].get<int64_t>(), 4) << label;  // new tokens - 1
      for (const char* key :
           {"prefill_median_s", "decode_median_s", "prefill_tokens_per_s", "decode_tokens_per_s"})
        EXPECT_GT(b[key].get<double>(), 0) << label << " " << key;
      EXPECT_NEAR(b["prefill_tokens_per_s"].get<double>() * b["prefill_median_s"].get<double>(),
                  B * 8.0, 1e-6)
          << label;
      const int64_t cache = b["cache_bytes"];
      EXPECT_GT(cache, 0) << label;
      EXPECT_GE(b["peak_tensor_bytes"].get<int64_t>(), cache) << label;
      EXPECT_NEAR(
          b["decode_bandwidth_limit_tokens_per_s"].get<double>(),
          B * j["copy_gbs"].get<double>() * 1e9 / row["weight_bytes_per_step"].get<double>(),
          1e-6 * b["decode_bandwidth_limit_tokens_per_s"].get<double>())
          << label;
      ASSERT_EQ(b["tokens"].size(), size_t(B)) << label;
      for (const auto& t : b["tokens"]) EXPECT_EQ(t.size(), 5u) << label;
      if (row["mixer"] == "mha") {
        EXPECT_EQ(cache, B * kv_per_row) << label;
      }
      if (row["mixer"] == "cem_attention") {
        EXPECT_EQ(2 * cache, B * kv_per_row) << label;
        EXPECT_DOUBLE_EQ(b["cache_bytes_vs_mha"].get<double>(), 0.5) << label;
      }
    }
  }
  for (const std::string& k : mixer_kind_names()) EXPECT_TRUE(mixers.count(k)) << k;
  EXPECT_EQ(j["rows"].size(), mixer_kind_names().size() + 1);  // + cem_attention at T = 2
  EXPECT_TRUE(j["targets"]["met"].is_null());                  // no peer, no ratio
}

TEST(BenchGenerateCli, BadRequestsAreOneLineErrors) {
  const std::string tiny = test::source_path("configs/tiny-llama.toml");
  test::expect_one_line_error(
      run_cemfrac({"bench", "generate", "--config", tiny, "--prompt-len", "60", "--new-tokens",
                   "10", "--no-peer"}),
      "--prompt-len 60 + --new-tokens 10 needs 69 positions; the model's context is 64");
  test::expect_one_line_error(
      run_cemfrac({"bench", "generate", "--config", tiny, "--kinds", "mha,nope", "--no-peer"}),
      "--kinds: 'nope' is not a mixer kind");
  // A row's config that cannot be built is refused before any row is timed (tiny-llama has
  // grouped-query heads, which cem_attention has no form of).
  const auto gqa = run_cemfrac(
      {"bench", "generate", "--config", tiny, "--kinds", "mha,cem_attention", "--no-peer"});
  test::expect_one_line_error(gqa, "cem_attention (layer 0) has no grouped-query form");
  EXPECT_EQ(gqa.out, "");
  test::expect_one_line_error(run_cemfrac({"bench", "generate", "--no-peer"}),
                              "exactly one of --config FILE and --checkpoint DIR");
  test::expect_one_line_error(
      run_cemfrac({"bench", "generate", "--config", tiny, "--batches", "1,0", "--no-peer"}),
      "--batches: '0' is not a batch size (in 1..4096; e.g. --batches 1,8)");
  test::expect_one_line_error(
      run_cemfrac({"bench", "generate", "--config", tiny, "--batches", ",", "--no-peer"}),
      "--batches needs at least one value");
}

// bench ladder and bench generate read their integer lists with one parser (cli/bench_util.h).
TEST(BenchLadderCli, BadDepthIsOneLineError) {
  test::expect_one_line_error(run_cemfrac({"bench", "ladder", "--depths", "2,x", "--no-peer"}),
                              "--depths: 'x' is not a ladder depth (an integer >= 1; e.g. --depths");
}

}  // namespace
}  // namespace cemfrac

// `cemfrac bench train --peer`: the PyTorch peer (bench/peers/train_step_peer.py) starts from
// cemfrac's initial weights and batch, so both sides' step-0 losses and gradient norms agree to
// float32 rounding, for every layer kind the peer writes, and with --check-float64 to
// 1e-9 in float64; `cemfrac bench generate --peer`: the decode peer (bench/peers/decode_peer.py)
// gives cemfrac's logits and greedy tokens. Tiny configs, no timing claims. Skipped when
// /usr/bin/python3 cannot import torch (Debian: python3-torch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

bool python_has_torch() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

struct PeerCase {
  const char* name;
  const char* config;
  std::vector<std::string> sets;
};

class BenchPeerLoss : public ::testing::TestWithParam<PeerCase> {};

TEST_P(BenchPeerLoss, StepZeroLossesAgree) {
  if (!python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian: python3-torch)";
  const PeerCase& c = GetParam();
  std::vector<std::string> args{"--threads",
                                "1",
                                "bench",
                                "train",
                                "--config",
                                test::source_path(c.config),
                                "--steps",
                                "1",
                                "--warmup",
                                "0",
                                "--peer",
                                "--peer-script",
                                test::source_path("bench/peers/train_step_peer.py"),
                                "--json"};
  for (const std::string& s : c.sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  auto r = run_cemfrac(args);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("peer_loss_check")) << r.out;
  const auto& check = j["peer_loss_check"];
  const double a = check["cpp_step0_loss"].get<double>(),
               b = check["peer_step0_loss"].get<double>();
  EXPECT_TRUE(check["agree"].get<bool>()) << "cemfrac " << a << ", peer " << b;
  EXPECT_DOUBLE_EQ(a, j["cpp"]["first_loss"].get<double>());
  EXPECT_DOUBLE_EQ(b, j["peer"]["first_loss"].get<double>());
  EXPECT_LE(std::abs(a - b), check["tolerance"].get<double>());
  EXPECT_LE(check["tolerance"].get<double>(), 1e-4);  // 1e-5 relative of a loss ~ ln 512
  const double ga = check["cpp_step0_grad_norm"].get<double>(),
               gb = check["peer_step0_grad_norm"].get<double>();
  EXPECT_GT(ga, 0);
  EXPECT_LE(std::abs(ga - gb), check["grad_norm_tolerance"].get<double>())
      << "cemfrac " << ga << ", peer " << gb;
  EXPECT_LE(check["grad_norm_tolerance"].get<double>(), 1e-4 * ga * (1 + 1e-12));
  EXPECT_TRUE(j.contains("ratio_median"));
  // Same batch and weights: a loss near ln V (random ids, small init), finite on both sides.
  EXPECT_NEAR(a, std::log(512.0), 0.5);
  std::printf(
      "[ %s ] step 0: loss cemfrac %.9g peer %.9g |diff| %.3g; grad norm cemfrac %.9g peer %.9g "
      "|diff| %.3g\n",
      c.name, a, b, std::abs(a - b), ga, gb, std::abs(ga - gb));
}

INSTANTIATE_TEST_SUITE_P(
    TinyPresets, BenchPeerLoss,
    ::testing::Values(PeerCase{"llama", "configs/tiny-llama.toml", {}},
                      PeerCase{"gpt2", "configs/tiny-gpt2.toml", {}},
                      PeerCase{"cem_both", "configs/tiny-cem-both.toml", {}},
                      // T = 2, D+LR per head, the preconditioner (the cem-full preset's options).
                      PeerCase{"cem_full", "configs/tiny-cem-full.toml", {}},
                      // T = 2 without D+LR takes cemfrac's gram recursion (another op order, same
                      // function), and the shared diagonal with a learnable eta.
                      PeerCase{"cem_t2_gram", "configs/tiny-cem-both.toml", {"model.cem.steps=2"}},
                      PeerCase{"cem_shared_dlr",
                               "configs/tiny-cem-both.toml",
                               {"model.cem.steps=2", "model.cem.dlr=shared",
                                "model.cem.freeze_eta=false"}},
                      PeerCase{"cofrgenet_f", "configs/tiny-cofrgenet-f.toml", {}},
                      PeerCase{"cofrgenet", "configs/tiny-cofrgenet.toml", {}}),
    [](const ::testing::TestParamInfo<PeerCase>& info) { return std::string(info.param.name); });

TEST(BenchPeer, UnwrittenOptionIsRefused) {
  if (!python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian: python3-torch)";
  auto r =
      run_cemfrac({"--threads", "1", "bench", "train", "--config",
                   test::source_path("configs/tiny-cem-both.toml"), "--steps", "1", "--warmup", "0",
                   "--peer", "--peer-script", test::source_path("bench/peers/train_step_peer.py"),
                   "--set", "model.cem.prox=fixed", "--json"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_NE(r.err.find("this peer does not model cem.prox"), std::string::npos) << r.err;
}

// bench train --check-float64: step 0 of both sides with the weights cast to float64. Every kind
// the peer writes agrees to 1e-9 relative (float32 rounding would leave ~1e-7; a float32 side
// anywhere fails the check), and a peer that differs by far less than the float32 tolerances is
// caught.
class BenchPeerFloat64 : public ::testing::TestWithParam<PeerCase> {};

nlohmann::json run_float64_check(const PeerCase& c, const std::string& peer_script, int* exit_code,
                                 std::string* err) {
  std::vector<std::string> args{"--threads",       "1",
                                "bench",           "train",
                                "--config",        test::source_path(c.config),
                                "--check-float64", "--peer-script",
                                peer_script,       "--json"};
  for (const std::string& s : c.sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  auto r = run_cemfrac(args);
  *exit_code = r.exit_code;
  *err = r.err;
  return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

TEST_P(BenchPeerFloat64, SameModelInFloat64) {
  if (!python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian: python3-torch)";
  const PeerCase& c = GetParam();
  int code = -1;
  std::string err;
  const auto j =
      run_float64_check(c, test::source_path("bench/peers/train_step_peer.py"), &code, &err);
  ASSERT_EQ(code, 0) << err << j.dump();
  ASSERT_TRUE(j.is_object()) << err;
  EXPECT_EQ(j["check"], "float64");
  EXPECT_TRUE(j["agree"].get<bool>());
  EXPECT_DOUBLE_EQ(j["tolerance_rel"].get<double>(), 1e-9);
  EXPECT_LE(j["loss_rel_diff"].get<double>(), 1e-9);
  EXPECT_LE(j["grad_norm_rel_diff"].get<double>(), 1e-9);
  EXPECT_GT(j["cpp_step0_grad_norm"].get<double>(), 0);
  EXPECT_NEAR(j["cpp_step0_loss"].get<double>(), std::log(512.0), 0.5);
  // float32 from the same weights: each side's rounding error against the float64 value fits the
  // timed check's tolerances at these shapes (their premise), and is far above float64's gap.
  const auto& f32 = j["float32"];
  for (const char* side : {"cpp", "peer"}) {
    EXPECT_LE(f32[std::string(side) + "_loss_err"].get<double>(), 1e-5) << side;
    EXPECT_LE(f32[std::string(side) + "_grad_norm_err"].get<double>(), 1e-4) << side;
  }
  EXPECT_NEAR(f32["cpp_loss"].get<double>(), j["cpp_step0_loss"].get<double>(), 1e-4);
  std::printf(
      "[ %s ] step 0 relative: float64 peer vs cemfrac loss %.3g, gradient norm %.3g; float32 vs "
      "float64 gradient norm cemfrac %.3g, peer %.3g\n",
      c.name, j["loss_rel_diff"].get<double>(), j["grad_norm_rel_diff"].get<double>(),
      f32["cpp_grad_norm_err"].get<double>(), f32["peer_grad_norm_err"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(
    TinyPresets, BenchPeerFloat64,
    ::testing::Values(PeerCase{"llama", "configs/tiny-llama.toml", {}},
                      PeerCase{"gpt2", "configs/tiny-gpt2.toml", {}},
                      PeerCase{"cem_full", "configs/tiny-cem-full.toml", {}},
                      PeerCase{"cem_shared_dlr",
                               "configs/tiny-cem-both.toml",
                               {"model.cem.steps=2", "model.cem.dlr=shared",
                                "model.cem.freeze_eta=false"}},
                      PeerCase{"cofrgenet", "configs/tiny-cofrgenet.toml", {}}),
    [](const ::testing::TestParamInfo<PeerCase>& info) { return std::string(info.param.name); });

// A peer whose loss is scaled by 1 + 1e-7: its step-0 loss and gradient norm move by 1e-7 relative,
// inside the float32 check's 1e-5 and 1e-4, but 100x outside the float64 check's 1e-9.
TEST(BenchPeerFloat64Check, CatchesADifferenceFloat32CannotSee) {
  if (!python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian: python3-torch)";
  const std::string dir = test::temp_dir("peer64");
  const std::string wrapper = dir + "/scaled_peer.py";
  const std::string peer = test::source_path("bench/peers/train_step_peer.py");
  test::write_file(wrapper,
                   "import runpy, sys\n"
                   "import torch.nn.functional as F\n"
                   "_ce = F.cross_entropy\n"
                   "F.cross_entropy = lambda *a, **k: _ce(*a, **k) * (1 + 1e-7)\n"
                   "sys.argv[0] = '" +
                       peer +
                       "'\n"
                       "runpy.run_path('" +
                       peer + "', run_name='__main__')\n");
  int code = -1;
  std::string err;
  const auto j =
      run_float64_check(PeerCase{"gpt2", "configs/tiny-gpt2.toml", {}}, wrapper, &code, &err);
  EXPECT_EQ(code, 1) << err;
  ASSERT_TRUE(j.is_object()) << err;
  EXPECT_FALSE(j["agree"].get<bool>());
  const double rel = j["loss_rel_diff"].get<double>();
  EXPECT_NEAR(rel, 1e-7, 1e-9);  // the scale, and nothing else
  EXPECT_NEAR(j["grad_norm_rel_diff"].get<double>(), 1e-7, 1e-9);
  EXPECT_NE(err.find("float64 check failed"), std::string::npos) << err;
  EXPECT_NE(err.find("the models differ"), std::string::npos) << err;
}

TEST(BenchPeerFloat64Check, RefusedWithoutThePeerOrBesideNprocOrProfile) {
  auto r = run_cemfrac({"bench", "train", "--config", test::source_path("configs/tiny-gpt2.toml"),
                        "--check-float64", "--no-peer"});
  test::expect_one_line_error(r, "--check-float64 compares with the PyTorch peer");
  r = run_cemfrac({"bench", "train", "--config", test::source_path("configs/tiny-gpt2.toml"),
                   "--check-float64", "--nproc", "2"});
  test::expect_one_line_error(r, "it does not combine with --nproc");
  r = run_cemfrac({"bench", "train", "--config", test::source_path("configs/tiny-gpt2.toml"),
                   "--check-float64", "--profile"});
  test::expect_one_line_error(r, "it does not combine with --profile");
}

// bench generate --peer: the decode peer (bench/peers/decode_peer.py) from cemfrac's weights and
// prompts computes the same logits (the check that gates every ratio) and, on these tiny models,
// the same greedy tokens; its KV cache has cemfrac's bytes.
class BenchGeneratePeer : public ::testing::TestWithParam<const char*> {};

TEST_P(BenchGeneratePeer, LogitsAndTokensAgree) {
  if (!python_has_torch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (Debian: python3-torch)";
  auto r =
      run_cemfrac({"--threads", "1", "bench", "generate", "--config",
                   test::source_path(std::string("configs/") + GetParam() + ".toml"), "--batches",
                   "1,3", "--prompt-len", "8", "--new-tokens", "6", "--reps", "1", "--peer",
                   "--peer-script", test::source_path("bench/peers/decode_peer.py"), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  const auto& row = j["rows"][0];
  ASSERT_TRUE(row.contains("peer_check")) << row.dump();
  EXPECT_TRUE(row["peer_check"]["agree"].get<bool>()) << row["peer_check"].dump();
  EXPECT_GT(row["peer_check"]["max_abs_logit"].get<double>(), 0);
  for (const auto& b : row["batches"]) {
    ASSERT_TRUE(b.contains("peer")) << b.dump();
    EXPECT_EQ(b["peer_tokens_rows_equal"].get<int64_t>(), b["batch"].get<int64_t>()) << b.dump();
    EXPECT_EQ(b["peer"]["cache_bytes"].get<int64_t>(), b["cache_bytes"].get<int64_t>());
    EXPECT_GT(b["decode_ratio_vs_peer"].get<double>(), 0);
  }
  EXPECT_FALSE(j["targets"]["met"].is_null());
  std::printf("[ %s ] decode peer: max |logit diff| %.3g of max |logit| %.3g\n", GetParam(),
              row["peer_check"]["max_abs_logit_diff"].get<double>(),
              row["peer_check"]["max_abs_logit"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, BenchGeneratePeer,
                         ::testing::Values("tiny-llama", "tiny-gpt2"));

TEST(BenchGeneratePeer, UnmodelledKindIsRefusedWithPeer) {
  auto r = run_cemfrac({"--threads", "1", "bench", "generate", "--config",
                        test::source_path("configs/tiny-cem-both.toml"), "--prompt-len", "4",
                        "--new-tokens", "2", "--reps", "1", "--peer", "--json"});
  if (!python_has_torch()) {
    EXPECT_NE(r.exit_code, 0);
    return;
  }
  test::expect_one_line_error(
      r,
      "--peer: the decode peer models none of the rows (it writes mha with swiglu or gelu_mlp "
      "only): cem_attention: layer 0 mixer 'cem_attention'");
}

}  // namespace
}  // namespace cemfrac

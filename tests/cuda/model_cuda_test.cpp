// Whole models on a CUDA device against the same models on the CPU (label `cuda`): every tiny
// preset (every mixer and FFN kind the presets use) forward and backward, cached decoding against
// the full forward, and a short training run through the CLI. Skipped, with the reason, in a build
// without CUDA kernels or on a machine without a CUDA device (every CI machine:
// scripts/gpu_check.sh runs them on a GPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/run_config.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac::test {
namespace {

namespace fs = std::filesystem;

// float32's unit roundoff, 2^-24.
const double kU = std::ldexp(1.0, -24);

std::vector<std::string> tiny_presets() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(source_path("configs"))) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tiny-", 0) == 0 && e.path().extension() == ".toml")
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `to` takes `from`'s parameter values (same config, any device and dtype).
void copy_parameters(LmModel& from, LmModel& to) {
  torch::NoGradGuard no_grad;
  auto dst = to->named_parameters();
  for (const auto& p : from->named_parameters()) dst[p.key()].copy_(p.value());
}

struct Pass {
  torch::Tensor logits;                       // on the CPU, float64
  std::map<std::string, torch::Tensor> grad;  // likewise
};

Pass forward_backward(LmModel& model, const torch::Tensor& tokens) {
  const torch::Device device = model->parameters().front().device();
  const torch::Tensor x = tokens.to(device);
  const torch::Tensor logits = model->forward(x.narrow(1, 0, x.size(1) - 1));
  const torch::Tensor loss =
      torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat64),
                                x.narrow(1, 1, x.size(1) - 1).reshape({-1}));
  loss.backward();
  Pass out;
  out.logits = logits.detach().to(torch::kCPU, torch::kFloat64);
  for (const auto& p : model->named_parameters()) {
    if (p.value().grad().defined())
      out.grad[p.key()] = p.value().grad().to(torch::kCPU, torch::kFloat64);
  }
  return out;
}

// The CUDA model computes the same float32 function as the CPU model in another order of operations
// (cuBLAS's and our kernels' reductions, no TF32: LibTorch's default for float32 matmuls). Against
// the float64 reference, each side's error is then rounding of the same size: the bound is 8 times
// the CPU's own error at that shape, plus 64 u for outputs the CPU happens to get almost exact. A
// wrong kernel, a missed mask or a lost term is wrong by O(1) relative and fails it.
TEST(ModelCuda, EveryTinyPresetForwardAndBackwardMatchTheCpu) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> presets = tiny_presets();
  ASSERT_GE(presets.size(), 10u);
  for (const std::string& path : presets) {
    SCOPED_TRACE(path);
    const ModelConfig c = load_run_config(path).model;
    torch::manual_seed(3);
    LmModel cpu(c);
    {
      torch::NoGradGuard no_grad;  // move zero-initialised tensors off zero, as trained weights are
      for (auto& p : cpu->parameters()) p.add_(torch::randn_like(p) * 0.05);
    }
    LmModel ref(c);
    copy_parameters(cpu, ref);
    ref->to(torch::kFloat64);
    LmModel gpu(c, torch::Device(torch::kCUDA));
    copy_parameters(cpu, gpu);
    const torch::Tensor tokens =
        torch::randint(c.vocab_size, {2, std::min<int64_t>(c.context, 32) + 1}, torch::kInt64);
    const Pass r = forward_backward(ref, tokens), a = forward_backward(cpu, tokens),
               g = forward_backward(gpu, tokens);
    const double e_cpu = rel_err(a.logits, r.logits), e_gpu = rel_err(g.logits, r.logits);
    EXPECT_LE(e_gpu, 8 * e_cpu + 64 * kU) << "logits: CPU error " << e_cpu;
    ASSERT_EQ(g.grad.size(), r.grad.size());
    for (const auto& [name, want] : r.grad) {
      const double ec = rel_err(a.grad.at(name), want), eg = rel_err(g.grad.at(name), want);
      EXPECT_LE(eg, 8 * ec + 64 * kU) << name << ": CPU error " << ec;
    }
  }
}

// Cached decoding on the device reproduces the device's full forward (the CPU's bound, float32).
TEST(ModelCuda, DecodingEqualsFullForward) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  for (const char* name :
       {"tiny-llama", "tiny-gpt2", "tiny-cem-both", "tiny-cem-full", "tiny-cofrgenet"}) {
    SCOPED_TRACE(name);
    ModelConfig c = load_run_config(source_path(std::string("configs/") + name + ".toml")).model;
    torch::manual_seed(5);
    LmModel model(c, torch::Device(torch::kCUDA));
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    const int64_t N = std::min<int64_t>(c.context, 12);
    const torch::Tensor tokens = torch::randint(c.vocab_size, {2, N}, torch::kInt64).cuda();
    const torch::Tensor full = model->forward(tokens);
    DecodeState state = model->new_decode_state();
    std::vector<torch::Tensor> parts = {model->forward(tokens.narrow(1, 0, 3), &state)};
    for (int64_t n = 3; n < N; ++n) parts.push_back(model->forward(tokens.narrow(1, n, 1), &state));
    EXPECT_LT((torch::cat(parts, 1) - full).abs().max().item<double>(), 1e-5);
  }
}

// The GPU's generator state saved with a checkpoint restores its stream: the draws after the restore
// are the draws after the save (the trainer saves every visible GPU's, TrainerState::cuda_rng).
TEST(ModelCuda, CudaRngStateRoundTrip) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  torch::manual_seed(21);
  const std::vector<std::string> states = cuda_rng_states();
  ASSERT_EQ(states.size(), static_cast<size_t>(torch::cuda::device_count()));
  const torch::Tensor a = torch::randn({64}, torch::Device(torch::kCUDA)).cpu();
  (void)torch::randn({64}, torch::Device(torch::kCUDA));
  set_cuda_rng_states(states, "trainer.json");
  EXPECT_TRUE(torch::equal(torch::randn({64}, torch::Device(torch::kCUDA)).cpu(), a));
}

// A seed gives the same initial weights on the GPU as on the CPU (init draws from the CPU
// generator).
TEST(ModelCuda, ASeedGivesTheSameWeightsOnEveryDevice) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const ModelConfig c = load_run_config(source_path("configs/tiny-cem-full.toml")).model;
  torch::manual_seed(11);
  LmModel cpu(c);
  torch::manual_seed(11);
  LmModel gpu(c, torch::Device(torch::kCUDA));
  auto on_gpu = gpu->named_parameters();
  for (const auto& p : cpu->named_parameters())
    EXPECT_TRUE(torch::equal(on_gpu[p.key()].cpu(), p.value())) << p.key();
}

// `cemfrac --device cuda train` of a tiny model against the same run on the CPU: step 1's loss
// (the same function of the same weights and batch) to the peer check's float32 bound, 1e-5
// relative; step 20's, after 19 AdamW updates whose rounding differences grow with every step, to
// 2e-2 relative: the same training, not bit for bit.
TEST(TrainCuda, TwentyStepsTrackTheCpu) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string dir = temp_dir("train-cuda");
  const std::string src = dir + "/text";
  fs::create_directories(src);
  for (int d = 0; d < 12; ++d) {
    std::string text;
    for (int i = 0; text.size() < 2000; ++i)
      text += "document " + std::to_string(d) + " line " + std::to_string(i) + " says hello. ";
    write_file(src + "/doc" + std::to_string(d) + ".txt", text);
  }
  const RunResult prep = run_cemfrac({"prepare", "--text", src, "--tokenizer", "byte", "--out",
                                      dir + "/data", "--split", "80,10,10"});
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  const std::string config = dir + "/run.toml";
  write_file(config,
             "[model]\nvocab_size = 257\nd_model = 32\nn_layers = 2\nn_heads = 2\nd_ff = 64\n"
             "context = 32\n\n[data]\npath = \"" +
                 dir +
                 "/data\"\n\n[train]\nsteps = 20\n"
                 "micro_batch = 4\nwarmup_steps = 2\nlog_every = 1\neval_every = "
                 "0\ncheckpoint_every = 0\n");
  auto losses = [&](const std::string& device) {
    const std::string out = dir + "/run-" + device;
    const RunResult r = run_cemfrac(
        {"--threads", "1", "--device", device, "train", "--config", config, "--out", out});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<double> loss;
    std::ifstream f(out + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss") && j.contains("step")) loss.push_back(j["loss"].get<double>());
    }
    return loss;
  };
  const std::vector<double> cpu = losses("cpu"), gpu = losses("cuda");
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  EXPECT_NEAR(gpu.front(), cpu.front(), 1e-5 * cpu.front());
  EXPECT_NEAR(gpu.back(), cpu.back(), 2e-2 * cpu.back());
}

}  // namespace
}  // namespace cemfrac::test

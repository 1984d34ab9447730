// The device as data from the command line: --device and train.device are read and
// checked once (an unknown name, or cuda without CUDA, is one line before any work); on the meta
// device a command runs its shapes up to the first value it must read and then says so in one
// line; a checkpoint written on the CPU loads on another device; train.precision is validated and
// a bf16 run completes.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <string>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::expect_one_line_error;
using test::run_cemfrac;

const std::string& device_data_dir() {
  static const std::string dir = [] {
    const std::string src = test::temp_dir("device-cli-src");
    for (int d = 0; d < 12; ++d) {
      std::string text;
      for (int i = 0; text.size() < 300; ++i)
        text += "document " + std::to_string(d) + " says line " + std::to_string(i) + ". ";
      test::write_file(src + "/doc" + std::to_string(d) + ".txt", text);
    }
    const std::string out = test::temp_dir("device-cli-data") + "/data";
    const test::RunResult r = run_cemfrac(
        {"prepare", "--text", src, "--tokenizer", "byte", "--out", out, "--split", "80,10,10"});
    if (r.exit_code != 0) throw std::runtime_error("prepare failed: " + r.err);
    return out;
  }();
  return dir;
}

std::string device_config(const std::string& dir, const std::string& extra_train = "") {
  const std::string path = dir + "/run.toml";
  test::write_file(path,
                   "[model]\nvocab_size = 257\nd_model = 16\nn_layers = 1\nn_heads = 2\n"
                   "d_ff = 32\ncontext = 16\n\n[data]\npath = \"" +
                       device_data_dir() +
                       "\"\n\n[train]\nsteps = 3\nmicro_batch = 2\nwarmup_steps = 1\n"
                       "log_every = 1\neval_every = 0\neval_tokens = 64\nout = \"" +
                       dir + "/run\"\n" + extra_train);
  return path;
}

TEST(DeviceCli, UnknownDeviceIsOneLineBeforeAnyWork) {
  const std::string dir = test::temp_dir("device-cli-unknown");
  expect_one_line_error(
      run_cemfrac({"--threads", "1", "--device", "tpu", "train", "--config", device_config(dir)}),
      "--device 'tpu': unknown device; choices: cpu, cuda, cuda:N or meta");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
  expect_one_line_error(run_cemfrac({"--threads", "1", "--device", "cuda:x", "info"}),
                        "--device 'cuda:x': the GPU index must be a number");
  expect_one_line_error(run_cemfrac({"--threads", "1", "train", "--config", device_config(dir),
                                     "--set", "train.device=gpu"}),
                        "train.device = \"gpu\": must be cpu, cuda, cuda:N or meta");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
}

TEST(DeviceCli, CudaWithoutCudaIsOneLine) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has CUDA";
  const std::string dir = test::temp_dir("device-cli-cuda");
  expect_one_line_error(
      run_cemfrac({"--threads", "1", "--device", "cuda", "train", "--config", device_config(dir)}),
      "--device cuda: no CUDA here");
  expect_one_line_error(run_cemfrac({"--threads", "1", "train", "--config", device_config(dir),
                                     "--set", "train.device=cuda:1"}),
                        "train.device cuda:1: no CUDA here");
}

// A trainer step on meta runs the forward and backward (shapes only) and stops at the first value
// it must read, with one line saying so; a checkpoint written on the CPU loads on meta for eval and
// generate, which then stop at their first read the same way.
TEST(DeviceCli, MetaIsADryRunOfShapes) {
  const std::string dir = test::temp_dir("device-cli-meta");
  const std::string config = device_config(dir);
  expect_one_line_error(run_cemfrac({"--threads", "1", "--device", "meta", "train", "--config",
                                     config, "--out", dir + "/meta-run"}),
                        "--device meta is a dry run of shapes");
  // A dry run writes nothing: no run folder (it used to leave one, its summary.json holding the
  // dispatcher's backtrace).
  EXPECT_FALSE(std::filesystem::exists(dir + "/meta-run"));
  const test::RunResult trained = run_cemfrac({"--threads", "1", "train", "--config", config});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  expect_one_line_error(run_cemfrac({"--threads", "1", "--device", "meta", "eval", "--checkpoint",
                                     dir + "/run", "--text", config}),
                        "--device meta is a dry run of shapes");
  const test::RunResult generated =
      run_cemfrac({"--threads", "1", "--device", "meta", "generate", "--checkpoint", dir + "/run",
                   "--prompt", "doc", "--max-new-tokens", "2"});
  expect_one_line_error(generated, "--device meta is a dry run of shapes");
  EXPECT_EQ(generated.out, "") << "the prompt is not echoed before the dry run stops";
  // The same checkpoint on the CPU, named explicitly, evaluates.
  const test::RunResult cpu = run_cemfrac({"--threads", "1", "--device", "cpu", "eval",
                                           "--checkpoint", dir + "/run", "--text", config});
  EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
}

TEST(DeviceCli, PrecisionIsValidatedAndBf16Trains) {
  const std::string dir = test::temp_dir("device-cli-bf16");
  expect_one_line_error(run_cemfrac({"--threads", "1", "train", "--config", device_config(dir),
                                     "--set", "train.precision=fp16"}),
                        "train.precision = \"fp16\": must be fp32 or bf16");
  const test::RunResult r = run_cemfrac(
      {"--threads", "1", "train", "--config", device_config(dir, "precision = \"bf16\"\n")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("precision = \"bf16\""), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cemfrac

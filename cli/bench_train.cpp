// cemfrac bench train: the speed of one optimizer step of a run config's model.
//
//   cemfrac [--device D] bench train --config C [--set k=v]... [--steps N] [--warmup N] [--json]
//   [--peer | --no-peer] [--check-float64] [--precision fp32|bf16] [--peak-tflops X]
//
// The device is the global --device, else the config's train.device (cpu or cuda; the meta device
// computes nothing to time and is refused in one line). On CUDA the device is synchronised before
// every clock read, so each phase's time is that of its kernels.
//
// The step is the trainer's (cemfrac/train/trainer.cpp): zero_grad, forward, cross-entropy,
// backward, gradient clipping, AdamW (cemfrac::Optimizer: the run config's betas, eps and weight
// decay on the decay group). Its input is one batch of random token ids (seeded by train.seed) of
// shape (train.micro_batch, seq_len + 1), reused every step; `warmup` untimed steps come first,
// then `steps` timed ones, each timed whole (and split into forward, backward, clip + optimizer).
//
// Model FLOPs per step (docs/flops.md; the PaLM convention, attention counted as if not causal):
//   F = 3 B S (sum over layers of mixer + FFN forward FLOPs per token at context S + 2 V D)
// with B the micro-batch and S the sequence length; each mixer and FFN kind reports its own forward
// FLOPs per token (MixerImpl / FfnImpl::forward_flops_per_token), 2 V D is the head (counted even
// when tied to the embedding), and backward is counted as twice the forward. For mha +
// gelu_mlp/swiglu this is the older B S (6 P_mm + 12 L H d_h S). MFU = F / step time / the matmul
// rate measured in this run on the same device and in the step's precision (at::mm, n x n x n,
// best of 5; float32 for the fp32 step, bfloat16 for the bf16 step) at a large n (2048 on the CPU,
// 8192 on CUDA) and at a size near the model's matmuls (the geometric mean of B S, D and M, rounded
// to a multiple of 64); the higher of the two is the denominator, and the report names it.
// --peak-tflops adds the MFU against a stated peak (a data-sheet number such as an H100 SXM's
// dense bf16 989 TFLOP/s), beside the measured one, never instead of it.
//
// The peer is bench/peers/train_step_peer.py under the build's interpreter (cli/peer_util.h): the
// same model, batch, AdamW, steps and threads in PyTorch eager, started with OPENBLAS_CORETYPE set
// to the core this process runs. It runs right after the C++ steps; the ratio is C++ / PyTorch step
// time. Both sides start from the same model: before its steps cemfrac writes its initial weights
// (by checkpoint name), the batch ("__batch__") and the decay group's names (metadata "decay") to a
// temporary safetensors file, and the peer loads them (--weights). The peer's step-0 loss and
// gradient norm must then equal cemfrac's to float32 rounding (kPeerLossRtol, kPeerGradNormRtol);
// otherwise no ratio is reported and the command fails with one line. --check-float64 times
// nothing: it runs that step 0 on both sides with the weights cast to float64 and says whether they
// agree to kFloat64Rtol, which separates rounding from a difference of the models.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/compat.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/budget.h"
#include "cemfrac/train/run_config.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cli/peer_util.h"
#include "cli/step_profile.h"

namespace cemfrac::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kPython = kPeerPython;
constexpr const char* kPeerRelPath = "bench/peers/train_step_peer.py";
// Targets of this bench on the CPU: MFU at least 55% of the measured matmul rate, and a step at
// most 0.85x PyTorch eager's on the same model, weights and batch.
constexpr double kTargetMfu = 0.55;
constexpr double kTargetRatio = 0.85;

// Step 0 of cemfrac and of the peer must agree: |a - b| <= rtol * |a| for the loss and for the
// gradient norm before clipping. Both compute the same float32 function from the same weights and
// batch, in a different op order (fused vs eager kernels, other reduction orders, syrk vs matmul,
// the gram vs the direct CEM recursion): a reordered reduction of n terms moves its result by about
// sqrt(n) u relative (u = 2^-24 = 6e-8; n is at most a few thousand here: ~1e-6), the loss then
// averages B S such per-token values, and the backward adds a few more reordered layers. 1e-5 for
// the loss and 1e-4 for the gradient norm (~170 u and ~1700 u) leave that room with margin.
// Observed (2026-12-01, one step, --threads 1): tiny presets loss <= 8e-8 and gradient norm <= 8e-8
// relative; small-llama/-cem-both/-cem-full/-cofrgenet-f/-cofrgenet loss <= 1.1e-7, gradient
// norm <= 9.6e-6 (the closest, 10x inside its tolerance: cem-both and cem-full).
// The loss alone is a weak check at initialisation: logits are small, so it sits near ln V whatever
// the layers do (scaling one tiny-preset sub-layer's output by 0.9 moves it by 1e-7 to 6e-5
// relative). The gradient norm is the sharp one: the same change moves it by 2e-3 to 3e-2.
// Both sides sum the gradient's squares in float64: torch 1.13's float32 clip_grad_norm_ was off
// its float64 value by 1.0e-4 at gpt2-124m (torch.norm of the 38.6M-element wte gradient by
// 4.3e-3), which failed this check though --check-float64 found the models equal (docs/results.md).
constexpr double kPeerLossRtol = 1e-5;
constexpr double kPeerGradNormRtol = 1e-4;

// --check-float64: the same step 0 on both sides with every weight cast to float64. Rounding then
// shrinks by u64 / u32 = 2^-29 ~ 1.9e-9: the largest float32 gap seen (gpt2-124m's gradient norm,
// 1.3e-4 relative) would become ~2.4e-13 if it were rounding, while a difference of the models
// (another activation, a missing term, another init) does not shrink with the precision and stays
// at its float32 size. 1e-9 relative, for the loss and the gradient norm, sits four orders of
// magnitude above the first and five below the second.
constexpr double kFloat64Rtol = 1e-9;

struct TrainBenchFlags {
  std::string config;
  std::vector<std::string> sets;
  int steps = 5;
  int warmup = 1;
  bool json = false;
  bool peer = false;
  bool no_peer = false;
  std::string peer_script;
  bool malloc_default = false;
  bool peer_keep_heap = false;
  int nproc = 0;         // > 0: data-parallel scaling instead (cli/bench_train_dist.cpp)
  bool profile = false;  // one more step under the autograd profiler, after the timed ones
  int profile_top = 25;
  bool check_float64 = false;      // step 0 of both sides in float64, no timing
  std::string precision = "fp32";  // "bf16": also time the bf16 (autocast) step beside fp32
  double peak_tflops = 0;          // > 0: also MFU against this stated peak
  std::string device;              // the global --device ("" = the config's train.device)
};

// Every large tensor of a step (attention probabilities, logits and their gradients: tens of MB)
// would otherwise come from a fresh mmap that the kernel zeroes page by page, every step. A
// training process keeps its heap: no mmap for large blocks, no trimming.
constexpr const char* kKeepHeapEnv = "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295 ";

// User + system CPU seconds of this process so far (all threads).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The random batch of a step: (B, S + 1) token ids from train.seed.
torch::Tensor bench_batch(const RunConfig& rc, int64_t S) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rc.train.seed);
  return torch::randint(0, rc.model.vocab_size, {rc.train.micro_batch, S + 1}, gen, torch::kInt64);
}

// The peer's inputs: the model's weights under their checkpoint names, the batch as "__batch__" and
// the decay group's names as metadata "decay" (comma-separated).
void write_peer_inputs(const std::string& path, LmModelImpl& model, const torch::Tensor& data) {
  TensorMap tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    tensors[item.key()] = item.value().detach().to(torch::kCPU);
  tensors["__batch__"] = data;
  std::string decay;
  for (const ParamInfo& p : model.parameter_table()) {
    if (p.group == ParamGroup::kDecay) decay += (decay.empty() ? "" : ",") + p.name;
  }
  save_safetensors(path, tensors, {{"producer", "cemfrac bench train"}, {"decay", decay}});
}

struct StepTimes {
  std::vector<double> step_s, cpu_s, forward_s, backward_s, optimizer_s;
  double first_loss = 0, last_loss = 0;
  double first_grad_norm =
      0;  // step 0's gradient norm before clipping (checked against the peer's)
  std::optional<StepProfile> profile;  // --profile: the step after the timed ones
};

// bf16: the trainer's train.precision = "bf16" step (forward under autocast, float32 logits into
// the loss, float32 weights and AdamW state).
StepTimes run_cpp_steps(const RunConfig& rc, int64_t S, const TrainBenchFlags& flags,
                        LmModel& model, const torch::Tensor& data, const torch::Device& device,
                        bool bf16 = false) {
  const TrainConfig& t = rc.train;
  const int64_t V = rc.model.vocab_size;
  AdamWConfig adam;
  adam.lr = t.lr_max;
  adam.beta1 = t.beta1;
  adam.beta2 = t.beta2;
  adam.eps = t.adam_eps;
  adam.weight_decay = t.weight_decay;
  Optimizer optimizer(*model, model->parameter_table(), adam);
  const std::vector<torch::Tensor> trainable = optimizer.trainable();

  const torch::Tensor inputs = data.narrow(1, 0, S).contiguous();
  const torch::Tensor targets = data.narrow(1, 1, S).contiguous().reshape({-1});

  model->train();
  StepTimes out;
  for (int i = 0; i < flags.warmup + flags.steps; ++i) {
    sync_device(device);
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    optimizer.zero_grad();
    torch::Tensor logits;  // (B, S, V)
    if (bf16) {
      {
        compat::AutocastGuard autocast(device.type(), torch::kBFloat16);
        logits = model->forward(inputs);
      }
      logits = logits.to(torch::kFloat32);
    } else {
      logits = model->forward(inputs);
    }
    const torch::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, V}), targets);  // mean
    sync_device(device);
    const double fwd = seconds_since(t0);
    const auto t1 = Clock::now();
    loss.backward();
    sync_device(device);
    const double bwd = seconds_since(t1);
    const auto t2 = Clock::now();
    const double grad_norm = clip_grad_norm(trainable, t.grad_clip);
    optimizer.step();
    sync_device(device);
    const double opt = seconds_since(t2);
    const double step = seconds_since(t0);
    const double cpu = cpu_seconds() - c0;
    const double loss_value = loss.item<double>();
    if (i == 0) {
      out.first_loss = loss_value;
      out.first_grad_norm = grad_norm;
    }
    out.last_loss = loss_value;
    if (i < flags.warmup) continue;
    out.step_s.push_back(step);
    out.cpu_s.push_back(cpu);
    out.forward_s.push_back(fwd);
    out.backward_s.push_back(bwd);
    out.optimizer_s.push_back(opt);
  }
  if (flags.profile) {
    // The same step once more, profiled: its times are not among the timed ones (the profiler's
    // own bookkeeping slows every op a little), and the weights it leaves are not used again.
    out.profile = profile_call([&] {
      optimizer.zero_grad();
      const torch::Tensor logits = model->forward(inputs);
      const torch::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, V}), targets);
      loss.backward();
      clip_grad_norm(trainable, t.grad_clip);
      optimizer.step();
    });
  }
  return out;
}

// The peer's --config-json: the model as config.json writes it, and the step's settings.
json peer_config(const RunConfig& rc, int64_t S, double grad_clip) {
  const TrainConfig& t = rc.train;
  return {{"model", to_json(rc.model)},
          {"train",
           {{"micro_batch", t.micro_batch},
            {"seq_len", S},
            {"lr", t.lr_max},
            {"beta1", t.beta1},
            {"beta2", t.beta2},
            {"adam_eps", t.adam_eps},
            {"weight_decay", t.weight_decay},
            {"grad_clip", grad_clip},
            {"seed", t.seed}}}};
}

// --check-float64: cemfrac's and the peer's step 0 (forward, cross-entropy, backward, the gradient
// norm over every parameter that has a gradient) from the same weights and batch, in float32 and
// then with the same weights cast to float64. The float64 pair settles whether the float32
// disagreement is rounding or a difference of the models (see kFloat64Rtol); the float32 results
// against the float64 ones give each side's own rounding error at this shape, which is what the
// float32 tolerances of the timed check have to leave room for. Returns the exit code: 0 when the
// float64 pair agrees, 1 otherwise (with one line).
struct Step0 {
  double loss = 0, grad_norm = 0;
};

Step0 cpp_step0(LmModelImpl& model, const torch::Tensor& data, int64_t S, int64_t V) {
  std::vector<torch::Tensor> params = model.parameters();
  for (torch::Tensor& p : params) p.mutable_grad().reset();
  Step0 out;
  {
    const torch::Tensor logits = model.forward(data.narrow(1, 0, S).contiguous());
    const torch::Tensor loss = torch::cross_entropy_loss(
        logits.reshape({-1, V}), data.narrow(1, 1, S).contiguous().reshape({-1}));
    loss.backward();
    out.loss = loss.item<double>();
  }
  out.grad_norm = clip_grad_norm(params, /*max_norm=*/0);  // 0: measure only
  for (torch::Tensor& p : params) p.mutable_grad().reset();
  return out;
}

// The PyTorch peer's step-0 loss and gradient norm in float32 or (f64) float64, on the weights and
// batch in `weights`; the `last` call removes that file, and any failure does too.
Step0 peer_step0(const std::string& core, const fs::path& peer_script, const json& cfg,
                 const std::string& weights, bool f64, bool last, bool quiet) {
  const std::string cmd = fmt::format(
      "OPENBLAS_CORETYPE={} {} {} --config-json {} --steps 0 --warmup 1 --threads {} --weights "
      "{}{}",
      quote_for_shell(core), kPython, quote_for_shell(peer_script.string()),
      quote_for_shell(cfg.dump()), at::get_num_threads(), quote_for_shell(weights),
      f64 ? " --float64" : "");
  if (!quiet) fmt::print(stderr, "running the PyTorch peer: {}\n", cmd);
  std::string out;
  if (last) {
    out = run_peer(cmd, "the PyTorch peer", weights);  // removes the weights
  } else {
    try {
      out = capture_stdout(cmd, "the PyTorch peer");
    } catch (...) {
      std::error_code ec;
      fs::remove(weights, ec);
      throw;
    }
  }
  const json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
  CEMFRAC_CHECK(j.is_object() && j.contains("first_loss") && j.contains("first_grad_norm") &&
                    j["first_loss"].is_number() && j["first_grad_norm"].is_number(),
                "the PyTorch peer printed no step-0 loss and gradient norm: {}", cmd);
  return Step0{j["first_loss"].get<double>(), j["first_grad_norm"].get<double>()};
}

// The float64 check's table (without --json).
void print_float64_check(const TrainBenchFlags& flags, const TrainConfig& t, int64_t S,
                         double loss_rel, double grad_rel, const json& f32,
                         const std::string& verdict) {
  fmt::print("step 0 of {} ({} x {} tokens), relative differences:\n", flags.config, t.micro_batch,
             S);
  fmt::print(
      "  float64, peer vs cemfrac:      loss {:.3g}, gradient norm {:.3g} (tolerance {:.0e})\n",
      loss_rel, grad_rel, kFloat64Rtol);
  fmt::print(
      "  float32, peer vs cemfrac:      loss {:.3g}, gradient norm {:.3g} (the timed check "
      "allows {:.0e} and {:.0e})\n",
      f32["loss_rel_diff"].get<double>(), f32["grad_norm_rel_diff"].get<double>(), kPeerLossRtol,
      kPeerGradNormRtol);
  fmt::print("  float32 vs float64, cemfrac:   loss {:.3g}, gradient norm {:.3g}\n",
             f32["cpp_loss_err"].get<double>(), f32["cpp_grad_norm_err"].get<double>());
  fmt::print("  float32 vs float64, peer:      loss {:.3g}, gradient norm {:.3g}\n",
             f32["peer_loss_err"].get<double>(), f32["peer_grad_norm_err"].get<double>());
  fmt::print("{}\n", verdict);
}

int run_float64_check(const RunConfig& rc, int64_t S, const TrainBenchFlags& flags,
                      const fs::path& peer_script, const std::string& core) {
  const TrainConfig& t = rc.train;
  const int64_t V = rc.model.vocab_size;
  torch::manual_seed(t.seed);
  LmModel model(rc.model);  // initialised in float32 as always; the float64 step casts these
  const torch::Tensor data = bench_batch(rc, S);
  const std::string weights =
      (fs::temp_directory_path() / fmt::format("cemfrac-bench-peer64-{}.safetensors", getpid()))
          .string();
  write_peer_inputs(weights, *model, data);  // float32: the peer casts them as cemfrac does
  if (!flags.json)
    fmt::print(stderr, "step 0 of {} in float32 and float64 ({} parameters, batch {} x {})...\n",
               flags.config, model->num_parameters(), t.micro_batch, S);
  model->train();
  const Step0 a32 = cpp_step0(*model, data, S, V);
  model->to(torch::kFloat64);
  for (const auto& p : model->parameters())
    CEMFRAC_CHECK(p.scalar_type() == torch::kFloat64, "a parameter stayed {} after the cast",
                  c10::toString(p.scalar_type()));
  const Step0 a64 = cpp_step0(*model, data, S, V);
  model = nullptr;  // free the C++ side before the peer starts

  const json cfg = peer_config(rc, S, /*grad_clip=*/0.0);  // 0: the norm of all, unclipped
  const Step0 b32 =
      peer_step0(core, peer_script, cfg, weights, /*f64=*/false, /*last=*/false, flags.json);
  const Step0 b64 =
      peer_step0(core, peer_script, cfg, weights, /*f64=*/true, /*last=*/true, flags.json);

  auto rel = [](double x, double ref) { return std::abs(x - ref) / std::abs(ref); };
  const double loss_rel = rel(b64.loss, a64.loss), grad_rel = rel(b64.grad_norm, a64.grad_norm);
  const bool agree = loss_rel <= kFloat64Rtol && grad_rel <= kFloat64Rtol;  // false for NaN too
  const std::string verdict =
      agree ? "the same model (a float32 gap between them is rounding)"
            : "the models differ (the gap does not shrink with the precision)";
  // float32 against the shared float64 value: each side's own rounding error, and their gap.
  const json f32 = {
      {"cpp_loss", a32.loss},
      {"peer_loss", b32.loss},
      {"cpp_grad_norm", a32.grad_norm},
      {"peer_grad_norm", b32.grad_norm},
      {"cpp_loss_err", rel(a32.loss, a64.loss)},
      {"peer_loss_err", rel(b32.loss, a64.loss)},
      {"cpp_grad_norm_err", rel(a32.grad_norm, a64.grad_norm)},
      {"peer_grad_norm_err", rel(b32.grad_norm, a64.grad_norm)},
      {"loss_rel_diff", rel(b32.loss, a32.loss)},
      {"grad_norm_rel_diff", rel(b32.grad_norm, a32.grad_norm)},
      {"timed_check_tolerances_rel", {{"loss", kPeerLossRtol}, {"grad_norm", kPeerGradNormRtol}}}};
  if (flags.json) {
    fmt::print("{}\n", json{{"bench", "train"},
                            {"check", "float64"},
                            {"config", flags.config},
                            {"overrides", flags.sets},
                            {"micro_batch", t.micro_batch},
                            {"seq_len", S},
                            {"blas_core", core},
                            {"threads", at::get_num_threads()},
                            {"cpp_step0_loss", a64.loss},
                            {"peer_step0_loss", b64.loss},
                            {"loss_rel_diff", loss_rel},
                            {"cpp_step0_grad_norm", a64.grad_norm},
                            {"peer_step0_grad_norm", b64.grad_norm},
                            {"grad_norm_rel_diff", grad_rel},
                            {"tolerance_rel", kFloat64Rtol},
                            {"agree", agree},
                            {"float32", f32}}
                           .dump(2));
  } else {
    print_float64_check(flags, t, S, loss_rel, grad_rel, f32, verdict);
  }
  if (!agree)
    fmt::print(stderr,
               "float64 check failed: relative differences {:.3g} (loss) and {:.3g} (gradient "
               "norm) against {:.0e}: {}\n",
               loss_rel, grad_rel, kFloat64Rtol, verdict);
  return agree ? 0 : 1;
}

// The flags that do not combine with --nproc, refused before the config is read.
void check_nproc_flags(const TrainBenchFlags& flags) {
  CEMFRAC_CHECK(!(flags.profile && flags.nproc > 0),
                "--profile times one process's step; it does not combine with --nproc");
  CEMFRAC_CHECK(!(flags.check_float64 && flags.nproc > 0),
                "--check-float64 compares one process with the peer; it does not combine with "
                "--nproc");
}

// The devices (and device-dependent flags) the step bench refuses, each in one line.
void check_train_bench_device(const TrainBenchFlags& flags, const torch::Device& device) {
  CEMFRAC_CHECK(!device.is_meta(),
                "bench train: the meta device computes nothing to time (a dry run "
                "of shapes is `cemfrac --device meta train`); use cpu or cuda");
  CEMFRAC_CHECK(!(flags.nproc > 0 && !device.is_cpu()),
                "bench train --nproc measures data-parallel scaling on the CPU; it does not run "
                "on {} (drop --device, or drop --nproc)",
                device.str());
  CEMFRAC_CHECK(!(flags.check_float64 && !device.is_cpu()),
                "--check-float64 compares float64 steps on the CPU; it does not run on {}",
                device.str());
  CEMFRAC_CHECK(flags.peak_tflops >= 0, "--peak-tflops must be >= 0 (got {})", flags.peak_tflops);
}

// The flags of the one-process step, checked once --nproc is known not to be given.
void check_step_flags(const TrainBenchFlags& flags) {
  CEMFRAC_CHECK(!(flags.peer && flags.no_peer), "--peer and --no-peer exclude each other");
  CEMFRAC_CHECK(!(flags.check_float64 && flags.profile),
                "--check-float64 times nothing; it does not combine with --profile");
  CEMFRAC_CHECK(flags.steps >= 1, "--steps must be >= 1 (got {})", flags.steps);
  CEMFRAC_CHECK(flags.warmup >= 0, "--warmup must be >= 0 (got {})", flags.warmup);
}

// Whether the PyTorch peer runs, decided before minutes are spent on the C++ side: its script, or
// the note saying why it is skipped. --peer makes every reason to skip an error.
struct PeerChoice {
  std::optional<fs::path> script;
  std::string note;
};

PeerChoice choose_peer(const TrainBenchFlags& flags, const RunConfig& rc) {
  PeerChoice c;
  if (flags.no_peer) return c;
  const std::string why_not = peer_unsupported(rc.model, Peer::kTrainStep);
  const bool have_python = python_with_torch();
  c.script = locate_peer(flags.peer_script, kPeerRelPath);
  if (flags.peer) {
    CEMFRAC_CHECK(have_python, "--peer needs {} with torch (Debian: python3-torch)", kPython);
    CEMFRAC_CHECK(c.script.has_value(),
                  "--peer: {} not found; run from the source tree, set CEMFRAC_SOURCE_DIR or pass "
                  "--peer-script",
                  kPeerRelPath);
    CEMFRAC_CHECK(why_not.empty(), "--peer: the PyTorch peer does not model {}", why_not);
  } else if (!have_python || !c.script || !why_not.empty()) {
    c.note = !have_python ? fmt::format("peer skipped: no {} with torch", kPython)
             : !c.script  ? fmt::format("peer skipped: {} not found", kPeerRelPath)
                          : fmt::format("peer skipped: it does not model {}", why_not);
    c.script.reset();
  }
  return c;
}

// The matmul rates now, on this device, at the model's size and at a large size (MFU's
// denominator: the higher of the two).
struct MatmulRate {
  double at_n_model = 0, at_large = 0, peak = 0;
};
struct MatmulSizes {
  int n_model = 0, n_large = 0;
};

MatmulSizes matmul_sizes(const RunConfig& rc, int64_t tokens, const torch::Device& device) {
  const auto geo = std::cbrt(double(tokens) * double(rc.model.d_model) * double(rc.model.d_ff));
  MatmulSizes n;
  n.n_large = device.is_cuda() ? 8192 : 2048;
  n.n_model = static_cast<int>(std::clamp<double>(std::round(geo / 64.0) * 64.0, 64.0, n.n_large));
  return n;
}

MatmulRate measure_rate(const MatmulSizes& n, const torch::Device& device,
                        torch::ScalarType dtype) {
  MatmulRate r;
  r.at_n_model = measure_matmul_gflops(n.n_model, 5, device, dtype);
  r.at_large = measure_matmul_gflops(n.n_large, 5, device, dtype);
  r.peak = std::max(r.at_n_model, r.at_large);
  return r;
}

json rate_json(const MatmulSizes& n, const MatmulRate& r) {
  return {{"n_model", n.n_model},
          {"at_n_model", r.at_n_model},
          {"n_large", n.n_large},
          {"at_large", r.at_large},
          {"peak", r.peak}};
}

// Runs the peer from the weights and batch in `weights` and returns its JSON result, checked to
// have built as many parameters as cemfrac.
json run_train_peer(const TrainBenchFlags& flags, const RunConfig& rc, int64_t S,
                    const fs::path& script, const std::string& weights, const std::string& core,
                    int threads, const torch::Device& device, int64_t n_params) {
  const json cfg = peer_config(rc, S, rc.train.grad_clip);
  const std::string cmd = fmt::format(
      "{}OPENBLAS_CORETYPE={} {} {} --config-json {} --steps {} --warmup {} --threads {} "
      "--weights {} --device {}",
      flags.peer_keep_heap ? kKeepHeapEnv : "", quote_for_shell(core), kPython,
      quote_for_shell(script.string()), quote_for_shell(cfg.dump()), flags.steps, flags.warmup,
      threads, quote_for_shell(weights), device.str());
  if (!flags.json) fmt::print(stderr, "running the PyTorch peer: {}\n", cmd);
  const std::string peer_out = run_peer(cmd, "the PyTorch peer", weights);
  json peer = json::parse(peer_out, nullptr, /*allow_exceptions=*/false);
  CEMFRAC_CHECK(peer.is_object() && peer.contains("median_s"),
                "the PyTorch peer printed no JSON result: {}", cmd);
  CEMFRAC_CHECK(peer["parameters"].get<int64_t>() == n_params,
                "the PyTorch peer built {} parameters, cemfrac {}: the models differ",
                peer["parameters"].get<int64_t>(), n_params);
  return peer;
}

// One side's speed; its MFU against `peak_gflops`, the matmul rate measured in this run in that
// side's precision (named by `peak_name`), and against --peak-tflops when given.
json side_json(double median_s, double min_s, int64_t tokens, const Flops& flops,
               double peak_gflops, const std::string& peak_name, double stated_peak_tflops) {
  json j{{"median_s", median_s},
         {"min_s", min_s},
         {"tokens_per_s", tokens / median_s},
         {"achieved_gflops", flops.per_step / median_s / 1e9},
         {"mfu", flops.per_step / median_s / (peak_gflops * 1e9)},
         {"mfu_best", flops.per_step / min_s / (peak_gflops * 1e9)},
         {"mfu_peak", peak_name},
         {"mfu_peak_gflops", peak_gflops}};
  if (stated_peak_tflops > 0)
    j["mfu_vs_stated_peak"] = flops.per_step / median_s / (stated_peak_tflops * 1e12);
  return j;
}

// A cemfrac side (the fp32 step or the bf16 one): its speed and the step's details.
json cpp_side_json(const StepTimes& st, int64_t tokens, const Flops& flops, double peak_gflops,
                   const std::string& peak_name, const TrainBenchFlags& flags,
                   const std::string& core) {
  json j = side_json(median(st.step_s), *std::min_element(st.step_s.begin(), st.step_s.end()),
                     tokens, flops, peak_gflops, peak_name, flags.peak_tflops);
  j["step_s"] = st.step_s;
  j["cpu_s"] = st.cpu_s;
  j["cpu_median_s"] = median(st.cpu_s);
  j["malloc"] = flags.malloc_default ? "glibc default" : "heap kept (no mmap, no trim)";
  j["phases_median_s"] = {{"forward", median(st.forward_s)},
                          {"backward", median(st.backward_s)},
                          {"clip_and_optimizer", median(st.optimizer_s)}};
  j["first_loss"] = st.first_loss;
  j["last_loss"] = st.last_loss;
  j["blas_core"] = core;
  return j;
}

// Everything the bench measured, before the peer is compared.
struct TrainBenchRun {
  torch::Device device = torch::kCPU;
  int64_t B = 0, S = 0, n_params = 0;
  int threads = 0;
  std::string core;
  Flops flops;
  MatmulSizes sizes;
  MatmulRate fp32_rate, bf16_rate;
  StepTimes cpp;
  std::optional<StepTimes> bf16;
  json peer;  // null without one
  std::string peer_note;
};

// The report without the peer's part.
json train_bench_report(const TrainBenchFlags& flags, const TrainBenchRun& m) {
  const int64_t tokens = m.B * m.S;
  const std::string fp32_peak_name =
      fmt::format("float32 matmul on {} measured in this run", m.device.str());
  json cpp_j =
      cpp_side_json(m.cpp, tokens, m.flops, m.fp32_rate.peak, fp32_peak_name, flags, m.core);
  cpp_j["threads"] = m.threads;
  if (m.cpp.profile) cpp_j["profile"] = profile_to_json(*m.cpp.profile, flags.profile_top);
  json report = {
      {"bench", "train"},
      {"config", flags.config},
      {"overrides", flags.sets},
      {"cpu", read_cpu_features().model_name},
      {"device", m.device.str()},
      {"threads", m.threads},
      {"blas_core", m.core},
      {"blas_library", blas_status().library},
      {"parameters", m.n_params},
      {"matmul_parameters", m.flops.matmul_params},
      {"micro_batch", m.B},
      {"seq_len", m.S},
      {"tokens_per_step", tokens},
      {"flops_per_token", m.flops.per_token},
      {"forward_flops_per_token",
       {{"mixers", m.flops.mixers}, {"ffns", m.flops.ffns}, {"head", m.flops.head}}},
      {"flops_per_step", m.flops.per_step},
      {"flops_formula", m.flops.formula},
      {"sgemm_gflops", rate_json(m.sizes, m.fp32_rate)},
      {"steps", flags.steps},
      {"warmup", flags.warmup},
      {"cpp", cpp_j},
  };
  if (m.bf16) {
    json bf16_j = cpp_side_json(
        *m.bf16, tokens, m.flops, m.bf16_rate.peak,
        fmt::format("bfloat16 matmul on {} measured in this run", m.device.str()), flags, m.core);
    bf16_j["ratio_to_fp32_median"] = median(m.bf16->step_s) / median(m.cpp.step_s);
    report["cpp_bf16"] = bf16_j;
    report["bf16_matmul_gflops"] = rate_json(m.sizes, m.bf16_rate);
  }
  if (flags.peak_tflops > 0) report["stated_peak_tflops"] = flags.peak_tflops;
  return report;
}

// The peer's part of the report: its step 0 checked against cemfrac's (the refusal when they
// differ, "" when they agree or there is no peer), then its speed and the ratios; and whether the
// CPU targets are met.
std::string add_peer_to_report(const TrainBenchFlags& flags, const TrainBenchRun& m, json& report) {
  bool met = report["cpp"]["mfu"].get<double>() >= kTargetMfu;
  std::string refusal;
  const json& peer = m.peer;
  if (!peer.is_null()) {
    const double a = m.cpp.first_loss, b = peer["first_loss"].get<double>();
    const double ga = m.cpp.first_grad_norm, gb = peer["first_grad_norm"].get<double>();
    const double tol = kPeerLossRtol * std::abs(a), gtol = kPeerGradNormRtol * std::abs(ga);
    const bool loss_ok = std::abs(a - b) <= tol;  // false for NaN too
    const bool grad_ok = std::abs(ga - gb) <= gtol;
    report["peer_loss_check"] = {{"cpp_step0_loss", a},
                                 {"peer_step0_loss", b},
                                 {"abs_diff", std::abs(a - b)},
                                 {"tolerance", tol},
                                 {"cpp_step0_grad_norm", ga},
                                 {"peer_step0_grad_norm", gb},
                                 {"grad_norm_abs_diff", std::abs(ga - gb)},
                                 {"grad_norm_tolerance", gtol},
                                 {"agree", loss_ok && grad_ok}};
    if (!loss_ok || !grad_ok) {
      refusal = fmt::format(
          "no ratio: from the same weights and batch the peer's step 0 differs from cemfrac's "
          "(loss "
          "{:.9g} vs {:.9g}, tolerance {:.2g}; gradient norm {:.9g} vs {:.9g}, tolerance {:.2g}): "
          "the peer does not compute the same model",
          b, a, tol, gb, ga, gtol);
    }
  }
  if (!peer.is_null() && refusal.empty()) {
    json peer_j = side_json(peer["median_s"].get<double>(), peer["min_s"].get<double>(), m.B * m.S,
                            m.flops, m.fp32_rate.peak, report["cpp"]["mfu_peak"].get<std::string>(),
                            flags.peak_tflops);
    for (const char* key :
         {"step_s", "cpu_s", "cpu_median_s", "phases_median_s", "first_loss", "last_loss",
          "blas_core", "threads", "python", "torch", "adamw_foreach"})
      peer_j[key] = peer[key];
    report["peer"] = peer_j;
    report["ratio_median"] = median(m.cpp.step_s) / peer["median_s"].get<double>();
    report["ratio_min"] =
        *std::min_element(m.cpp.step_s.begin(), m.cpp.step_s.end()) / peer["min_s"].get<double>();
    report["ratio_cpu_median"] = median(m.cpp.cpu_s) / peer["cpu_median_s"].get<double>();
    report["peer"]["malloc"] =
        flags.peer_keep_heap ? "heap kept (no mmap, no trim)" : "glibc default";
    met = met && report["ratio_median"].get<double>() <= kTargetRatio;
  } else if (!refusal.empty()) {
    report["peer_note"] = refusal;
    met = false;
  } else if (!m.peer_note.empty()) {
    report["peer_note"] = m.peer_note;
  }
  // The targets are the CPU's (kTargetMfu); a GPU step is judged by gpu_check.sh's own.
  if (m.device.is_cpu()) {
    report["targets"] = {{"mfu_at_least", kTargetMfu},
                         {"ratio_at_most", peer.is_null() ? json(nullptr) : json(kTargetRatio)},
                         {"met", met}};
  }
  return refusal;
}

// The report as text.
void print_train_bench(const TrainBenchFlags& flags, const TrainBenchRun& m, const json& report,
                       const std::string& refusal) {
  const std::string dev = m.device.str();
  fmt::print(
      "train-step bench: {} ({} parameters), micro-batch {} x {} = {} tokens, on {}, {} threads\n",
      flags.config, m.n_params, m.B, m.S, m.B * m.S, dev, m.threads);
  fmt::print("CPU {}; BLAS {} core {}\n", read_cpu_features().model_name, blas_status().library,
             m.core);
  fmt::print("model FLOPs/step = {}\n", m.flops.formula);
  fmt::print(
      "float32 matmul on {} now: {:.1f} GFLOP/s at {}^3, {:.1f} at {}^3 (the fp32 MFU's "
      "denominator: {:.1f})\n",
      dev, m.fp32_rate.at_n_model, m.sizes.n_model, m.fp32_rate.at_large, m.sizes.n_large,
      m.fp32_rate.peak);
  if (m.bf16)
    fmt::print(
        "bfloat16 matmul on {} now: {:.1f} GFLOP/s at {}^3, {:.1f} at {}^3 (the bf16 MFU's "
        "denominator: {:.1f})\n",
        dev, m.bf16_rate.at_n_model, m.sizes.n_model, m.bf16_rate.at_large, m.sizes.n_large,
        m.bf16_rate.peak);
  if (flags.peak_tflops > 0)
    fmt::print("stated peak: {:.1f} TFLOP/s (MFU* below)\n", flags.peak_tflops);
  fmt::print(
      "{} warm-up + {} timed steps each side; CPU s = user + system seconds of the process per "
      "step (median; all threads)\n\n",
      flags.warmup, flags.steps);
  fmt::print("{:<9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7}  {}\n", "",
             "median s", "min s", "tokens/s", "MFU", "CPU s", "fwd s", "bwd s", "opt s", "loss0",
             "lossN", "BLAS core, malloc");
  auto row = [&](const char* name, const json& j) {
    const json& ph = j["phases_median_s"];
    fmt::print(
        "{:<9} {:>9.3f} {:>9.3f} {:>9.0f} {:>5.1f}% {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>7.3f} "
        "{:>7.3f}  {}, {}\n",
        name, j["median_s"].get<double>(), j["min_s"].get<double>(),
        j["tokens_per_s"].get<double>(), 100 * j["mfu"].get<double>(),
        j["cpu_median_s"].get<double>(), ph["forward"].get<double>(), ph["backward"].get<double>(),
        ph["clip_and_optimizer"].get<double>(), j["first_loss"].get<double>(),
        j["last_loss"].get<double>(), j["blas_core"].get<std::string>(),
        j["malloc"].get<std::string>());
  };
  row("cemfrac", report["cpp"]);
  if (m.bf16) {
    row("bf16", report["cpp_bf16"]);
    fmt::print("(MFU of each row against the matmul of its own precision measured above)\n");
    fmt::print("bf16 / fp32 step time (median): {:.3f}; same weights and batch, autocast bf16\n",
               report["cpp_bf16"]["ratio_to_fp32_median"].get<double>());
  }
  if (m.cpp.profile) fmt::print("\n{}\n", profile_table(*m.cpp.profile, flags.profile_top));
  if (report.contains("peer")) {
    row("pytorch", report["peer"]);
    fmt::print(
        "\nC++ / PyTorch step time: {:.3f} (median), {:.3f} (min), CPU time {:.3f}; PyTorch {} "
        "under Python {}\n",
        report["ratio_median"].get<double>(), report["ratio_min"].get<double>(),
        report["ratio_cpu_median"].get<double>(), m.peer["torch"].get<std::string>(),
        m.peer["python"].get<std::string>());
  } else if (!refusal.empty()) {
    fmt::print("\n{}\n", refusal);
  } else if (!m.peer_note.empty()) {
    fmt::print("\n{}\n", m.peer_note);
  }
  if (flags.peak_tflops > 0) {
    fmt::print("MFU* against the stated {:.1f} TFLOP/s: fp32 step {:.1f}%{}\n", flags.peak_tflops,
               100 * report["cpp"]["mfu_vs_stated_peak"].get<double>(),
               m.bf16 ? fmt::format(", bf16 step {:.1f}%",
                                    100 * report["cpp_bf16"]["mfu_vs_stated_peak"].get<double>())
                      : std::string());
  }
  if (m.device.is_cpu()) {
    fmt::print(
        "CPU targets: MFU >= {:.0f}% of the measured float32 matmul{}: {}\n", 100 * kTargetMfu,
        m.peer.is_null() ? "" : fmt::format(", C++/PyTorch step time <= {:.2f}", kTargetRatio),
        report["targets"]["met"].get<bool>() ? "met" : "NOT met");
  }
}

// The C++ steps (fp32, and bf16 when asked) from one initial model, then the peer's from the same
// weights and batch.
void time_train_steps(const TrainBenchFlags& flags, const RunConfig& rc, const PeerChoice& choice,
                      TrainBenchRun& m) {
  const TrainConfig& t = rc.train;
  torch::manual_seed(t.seed);
  LmModel model(rc.model, m.device);
  m.n_params = model->num_parameters();
  m.flops = model_flops(*model, m.B, m.S);
  m.sizes = matmul_sizes(rc, m.B * m.S, m.device);
  m.fp32_rate = measure_rate(m.sizes, m.device, torch::kFloat32);
  if (flags.precision == "bf16") m.bf16_rate = measure_rate(m.sizes, m.device, torch::kBFloat16);
  if (!flags.json) {
    fmt::print(stderr, "timing {} warm-up + {} steps of {} ({} parameters, batch {} x {})...\n",
               flags.warmup, flags.steps, flags.config, m.n_params, m.B, m.S);
  }
  const torch::Tensor data = bench_batch(rc, m.S);
  const torch::Tensor data_here = data.to(m.device);
  // The peer starts from these very weights and batch (see kPeerLossRtol).
  std::string peer_weights;
  if (choice.script) {
    peer_weights =
        (fs::temp_directory_path() / fmt::format("cemfrac-bench-peer-{}.safetensors", getpid()))
            .string();
    write_peer_inputs(peer_weights, *model, data);
  }
  m.cpp = run_cpp_steps(rc, m.S, flags, model, data_here, m.device);
  model = nullptr;  // free the C++ model before the peer starts
  if (flags.precision == "bf16") {
    // The same weights and batch again, the step under bf16 autocast (train.precision = "bf16").
    torch::manual_seed(t.seed);
    LmModel again(rc.model, m.device);
    TrainBenchFlags plain = flags;
    plain.profile = false;
    m.bf16 = run_cpp_steps(rc, m.S, plain, again, data_here, m.device, /*bf16=*/true);
  }
  if (choice.script)
    m.peer = run_train_peer(flags, rc, m.S, *choice.script, peer_weights, m.core, m.threads,
                            m.device, m.n_params);
}

int run_train_bench(const TrainBenchFlags& flags) {
  check_nproc_flags(flags);
  const RunConfig rc = load_run_config(flags.config, flags.sets);
  TrainBenchRun m;
  m.device = command_device(flags.device, rc.train.device);
  check_train_bench_device(flags, m.device);
  if (flags.nproc > 0)
    return run_train_bench_nproc(flags.config, flags.sets, flags.nproc, flags.steps, flags.warmup,
                                 flags.json);
  check_step_flags(flags);
  if (!flags.malloc_default) keep_heap();
  m.B = rc.train.micro_batch;
  m.S = rc.train.seq_len > 0 ? rc.train.seq_len : rc.model.context;
  CEMFRAC_CHECK(m.S <= rc.model.context, "train.seq_len {} exceeds model.context {}", m.S,
                rc.model.context);
  m.threads = at::get_num_threads();
  m.core = blas_status().core;
  const PeerChoice peer = choose_peer(flags, rc);
  m.peer_note = peer.note;
  if (flags.check_float64) {
    CEMFRAC_CHECK(!flags.no_peer && peer.script.has_value() && peer.note.empty(),
                  "--check-float64 compares with the PyTorch peer: {}",
                  flags.no_peer ? std::string("--no-peer given") : peer.note);
    return run_float64_check(rc, m.S, flags, *peer.script, m.core);
  }
  time_train_steps(flags, rc, peer, m);
  json report = train_bench_report(flags, m);
  const std::string refusal = add_peer_to_report(flags, m, report);
  if (flags.json) {
    fmt::print("{}\n", report.dump(2));
    if (!refusal.empty()) fmt::print(stderr, "{}\n", refusal);
  } else {
    print_train_bench(flags, m, report, refusal);
  }
  return refusal.empty() ? 0 : 1;
}

}  // namespace

Command add_bench_train(CLI::App& bench, const GlobalOptions& global) {
  // --threads and --blas-core are applied in main() before any command runs; --device here.
  auto flags = std::make_shared<TrainBenchFlags>();
  CLI::App* app = bench.add_subcommand(
      "train",
      "Time per optimizer step, tokens/s and MFU of a run config's model, against PyTorch eager");
  app->add_option("--config", flags->config, "Run config (TOML), e.g. configs/small-llama.toml")
      ->required();
  app->add_option("--set", flags->sets, "Override a config field: section.key=value (repeatable)");
  app->add_option("--steps", flags->steps, "Timed optimizer steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app->add_option("--warmup", flags->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app->add_flag("--json", flags->json, "Print one JSON object");
  app->add_flag("--peer", flags->peer,
                "Run the PyTorch peer (bench/peers/train_step_peer.py under " CEMFRAC_PEER_PYTHON
                ", the build's interpreter); default: on when it imports torch");
  app->add_flag("--no-peer", flags->no_peer, "Do not run the PyTorch peer");
  app->add_option("--peer-script", flags->peer_script,
                  "Path of train_step_peer.py (default: found in the source tree)");
  app->add_flag("--malloc-default", flags->malloc_default,
                "Leave glibc malloc as configured (large tensors then come from fresh mmaps: page "
                "faults inside every step)");
  app->add_flag("--peer-keep-heap", flags->peer_keep_heap,
                "Run the peer with the same heap policy as cemfrac (MALLOC_MMAP_MAX_=0, "
                "MALLOC_TRIM_THRESHOLD_ max); default: Python's glibc defaults");
  app->add_option(
         "--nproc", flags->nproc,
         "Data-parallel scaling instead: N ranks x 1 thread vs 1 rank x 1 thread and 1 rank "
         "x N threads, real training steps on the config's data (docs/distributed.md)")
      ->check(CLI::Range(2, 64));
  app->add_flag("--profile", flags->profile,
                "After the timed steps, profile one more step with LibTorch's autograd profiler "
                "and print where its time goes: self time per op, autograd node and cemfrac "
                "layer scope (JSON: cpp.profile)");
  app->add_flag("--check-float64", flags->check_float64,
                "Instead of timing: step 0 of cemfrac and of the PyTorch peer from the same "
                "weights and batch, in float32 and in float64; agreement in float64 to 1e-9 "
                "relative (loss and gradient norm) says a float32 gap is rounding, not a "
                "different model, and each side's float32 error against float64 is printed");
  app->add_option("--precision", flags->precision,
                  "bf16: also time the train.precision = \"bf16\" step (autocast, float32 "
                  "master weights) on the same weights and batch, printed beside fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app->add_option("--peak-tflops", flags->peak_tflops,
                  "Also give MFU against this stated peak in TFLOP/s (e.g. 989: an H100 SXM's "
                  "dense bf16), beside the MFU against the matmul measured in this run");
  app->add_option("--profile-top", flags->profile_top, "Rows of the --profile table")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  return {app, [flags, &global] {
            flags->device = global.device;
            return run_train_bench(*flags);
          }};
}

}  // namespace cemfrac::cli

// cemfrac bench layers: forward and forward+backward time of every mixer and FFN kind on its own,
// at one width and context, against MHA (mixers) and the GELU MLP (FFNs) timed in the same run.
//
//   cemfrac [--device cpu|cuda] bench layers [--json] [--width 512] [--context 256] [--batch 4]
//       [--reps 5] [--kinds k1,k2] [--set model.key=value]...
//
// Every kind the registry knows is timed with the model-config defaults at the given shape (heads =
// width / 64, d_ff = 4 width, RoPE), plus the variants listed in kVariants (CEM at T = 2, 4, the
// direct T = 2 loop, D+LR, keys from the iterates, prox + step_norm). One sub-layer = the module
// make_mixer / make_ffn builds for layer 0, fed x (B, N, D) in float32; forward runs without
// autograd, forward+backward takes the gradient of <y, g> for a fixed random g with respect to x
// and every parameter. All rows are timed round-robin (each round runs every row once), so a slow
// spell of a shared machine lands on all rows alike; times are best and median of --reps rounds
// after one warm-up; the ratio column is best / the baseline's best. --json also lists every
// round's forward+backward time in round order, so a ratio of two rows can be taken round by round
// (its median resists a noisy machine better than a ratio of two bests). Each row also has its
// kind's forward FLOPs per token (forward_flops_per_token at the context, docs/flops.md), the
// forward+backward rate 3 x that x tokens / best time, and MFU = that rate / the sgemm rate
// measured in the run on the same device (at::mm n x n x n float32, best of 3, n the geometric mean
// of tokens, width and d_ff rounded to a multiple of 64). On CUDA every timed call starts and ends
// on a synchronised device; the meta device is refused (nothing to time).
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/registry.h"
#include "cemfrac/model/layer_factory.h"
#include "cemfrac/train/run_config.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cemfrac/core/device.h"

namespace cemfrac::cli {
namespace {

using nlohmann::json;

struct LayersFlags {
  bool json = false;
  int64_t width = 512;
  int64_t context = 256;
  int64_t batch = 4;
  int reps = 5;
  std::string kinds;  // comma-separated filter; empty = all
  std::vector<std::string> sets;
  bool malloc_default = false;
  std::string device;  // the global --device ("" = cpu)
};

// Extra rows beyond each kind's defaults: (kind, label, overrides).
struct Variant {
  const char* kind;
  const char* label;
  std::vector<std::string> sets;
};
const std::vector<Variant> kVariants = {
    {"cem_attention", "T=2", {"model.cem.steps=2"}},
    {"cem_attention", "T=2 direct", {"model.cem.steps=2", "model.cem.recursion=direct"}},
    {"cem_attention", "T=4", {"model.cem.steps=4"}},
    {"cem_attention",
     "T=2 iterate keys",
     {"model.cem.steps=2", "model.cem.recursion_keys=iterate"}},
    {"cem_attention",
     "T=2 prox+step_norm",
     {"model.cem.steps=2", "model.cem.prox=learned", "model.cem.step_norm=rms"}},
    {"cem_attention", "D+LR", {"model.cem.dlr=per_head"}},
    {"cem_attention", "D+LR T=2", {"model.cem.dlr=per_head", "model.cem.steps=2"}},
    {"cem_attention", "D+LR shared", {"model.cem.dlr=shared"}},
    {"cem_attention", "D+LR shared T=2", {"model.cem.dlr=shared", "model.cem.steps=2"}},
    {"cem_mlp", "T=2", {"model.cem.steps=2"}},
    {"cem_mlp", "T=4", {"model.cem.steps=4"}},
    {"cem_mlp",
     "T=2 prox+step_norm",
     {"model.cem.steps=2", "model.cem.prox=learned", "model.cem.step_norm=rms"}},
};

constexpr const char* kMixerBaseline = "mha";
constexpr const char* kFfnBaseline = "gelu_mlp";

struct Row {
  std::string sublayer;  // "mixer" | "ffn"
  std::string kind;
  std::string variant;
  int64_t params = 0;
  double forward_flops_per_token = 0;
  Timing forward;
  Timing forward_backward;
  std::vector<double>
      forward_backward_rounds;  // ms, round by round (round r of every row ran together)
};

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int64_t count_params(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// One row's module and how to call it, ready to be timed.
struct Subject {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> call;
  std::vector<torch::Tensor> params;
  double forward_flops_per_token = 0;
  std::vector<double> forward_ms, forward_backward_ms;
};

// One call's milliseconds, from a synchronised device to a synchronised device (CUDA).
template <typename Fn>
double time_once(Fn&& fn, const c10::Device& device) {
  sync_device(device);
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  sync_device(device);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Times every subject round-robin: one warm-up call each, then `reps` rounds in which every subject
// runs once, so that a slow spell of a shared machine hits all rows alike instead of a few of them.
void time_round_robin(std::vector<Subject>& subjects, const torch::Tensor& x,
                      const torch::Tensor& g, int reps) {
  const c10::Device device = x.device();
  const torch::Tensor xg = x.clone().requires_grad_();
  auto forward = [&](Subject& s) {
    torch::NoGradGuard no_grad;
    s.call(x);
  };
  auto forward_backward = [&](Subject& s) {
    for (auto& p : s.params) {
      if (p.grad().defined()) p.mutable_grad().reset();  // assign, as a training step does
    }
    xg.mutable_grad().reset();
    torch::Tensor y = s.call(xg);
    y.backward(g);
  };
  for (Subject& s : subjects) {
    forward(s);
    forward_backward(s);
  }
  for (int r = 0; r < reps; ++r) {
    for (Subject& s : subjects) s.forward_ms.push_back(time_once([&] { forward(s); }, device));
    for (Subject& s : subjects)
      s.forward_backward_ms.push_back(time_once([&] { forward_backward(s); }, device));
  }
}

// One row of the bench: a sub-layer kind with one variant's overrides.
struct LayerJob {
  std::string sublayer, kind, variant;
  std::vector<std::string> sets;
};

// The rows: every mixer kind (defaults, then its variants), then every FFN kind likewise, of the
// kinds --kinds names (all when empty); the baselines always run.
std::vector<LayerJob> layer_jobs(const std::string& kinds) {
  const std::vector<std::string> only = split_names(kinds);
  const auto& mixers = mixer_kind_names();
  const auto& ffns = ffn_kind_names();
  for (const std::string& k : only) {
    CEMFRAC_CHECK(std::find(mixers.begin(), mixers.end(), k) != mixers.end() ||
                      std::find(ffns.begin(), ffns.end(), k) != ffns.end(),
                  "--kinds: '{}' is not a mixer or FFN kind (mixers: {}; FFNs: {})", k,
                  fmt::join(mixers, ", "), fmt::join(ffns, ", "));
  }
  auto wanted = [&](const std::string& kind) {
    return only.empty() || std::find(only.begin(), only.end(), kind) != only.end();
  };
  std::vector<LayerJob> jobs;
  auto add_kind = [&](const char* sublayer, const std::string& kind, const char* baseline) {
    if (kind != baseline && !wanted(kind)) return;
    const std::string field =
        std::string("model.") + (sublayer == std::string("mixer") ? "mixer=" : "ffn=");
    jobs.push_back({sublayer, kind, "default", {field + kind}});
    for (const Variant& v : kVariants) {
      if (v.kind != kind) continue;
      std::vector<std::string> sets = v.sets;
      sets.push_back(field + kind);
      jobs.push_back({sublayer, kind, v.label, sets});
    }
  };
  for (const std::string& k : mixers) add_kind("mixer", k, kMixerBaseline);
  for (const std::string& k : ffns) add_kind("ffn", k, kFfnBaseline);
  return jobs;
}

// The modules to time, one per job, each built from the same seed; a mixer's context (with RoPE
// tables when its config rotates) lives in `contexts` / `rotaries`.
std::vector<Subject> build_subjects(const std::vector<LayerJob>& jobs, const RunConfig& base,
                                    const torch::Device& device,
                                    std::vector<std::unique_ptr<MixerContext>>& contexts,
                                    std::vector<std::unique_ptr<RotaryEmbedding>>& rotaries) {
  std::vector<Subject> subjects;
  for (const LayerJob& job : jobs) {
    const ModelConfig c = with_overrides(base, job.sets).model;
    torch::manual_seed(1);
    Subject s;
    if (job.sublayer == "mixer") {
      auto mixer = make_mixer(c, 0, device);
      auto ctx = std::make_unique<MixerContext>();
      if (c.positions == Positions::kRope) {
        rotaries.push_back(std::make_unique<RotaryEmbedding>(c.head_dim(), c.context, c.rope_theta,
                                                             c.rope_scaling));
        std::tie(ctx->rope_cos, ctx->rope_sin) = rotaries.back()->tables(
            0, c.context, torch::TensorOptions().dtype(torch::kFloat32).device(device));
      }
      const MixerContext* context = ctx.get();
      contexts.push_back(std::move(ctx));
      s.module = mixer;
      s.call = [mixer, context](const torch::Tensor& x) { return mixer->forward(x, *context); };
      s.forward_flops_per_token = mixer->forward_flops_per_token(c.context);
    } else {
      auto ffn = make_ffn(c, 0, device);
      s.module = ffn;
      s.call = [ffn](const torch::Tensor& x) { return ffn->forward(x); };
      s.forward_flops_per_token = ffn->forward_flops_per_token();
    }
    s.params = s.module->parameters();
    subjects.push_back(std::move(s));
  }
  return subjects;
}

// The report's rows: times, throughput, MFU against `sgemm_gflops` and the ratio to the baseline
// of the row's sub-layer.
json layer_rows(const std::vector<Row>& rows, double tokens, double sgemm_gflops) {
  auto baseline_ms = [&](const std::string& sublayer) {
    const std::string kind = sublayer == "mixer" ? kMixerBaseline : kFfnBaseline;
    for (const Row& r : rows)
      if (r.sublayer == sublayer && r.kind == kind && r.variant == "default")
        return r.forward_backward.best_ms;
    return 0.0;
  };
  json out = json::array();
  for (const Row& r : rows) {
    const double base_ms = baseline_ms(r.sublayer);
    // forward + backward = 3 forwards (docs/flops.md)
    const double gflops =
        3.0 * r.forward_flops_per_token * tokens / (r.forward_backward.best_ms * 1e6);
    out.push_back(
        {{"sublayer", r.sublayer},
         {"kind", r.kind},
         {"variant", r.variant},
         {"parameters", r.params},
         {"forward_ms", {{"best", r.forward.best_ms}, {"median", r.forward.median_ms}}},
         {"forward_backward_ms",
          {{"best", r.forward_backward.best_ms}, {"median", r.forward_backward.median_ms}}},
         {"forward_backward_rounds_ms", r.forward_backward_rounds},
         {"forward_backward_us_per_token", 1e3 * r.forward_backward.best_ms / tokens},
         {"forward_flops_per_token", r.forward_flops_per_token},
         {"forward_backward_gflops", gflops},
         {"mfu", gflops / sgemm_gflops},
         {"ratio_vs_baseline", base_ms > 0 ? r.forward_backward.best_ms / base_ms : 0.0}});
  }
  return out;
}

void print_layers(const json& report, int reps) {
  fmt::print(
      "cemfrac bench layers: width {}, heads {}, d_ff {}, context {}, batch {}, on {}, {} "
      "threads, best of {} after a warm-up\nCPU {}; BLAS core {}\n\n",
      report["width"].get<int64_t>(), report["heads"].get<int64_t>(), report["d_ff"].get<int64_t>(),
      report["context"].get<int64_t>(), report["batch"].get<int64_t>(),
      report["device"].get<std::string>(), report["threads"].get<int>(), reps,
      report["cpu"].get<std::string>(), report["blas_core"].get<std::string>());
  fmt::print("{:<6} {:<18} {:<10} {:>10} {:>9} {:>10} {:>9} {:>8} {:>7}\n", "", "kind", "variant",
             "params", "fwd ms", "f+b ms", "f+b us/t", "x base", "MFU");
  for (const json& r : report["rows"]) {
    fmt::print("{:<6} {:<18} {:<10} {:>10} {:>9.2f} {:>10.2f} {:>9.2f} {:>8.2f} {:>6.1f}%\n",
               r["sublayer"].get<std::string>(), r["kind"].get<std::string>(),
               r["variant"].get<std::string>(), r["parameters"].get<int64_t>(),
               r["forward_ms"]["best"].get<double>(),
               r["forward_backward_ms"]["best"].get<double>(),
               r["forward_backward_us_per_token"].get<double>(),
               r["ratio_vs_baseline"].get<double>(), 100.0 * r["mfu"].get<double>());
  }
  fmt::print(
      "\nf+b = forward + backward (gradients of x and every parameter); us/t = microseconds per "
      "token;\nx base = f+b time / that of {} (mixers) or {} (FFNs) in this run; MFU = 3 x forward "
      "FLOPs "
      "(docs/flops.md) / f+b time / float32 matmul on {} {:.1f} GFLOP/s at {}^3 (this run)\n",
      kMixerBaseline, kFfnBaseline, report["device"].get<std::string>(),
      report["sgemm_gflops"]["best"].get<double>(), report["sgemm_gflops"]["n"].get<int>());
}

int run_layers(const LayersFlags& flags) {
  if (!flags.malloc_default) keep_heap();
  RunConfig base;
  base.model.d_model = flags.width;
  base.model.n_heads = std::max<int64_t>(1, flags.width / 64);
  base.model.d_ff = 4 * flags.width;
  base.model.context = flags.context;
  base.model.n_layers = 12;  // only scales the residual-projection init
  base = with_overrides(base, flags.sets);
  const std::vector<LayerJob> jobs = layer_jobs(flags.kinds);

  // Build every row's module first (same seed each), then time them all round-robin on one input.
  const torch::Device device = command_device(flags.device, "");
  CEMFRAC_CHECK(!device.is_meta(),
                "bench layers: the meta device computes nothing to time; use cpu or "
                "cuda");
  std::vector<std::unique_ptr<MixerContext>> contexts;
  std::vector<std::unique_ptr<RotaryEmbedding>> rotaries;
  std::vector<Subject> subjects = build_subjects(jobs, base, device, contexts, rotaries);
  if (!flags.json) {
    fmt::print(stderr, "  timing {} rows round-robin, {} rounds after a warm-up...\n",
               subjects.size(), flags.reps);
  }
  torch::manual_seed(2);
  const torch::Tensor x =
      torch::randn({flags.batch, base.model.context, base.model.d_model}).to(device);
  const torch::Tensor g = torch::randn_like(x);
  time_round_robin(subjects, x, g, flags.reps);

  std::vector<Row> rows;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Row row;
    row.sublayer = jobs[i].sublayer;
    row.kind = jobs[i].kind;
    row.variant = jobs[i].variant;
    row.params = count_params(*subjects[i].module);
    row.forward_flops_per_token = subjects[i].forward_flops_per_token;
    row.forward = summarize_times(subjects[i].forward_ms);
    row.forward_backward = summarize_times(subjects[i].forward_backward_ms);
    row.forward_backward_rounds = subjects[i].forward_backward_ms;
    rows.push_back(row);
  }
  const double tokens = static_cast<double>(flags.batch * base.model.context);
  const double geo = std::cbrt(tokens * double(base.model.d_model) * double(base.model.d_ff));
  const int n_sgemm =
      static_cast<int>(std::clamp<double>(std::round(geo / 64.0) * 64.0, 64.0, 2048.0));
  const double sgemm_gflops = measure_matmul_gflops(n_sgemm, 3, device, torch::kFloat32);
  const json report = {{"bench", "layers"},
                       {"device", device.str()},
                       {"cpu", read_cpu_features().model_name},
                       {"blas_core", blas_status().core},
                       {"threads", at::get_num_threads()},
                       {"width", base.model.d_model},
                       {"heads", base.model.n_heads},
                       {"d_ff", base.model.d_ff},
                       {"context", base.model.context},
                       {"batch", flags.batch},
                       {"reps", flags.reps},
                       {"sgemm_gflops", {{"n", n_sgemm}, {"best", sgemm_gflops}}},
                       {"rows", layer_rows(rows, tokens, sgemm_gflops)}};
  if (flags.json)
    fmt::print("{}\n", report.dump(2));
  else
    print_layers(report, flags.reps);
  return 0;
}

}  // namespace

Command add_bench_layers(CLI::App& bench, const GlobalOptions& global) {
  // --threads and --blas-core are applied in main() before any command runs; --device here.
  auto flags = std::make_shared<LayersFlags>();
  CLI::App* app = bench.add_subcommand("layers",
                                       "Forward and forward+backward time of every mixer and FFN "
                                       "kind, against MHA and the GELU MLP");
  app->add_flag("--json", flags->json, "Print one JSON object");
  app->add_option("--width", flags->width, "Model width D (heads = D / 64, d_ff = 4 D)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 16));
  app->add_option("--context", flags->context, "Sequence length N")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app->add_option("--batch", flags->batch, "Sequences per call")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app->add_option("--reps", flags->reps,
                  "Timed rounds after one warm-up (each round runs every row once)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app->add_option("--kinds", flags->kinds,
                  "Only these kinds (comma-separated; the baselines always run)");
  app->add_option("--set", flags->sets,
                  "Override a model field for every row: model.key=value (repeatable), e.g. "
                  "--set model.n_heads=4");
  app->add_flag("--malloc-default", flags->malloc_default,
                "Leave glibc malloc as configured (large tensors then come from fresh mmaps)");
  return {app, [flags, &global] {
            flags->device = global.device;
            return run_layers(*flags);
          }};
}

}  // namespace cemfrac::cli

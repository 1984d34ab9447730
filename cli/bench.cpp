// cemfrac bench: speed measured against references in the same run (DESIGN.md §6).
//
//   cemfrac [--device cpu|cuda] bench ladder [--json] [--depths 1,2,4,6,8] [--ladders 1048576]
//       [--width 1024] [--reps N] [--peer | --no-peer] [--isa auto|baseline|avx2]
//
// Each area is one sub-subcommand registered in add_bench() (`ladder` here; `train` in
// bench_train.cpp, `layers` in bench_layers.cpp, `generate` in bench_generate.cpp), so a new one is
// one add_bench_* function. Every area runs on the global --device or refuses it in one line (the
// meta device computes nothing to time).
//
// `ladder` times the continued-fraction ladder function f = K_{d-1}/K̂_d (cemfrac/ops/continuant.h)
// over --ladders ladders laid out (rows, d, width), forward (inference: no reciprocal cached) and
// forward+backward (autograd::grad with a random upstream gradient), for
//   fused      the fused kernel of the device (CPU or CUDA) behind the custom autograd Function;
//   kernel     the same kernels writing into preallocated tensors (no allocation, no autograd);
//   reference  the pure-ATen twin differentiated by autograd;
//   literal    the nested fraction with d guarded reciprocals ("CoFrGeNet-B"), autograd;
//   peer       bench/peers/ladder_peer.py under the build's interpreter (cli/peer_util.h), same
//              shapes and threads, on the CPU only: a PyTorch custom autograd Function of the same
//              math, autograd through the continuant recurrence, and the literal ladder.
// The floor is the bytes that must move (forward: a in, f out; forward+backward: a in twice, f out,
// upstream gradient in, grad a out) over the copy bandwidth measured in the same run (a tensor copy
// of 2x the largest a on the device, so on CUDA the HBM's; bytes counted once read + once written,
// as STREAM does). Every implementation is checked against the reference once before it is timed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/utils.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/continuant.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cli/peer_util.h"

namespace cemfrac::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Max relative difference over elements (denominator floored at 1e-6 of the largest magnitude).
double max_rel_diff(const at::Tensor& x, const at::Tensor& y) {
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor yd = y.to(at::kDouble);
  const double scale = std::max(yd.abs().max().item<double>(), 1e-300);
  return ((xd - yd).abs() / yd.abs().clamp_min(scale * 1e-6)).max().item<double>();
}

struct LadderFlags {
  bool json = false;
  std::string depths = "1,2,4,6,8";
  int64_t ladders = int64_t{1} << 20;
  int64_t width = 1024;
  int reps = 5;
  bool peer = false;
  bool no_peer = false;
  std::string peer_script;
  std::string isa = "auto";
  bool malloc_default = false;
  std::string device;  // the global --device ("" = cpu)
};

// glibc serves every allocation above 32 MiB (and, before its threshold adapts, above 128 KiB) with
// a fresh mmap, so each call that allocates such a tensor pays a page fault per 4 KiB page (the
// kernel zeroes it): at 2^20 ladders, d = 8, the 32 MiB gradient alone costs tens of ms on a VM,
// more than the kernel. A training process keeps its heap; we do the same here for every
// implementation, the peer included (through glibc's environment variables): no mmap for large
// blocks, no trimming of the heap.
constexpr const char* kPeerMallocEnv = "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295 ";

// Copy bandwidth on the device (on CUDA, the HBM's): a float tensor of `elems`, copied into a
// preallocated one.
double measure_copy_gbs(int64_t elems, int reps, const c10::Device& device) {
  const auto on_device = at::TensorOptions().device(device);
  at::Tensor src = at::rand({elems}, on_device);
  at::Tensor dst = at::empty_like(src);
  const Timing t = time_it([&] { dst.copy_(src); }, std::max(reps, 5), device);
  return 2.0 * elems * 4 / (t.best_ms * 1e-3) / 1e9;
}

// The Python peer, once for all depths (it prints JSON); null when it does not run, with the
// reason in `note` when it was skipped rather than refused.
nlohmann::json run_ladder_peer(const LadderFlags& flags, const c10::Device& device, int64_t n,
                               int threads, std::string& note) {
  bool want_peer = flags.peer;
  CEMFRAC_CHECK(!(flags.peer && !device.is_cpu()),
                "--peer: the ladder peer runs on the CPU only; drop --peer with --device {}",
                device.str());
  if (!device.is_cpu()) {
    note =
        fmt::format("peer skipped: the ladder peer runs on the CPU only, not on {}", device.str());
    return nullptr;
  }
  if (!flags.peer && !flags.no_peer) {
    want_peer = python_with_torch() &&
                locate_peer(flags.peer_script, "bench/peers/ladder_peer.py").has_value();
    if (!want_peer)
      note = fmt::format("peer skipped: no {} with torch or no bench/peers/ladder_peer.py",
                         kPeerPython);
  }
  if (!want_peer) return nullptr;
  CEMFRAC_CHECK(python_with_torch(), "--peer needs {} with torch (Debian: python3-torch)",
                kPeerPython);
  const auto script = locate_peer(flags.peer_script, "bench/peers/ladder_peer.py");
  CEMFRAC_CHECK(script.has_value(),
                "--peer: bench/peers/ladder_peer.py not found; run from the source tree, set "
                "CEMFRAC_SOURCE_DIR or pass --peer-script");
  const std::string cmd = fmt::format(
      "{}{} {} --depths {} --ladders {} --width {} --reps {} --threads {}",
      flags.malloc_default ? "" : kPeerMallocEnv, kPeerPython, quote_for_shell(script->string()),
      flags.depths, n, flags.width, flags.reps, threads);
  if (!flags.json) fmt::print(stderr, "running the peer: {}\n", cmd);
  return nlohmann::json::parse(capture_stdout(cmd, "the ladder peer"));
}

// One depth: the fused op and its raw kernels checked against the reference on the same inputs,
// then every implementation timed, forward and forward + backward, beside the bytes floor.
// The ladder kernels alone (no dispatcher, no autograd), into preallocated tensors: forward with
// the cached reciprocal, then backward; on the CPU or, in a CUDA build, the GPU.
struct RawLadderKernels {
  RawLadderKernels(const at::Tensor& a_, const at::Tensor& g_, const c10::Device& device_)
      : a(a_), g(g_), device(device_), f(at::empty_like(g_)), r(at::empty_like(g_)),
        grad_a(at::empty_like(a_)) {}

  void forward() {
#ifdef CEMFRAC_WITH_CUDA
    if (device.is_cuda()) {
      kernels::continuant_forward_cuda(a, 0.01, f, at::Tensor(), at::Tensor());
      return;
    }
#endif
    kernels::continuant_forward_cpu(a, 0.01, f, at::Tensor(), at::Tensor());
  }
  void forward_backward() {
#ifdef CEMFRAC_WITH_CUDA
    if (device.is_cuda()) {
      kernels::continuant_forward_cuda(a, 0.01, f, r, at::Tensor());
      kernels::continuant_backward_cuda(a, r, at::Tensor(), g, 0.01, false, grad_a);
      return;
    }
#endif
    kernels::continuant_forward_cpu(a, 0.01, f, r, at::Tensor());
    kernels::continuant_backward_cpu(a, r, at::Tensor(), g, 0.01, false, grad_a);
  }

  const at::Tensor& a;
  const at::Tensor& g;
  c10::Device device;
  at::Tensor f, r, grad_a;
};

nlohmann::json ladder_depth_row(const LadderFlags& flags, int64_t d, int64_t rows,
                                const c10::Device& device, double copy_gbs,
                                const nlohmann::json& peer) {
  const int64_t n = rows * flags.width;
  torch::manual_seed(0);
  // Drawn on the CPU and moved, so every device times the same numbers.
  const at::Tensor a = (at::rand({rows, d, flags.width}) * 6 - 3).to(device);  // U(-3, 3)
  const at::Tensor g = (at::rand({rows, flags.width}) * 2 - 1).to(device);
  const auto fused = ContinuantOptions();
  const auto reference = ContinuantOptions().impl(ContinuantImpl::kReference);
  const auto literal = ContinuantOptions().impl(ContinuantImpl::kLiteral);
  auto forward = [&](const ContinuantOptions& o) {
    return [&a, o] {
      at::NoGradGuard no_grad;
      return continuant(a, o);
    };
  };
  auto forward_backward = [&](const ContinuantOptions& o) {
    return [&a, &g, o] {
      at::Tensor x = a.detach().requires_grad_(true);
      at::Tensor f = continuant(x, o);
      return torch::autograd::grad({f}, {x}, {g})[0];
    };
  };
  RawLadderKernels k(a, g, device);
  auto kernel_forward = [&k] { k.forward(); };
  auto kernel_forward_backward = [&k] { k.forward_backward(); };

  // Check before timing: fused (op and raw kernels) against the reference on these inputs.
  {
    const at::Tensor f_ref = forward(reference)();
    const at::Tensor g_ref = forward_backward(reference)();
    const double e_f = max_rel_diff(forward(fused)(), f_ref);
    const double e_g = max_rel_diff(forward_backward(fused)(), g_ref);
    kernel_forward_backward();
    const double e_k = std::max(max_rel_diff(k.f, f_ref), max_rel_diff(k.grad_a, g_ref));
    CEMFRAC_CHECK(e_f <= 1e-6 && e_g <= 1e-6 && e_k <= 1e-6,
                  "ladder check failed at d={}: fused vs reference max rel. diff f {:.2e}, grad "
                  "{:.2e}, kernel {:.2e}",
                  d, e_f, e_g, e_k);
  }

  const double bytes_fwd = 4.0 * (d + 1) * n;     // a in, f out
  const double bytes_fb = 4.0 * (3 * d + 2) * n;  // + a in again, g in, grad a out
  nlohmann::json row = {{"depth", d},
                        {"floor_forward_ms", bytes_fwd / (copy_gbs * 1e9) * 1e3},
                        {"floor_forward_backward_ms", bytes_fb / (copy_gbs * 1e9) * 1e3},
                        {"bytes_forward", bytes_fwd},
                        {"bytes_forward_backward", bytes_fb}};
  auto record = [&](const std::string& name, const Timing& fwd, const Timing& fb) {
    row[name] = {{"forward", {{"best_ms", fwd.best_ms}, {"median_ms", fwd.median_ms}}},
                 {"forward_backward", {{"best_ms", fb.best_ms}, {"median_ms", fb.median_ms}}}};
  };
  record("fused", time_it(forward(fused), flags.reps, device),
         time_it(forward_backward(fused), flags.reps, device));
  record("kernel", time_it(kernel_forward, flags.reps, device),
         time_it(kernel_forward_backward, flags.reps, device));
  record("reference", time_it(forward(reference), flags.reps, device),
         time_it(forward_backward(reference), flags.reps, device));
  record("literal", time_it(forward(literal), flags.reps, device),
         time_it(forward_backward(literal), flags.reps, device));
  if (!peer.is_null()) {
    for (const auto& p : peer["results"]) {
      if (p["depth"].get<int64_t>() != d) continue;
      for (const char* name : {"custom_function", "autograd", "literal"})
        row["peer_" + std::string(name)] = p[name];
    }
  }
  return row;
}

double best_ms(const nlohmann::json& row, const std::string& impl, const char* pass) {
  return row.contains(impl) ? row[impl][pass]["best_ms"].get<double>() : 0.0;
}

// The report as text: the two tables, forward and forward + backward.
void print_ladder(const LadderFlags& flags, const nlohmann::json& report,
                  const std::string& peer_note) {
  const nlohmann::json& peer = report.contains("peer") ? report["peer"] : nlohmann::json();
  fmt::print(
      "ladder bench: {} ladders = {} rows x {} (float32) on {}, {} threads, ISA {}, best of {} "
      "(medians in --json)\n",
      report["ladders"].get<int64_t>(), report["rows"].get<int64_t>(), flags.width,
      report["device"].get<std::string>(), report["threads"].get<int>(),
      report["isa"].get<std::string>(), flags.reps);
  fmt::print("CPU {}; copy bandwidth on {} {:.1f} GB/s (measured now); malloc: {}\n",
             report["cpu"].get<std::string>(), report["device"].get<std::string>(),
             report["copy_gbs"].get<double>(), report["malloc"].get<std::string>());
  if (!peer.is_null()) {
    fmt::print("peer: Python {} + torch {}, {} threads\n", peer["python"].get<std::string>(),
               peer["torch"].get<std::string>(), peer["threads"].get<int>());
  } else if (!peer_note.empty()) {
    fmt::print("{}\n", peer_note);
  }
  fmt::print("\nforward (inference)\n");
  fmt::print("{:>3} {:>9} {:>7} {:>7} {:>9} {:>10} {:>9} {:>9}\n", "d", "fused ms", "GB/s",
             "xfloor", "kernel ms", "ref ms (x)", "lit (x)", "peer (x)");
  for (const auto& row : report["results"]) {
    const double t = best_ms(row, "fused", "forward");
    const double floor = row["floor_forward_ms"].get<double>();
    const double peer_t = best_ms(row, "peer_custom_function", "forward");
    fmt::print("{:>3} {:>9.2f} {:>7.1f} {:>7.2f} {:>9.2f} {:>10.1f} {:>9.1f} {:>9}\n",
               row["depth"].get<int64_t>(), t, row["bytes_forward"].get<double>() / (t * 1e6),
               t / floor, best_ms(row, "kernel", "forward"),
               best_ms(row, "reference", "forward") / t, best_ms(row, "literal", "forward") / t,
               peer_t > 0 ? fmt::format("{:.1f}", peer_t / t) : std::string("-"));
  }
  fmt::print("\nforward + backward\n");
  fmt::print("{:>3} {:>9} {:>7} {:>7} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}\n", "d", "fused ms",
             "GB/s", "xfloor", "kernel ms", "ref ms (x)", "lit (x)", "peerF (x)", "peerA (x)",
             "peerL (x)");
  for (const auto& row : report["results"]) {
    const double t = best_ms(row, "fused", "forward_backward");
    const double floor = row["floor_forward_backward_ms"].get<double>();
    auto ratio = [&](const std::string& impl) {
      const double v = best_ms(row, impl, "forward_backward");
      return v > 0 ? fmt::format("{:.1f}", v / t) : std::string("-");
    };
    fmt::print("{:>3} {:>9.2f} {:>7.1f} {:>7.2f} {:>9.2f} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
               row["depth"].get<int64_t>(), t,
               row["bytes_forward_backward"].get<double>() / (t * 1e6), t / floor,
               best_ms(row, "kernel", "forward_backward"), ratio("reference"), ratio("literal"),
               ratio("peer_custom_function"), ratio("peer_autograd"), ratio("peer_literal"));
  }
  fmt::print(
      "\n(x) = that implementation's time / fused time; xfloor = fused time / (bytes that must "
      "move / copy bandwidth);\npeerF/peerA/peerL = Python custom autograd Function / autograd "
      "through the continuant ops / literal ladder\n");
}

int run_ladder(const LadderFlags& flags) {
  CEMFRAC_CHECK(flags.width >= 1 && flags.ladders >= flags.width,
                "--ladders ({}) must be >= --width ({}) >= 1", flags.ladders, flags.width);
  CEMFRAC_CHECK(flags.reps >= 1, "--reps must be >= 1");
  const std::vector<int64_t> depths =
      parse_int_list(flags.depths, "--depths", "a ladder depth", "1,2,4,6,8");
  const c10::Device device = command_device(flags.device, "");
  CEMFRAC_CHECK(!device.is_meta(),
                "bench ladder: the meta device computes nothing to time; use cpu or "
                "cuda");
  kernels::set_continuant_cpu_isa(flags.isa);
  if (!flags.malloc_default) keep_heap();
  const int64_t rows = flags.ladders / flags.width;
  const int64_t n = rows * flags.width;  // ladders actually timed
  const int64_t max_depth = *std::max_element(depths.begin(), depths.end());
  const int threads = at::get_num_threads();
  const double copy_gbs = measure_copy_gbs(2 * rows * max_depth * flags.width, flags.reps, device);
  std::string peer_note;
  const nlohmann::json peer = run_ladder_peer(flags, device, n, threads, peer_note);
  nlohmann::json results = nlohmann::json::array();
  for (const int64_t d : depths)
    results.push_back(ladder_depth_row(flags, d, rows, device, copy_gbs, peer));
  nlohmann::json report = {
      {"bench", "ladder"},
      {"device", device.str()},
      {"cpu", read_cpu_features().model_name},
      {"threads", threads},
      {"isa", kernels::continuant_cpu_isa()},
      {"blas_core", blas_status().core},
      {"ladders", n},
      {"rows", rows},
      {"width", flags.width},
      {"reps", flags.reps},
      {"dtype", "float32"},
      {"malloc", flags.malloc_default ? "glibc default" : "heap kept (no mmap, no trim)"},
      {"copy_gbs", copy_gbs},
      {"results", results},
  };
  if (!peer.is_null()) {
    report["peer"] = {
        {"python", peer["python"]}, {"torch", peer["torch"]}, {"threads", peer["threads"]}};
  }
  if (flags.json)
    fmt::print("{}\n", report.dump(2));
  else
    print_ladder(flags, report, peer_note);
  return 0;
}

Command add_bench_ladder(CLI::App& bench, const GlobalOptions& global) {
  auto flags = std::make_shared<LadderFlags>();
  CLI::App* app = bench.add_subcommand(
      "ladder",
      "Continued-fraction ladder kernels: fused vs ATen reference, literal ladder, floor, peer");
  app->add_flag("--json", flags->json, "Print one JSON object (best and median times)");
  app->add_option("--depths", flags->depths, "Ladder depths, comma-separated")
      ->capture_default_str();
  app->add_option("--ladders", flags->ladders, "Ladders in total (rows x width)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--width", flags->width, "Ladders per row")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--reps", flags->reps, "Timed repetitions after one warm-up")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app->add_flag(
      "--peer", flags->peer,
      "Run the Python peer (bench/peers/ladder_peer.py under " CEMFRAC_PEER_PYTHON
      ", the build's interpreter); default: on when it imports torch");
  app->add_flag("--no-peer", flags->no_peer, "Do not run the Python peer");
  app->add_option("--peer-script", flags->peer_script,
                  "Path of ladder_peer.py (default: found in the source tree)");
  app->add_flag("--malloc-default", flags->malloc_default,
                "Leave glibc malloc as configured (large tensors then come from fresh mmaps: page "
                "faults inside every timed call)");
  app->add_option("--isa", flags->isa,
                  "Ladder kernel instruction set: auto, baseline (SSE2) or avx2")
      ->capture_default_str();
  return {app, [flags, &global] {
            flags->device = global.device;
            return run_ladder(*flags);
          }};
}

}  // namespace

Command add_bench(CLI::App& root, const GlobalOptions& global) {
  CLI::App* app = root.add_subcommand("bench", "Speed against references measured in the same run");
  app->require_subcommand(1);
  // One entry per benchmark area.
  std::vector<Command> areas = {add_bench_ladder(*app, global), add_bench_train(*app, global),
                                add_bench_layers(*app, global), add_bench_generate(*app, global)};
  auto run = [areas] {
    for (const auto& area : areas) {
      if (area.app->parsed()) return area.run();
    }
    fail("cemfrac bench needs an area (see cemfrac bench --help)");
  };
  return {app, run};
}

}  // namespace cemfrac::cli

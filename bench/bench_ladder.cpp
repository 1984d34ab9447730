// Google Benchmark for the continued-fraction ladder: the fused op against the ATen
// reference and the literal ladder, forward and forward+backward, args = rows x ladder_depth x
// n_ladders. Bytes reported are the bytes that must move (forward: a in, f out; forward+backward: a
// in twice, f out, upstream gradient in, grad a out), so bytes_per_second compares directly with a
// copy. The same measurements, with the copy bandwidth, the floor and the Python peer in one table:
// `cemfrac bench ladder`.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <cstdio>
#include <limits>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/continuant.h"

namespace {

using cemfrac::ContinuantImpl;
using cemfrac::ContinuantOptions;

struct Inputs {
  at::Tensor a;  // (rows, d, L)
  at::Tensor g;  // (rows, L)
};

Inputs make_inputs(const benchmark::State& state) {
  torch::manual_seed(0);
  const int64_t rows = state.range(0), d = state.range(1), L = state.range(2);
  return {at::rand({rows, d, L}) * 6 - 3, at::rand({rows, L}) * 2 - 1};
}

void set_counters(benchmark::State& state, bool backward) {
  const int64_t rows = state.range(0), d = state.range(1), L = state.range(2);
  const int64_t ladders = rows * L;
  state.SetItemsProcessed(state.iterations() * ladders);
  state.SetBytesProcessed(state.iterations() * ladders * 4 * (backward ? 3 * d + 2 : d + 1));
}

void BM_Continuant_Forward(benchmark::State& state, ContinuantImpl impl) {
  const Inputs in = make_inputs(state);
  const auto options = ContinuantOptions().impl(impl);
  at::NoGradGuard no_grad;
  for (auto _ : state) benchmark::DoNotOptimize(cemfrac::continuant(in.a, options));
  set_counters(state, false);
}

void BM_Continuant_ForwardBackward(benchmark::State& state, ContinuantImpl impl) {
  const Inputs in = make_inputs(state);
  const auto options = ContinuantOptions().impl(impl);
  for (auto _ : state) {
    at::Tensor x = in.a.detach().requires_grad_(true);
    at::Tensor f = cemfrac::continuant(x, options);
    benchmark::DoNotOptimize(torch::autograd::grad({f}, {x}, {in.g}));
  }
  set_counters(state, true);
}

// The raw kernels into preallocated tensors (no allocation, no autograd).
void BM_Continuant_ForwardBackward_Kernel(benchmark::State& state) {
  const Inputs in = make_inputs(state);
  at::Tensor f = at::empty_like(in.g), r = at::empty_like(in.g), grad = at::empty_like(in.a);
  for (auto _ : state) {
    cemfrac::kernels::continuant_forward_cpu(in.a, 0.01, f, r, at::Tensor());
    cemfrac::kernels::continuant_backward_cpu(in.a, r, at::Tensor(), in.g, 0.01, false, grad);
    benchmark::DoNotOptimize(grad.data_ptr());
  }
  set_counters(state, true);
}

void ladder_args(benchmark::internal::Benchmark* b) {
  // 2^20 ladders (the paper-sized case) at each depth, plus a small L2-resident case.
  for (int64_t d : {1, 2, 4, 6, 8}) b->Args({1024, d, 1024});
  b->Args({16, 8, 1031});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_Continuant_Forward, Cpu, ContinuantImpl::kFused)->Apply(ladder_args);
BENCHMARK_CAPTURE(BM_Continuant_Forward, Reference, ContinuantImpl::kReference)->Apply(ladder_args);
BENCHMARK_CAPTURE(BM_Continuant_Forward, Literal, ContinuantImpl::kLiteral)->Apply(ladder_args);
BENCHMARK_CAPTURE(BM_Continuant_ForwardBackward, Cpu, ContinuantImpl::kFused)->Apply(ladder_args);
BENCHMARK(BM_Continuant_ForwardBackward_Kernel)->Apply(ladder_args);
BENCHMARK_CAPTURE(BM_Continuant_ForwardBackward, Reference, ContinuantImpl::kReference)
    ->Apply(ladder_args);
BENCHMARK_CAPTURE(BM_Continuant_ForwardBackward, Literal, ContinuantImpl::kLiteral)
    ->Apply(ladder_args);

// Check before timing: fused forward and gradient against the reference on one input.
bool validate() {
  torch::manual_seed(1);
  const at::Tensor a = at::rand({8, 6, 1031}) * 6 - 3;
  const at::Tensor g = at::rand({8, 1031}) * 2 - 1;
  auto run = [&](ContinuantImpl impl) {
    at::Tensor x = a.detach().requires_grad_(true);
    at::Tensor f = cemfrac::continuant(x, ContinuantOptions().impl(impl));
    return std::make_pair(f.detach(), torch::autograd::grad({f}, {x}, {g})[0]);
  };
  const auto fused = run(ContinuantImpl::kFused);
  const auto ref = run(ContinuantImpl::kReference);
  return at::allclose(fused.first, ref.first, 1e-6, 0) &&
         at::allclose(fused.second, ref.second, 1e-6, 1e-12);
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed blocks in the heap (see cli/bench.cpp): otherwise every 32 MiB tensor is a fresh
  // mmap and the page faults dominate.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  std::printf("bench_ladder: %d threads, ladder ISA %s, float32, ATen CPU_CAPABILITY_AVX2 %s\n",
              at::get_num_threads(), cemfrac::kernels::continuant_cpu_isa().c_str(),
#ifdef CPU_CAPABILITY_AVX2
              "on"
#else
              "off (generic at::vec; the ladder loops use their own runtime-dispatched AVX2 clone)"
#endif
  );
  if (!validate()) {
    std::fprintf(stderr, "bench_ladder: fused ladder differs from the reference; not timing\n");
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Tokenizer encode throughput on the Brown corpus (500 documents, ~6 MB of English), in bytes of
// text per second. Encode_Gpt2 runs with the word cache warm (the steady state when preparing
// data); Encode_Gpt2Cold starts every iteration from a fresh tokenizer (construction not timed).
// Every tokenizer is checked to round-trip the whole corpus before anything is timed.
//   ./build/bench/bench_tokenizer [--benchmark_filter=Gpt2]
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cemfrac/data/brown.h"
#include "cemfrac/data/byte_tokenizer.h"
#include "cemfrac/data/gpt2_tokenizer.h"

namespace {

using cemfrac::Document;
using cemfrac::Tokenizer;

// Set up in main; never destroyed (no static objects with destructors).
const std::vector<Document>* g_brown = nullptr;
const Tokenizer* g_gpt2 = nullptr;
const Tokenizer* g_byte = nullptr;
int64_t g_brown_bytes = 0;

void validate(const Tokenizer& tokenizer) {
  for (const auto& doc : *g_brown) {
    if (tokenizer.decode(tokenizer.encode(doc.text)) != doc.text) {
      std::fprintf(stderr, "bench_tokenizer: %s does not round-trip document %s\n",
                   tokenizer.id().c_str(), doc.name.c_str());
      std::abort();
    }
  }
}

void encode_corpus(benchmark::State& state, const Tokenizer& tokenizer) {
  int64_t tokens = 0;
  for (const auto& doc : *g_brown) {
    const auto ids = tokenizer.encode(doc.text);
    tokens += static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes_per_token"] = static_cast<double>(g_brown_bytes) / tokens;
}

void BM_Tokenizer_Encode_Gpt2(benchmark::State& state) {
  for (auto _ : state) encode_corpus(state, *g_gpt2);
  state.SetBytesProcessed(state.iterations() * g_brown_bytes);
}
BENCHMARK(BM_Tokenizer_Encode_Gpt2)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Tokenizer_Encode_Gpt2Cold(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    auto fresh = cemfrac::Gpt2Tokenizer::from_cache();
    state.ResumeTiming();
    encode_corpus(state, *fresh);
    state.PauseTiming();  // nor is the destructor
    fresh.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * g_brown_bytes);
}
BENCHMARK(BM_Tokenizer_Encode_Gpt2Cold)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Tokenizer_Encode_Byte(benchmark::State& state) {
  for (auto _ : state) encode_corpus(state, *g_byte);
  state.SetBytesProcessed(state.iterations() * g_brown_bytes);
}
BENCHMARK(BM_Tokenizer_Encode_Byte)->Unit(benchmark::kMillisecond);

void BM_Tokenizer_Decode_Gpt2(benchmark::State& state) {
  std::vector<std::vector<cemfrac::TokenId>> ids;
  for (const auto& doc : *g_brown) ids.push_back(g_gpt2->encode(doc.text));
  for (auto _ : state)
    for (const auto& doc_ids : ids) benchmark::DoNotOptimize(g_gpt2->decode(doc_ids).data());
  state.SetBytesProcessed(state.iterations() * g_brown_bytes);
}
BENCHMARK(BM_Tokenizer_Decode_Gpt2)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    g_brown = new std::vector<Document>(cemfrac::read_brown_corpus());
    for (const auto& doc : *g_brown) g_brown_bytes += static_cast<int64_t>(doc.text.size());
    const auto* gpt2 = cemfrac::Gpt2Tokenizer::from_cache().release();
    g_gpt2 = gpt2;
    g_byte = new cemfrac::ByteTokenizer();
    std::printf(
        "bench_tokenizer: Brown corpus %zu documents, %.2f MB; encode is single-threaded; "
        "PCRE2 JIT %s; hardware threads %u; build %s\n",
        g_brown->size(), g_brown_bytes / 1e6, gpt2->pretokenizer().jit() ? "on" : "OFF",
        std::thread::hardware_concurrency(),
#ifdef NDEBUG
        "release"
#else
        "debug"
#endif
    );
    validate(*g_gpt2);
    validate(*g_byte);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// What the shard check of `train` and `eval` costs (open_token_shard, docs/formats.md): the header
// checks plus the full scan (every id below the vocabulary, then the token CRC-32), per shard, with
// the file in the page cache (a cold first read is bounded by the disk instead). Also the two
// passes alone, so either can be attributed.
//   ./build/bench/bench_shard_check                       data/brown/{train,val,test}.bin
//   CEMFRAC_SHARDS=a.bin:b.bin ./build/bench/bench_shard_check
//   CEMFRAC_SYNTHETIC_MB=1024 ./build/bench/bench_shard_check   also a synthetic 1 GB uint16 shard
// Rates are bytes of token data per second.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/data/shard.h"

namespace {
namespace fs = std::filesystem;
using cemfrac::ShardReader;

void open_and_check(benchmark::State& state, const std::string& path) {
  cemfrac::ShardCheck check;  // header + full scan (no tokenizer: its identity check is O(1))
  for (auto _ : state) benchmark::DoNotOptimize(cemfrac::open_token_shard(path, check));
  const ShardReader reader(path);
  state.SetBytesProcessed(
      state.iterations() *
      static_cast<int64_t>(reader.size() * static_cast<uint64_t>(reader.dtype())));
  state.counters["MB"] =
      static_cast<double>(reader.size() * static_cast<uint64_t>(reader.dtype())) / 1e6;
}

void crc_only(benchmark::State& state, const std::string& path) {
  const ShardReader reader(path);
  const size_t bytes = reader.size() * static_cast<size_t>(reader.dtype());
  for (auto _ : state) benchmark::DoNotOptimize(cemfrac::crc32_update(0, reader.data(), bytes));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

// A synthetic shard of `mb` MB of uint16 tokens (documents of 1000 pseudo-random ids < 50000).
std::string make_synthetic(int64_t mb) {
  const std::string dir = (fs::temp_directory_path() / "cemfrac-bench-shard").string();
  fs::create_directories(dir);
  const std::string path = fmt::format("{}/synthetic-{}mb.bin", dir, mb);
  if (fs::exists(path)) return path;
  const int64_t tokens = mb * 1000 * 1000 / 2;
  cemfrac::write_shard(path, {50000, 49999, "synthetic"}, [&](cemfrac::ShardSink& sink) {
    std::vector<cemfrac::TokenId> doc(999);
    uint32_t x = 1;
    for (int64_t written = 0; written + 1000 <= tokens; written += 1000) {
      for (auto& id : doc)
        id = static_cast<cemfrac::TokenId>((x = x * 1664525u + 1013904223u) % 49999u);
      sink.append_document(doc);
    }
  });
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("CEMFRAC_SHARDS")) {
    std::stringstream list(env);
    for (std::string p; std::getline(list, p, ':');)
      if (!p.empty()) paths.push_back(p);
  } else {
    for (const char* split : {"train", "val", "test"}) {
      const std::string p = fmt::format("data/brown/{}.bin", split);
      if (fs::exists(p)) paths.push_back(p);
    }
  }
  if (const char* mb = std::getenv("CEMFRAC_SYNTHETIC_MB"))
    paths.push_back(make_synthetic(std::atoll(mb)));
  if (paths.empty()) {
    fmt::print(stderr,
               "bench_shard_check: no shards (run cemfrac prepare --out data/brown, or set "
               "CEMFRAC_SHARDS / CEMFRAC_SYNTHETIC_MB)\n");
    return 1;
  }
  for (const std::string& path : paths) {
    benchmark::RegisterBenchmark(("OpenAndCheck/" + path).c_str(), open_and_check, path)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("Crc32Only/" + path).c_str(), crc_only, path)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

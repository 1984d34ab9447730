// cemfrac bench generate: prefill and decode speed of greedy generation, through the
// library's batched path (generate_batch, what `cemfrac generate --prompts` runs), against a
// PyTorch eager peer with a KV cache in the same run.
//
//   cemfrac bench generate (--config C | --checkpoint DIR) [--set k=v]... [--kinds LIST]
//                          [--batches 1,8] [--prompt-len 128] [--new-tokens 128] [--reps 3]
//                          [--json] [--peer | --no-peer] [--peer-script FILE]
//
// Each row is a model: the config's own (or the checkpoint's), or with --kinds one per item, the
// config with every layer's mixer set to the item's kind (`cem_attention:cem.steps=2` adds model
// overrides after the kind, ':'-separated; `all` = every mixer kind plus cem_attention at T = 2).
// Weights: random from train.seed (speed does not depend on them) or the checkpoint's. Prompts:
// --prompt-len random ids per row of the largest batch (seed 0), the first B rows for batch B.
// Per (row, batch): one untimed generation (it also measures memory), then --reps timed ones, each
// --new-tokens greedy tokens without an end-of-text stop; medians of the reps:
//   prefill tokens/s = B x prompt-len / the first forward's time;
//   decode tokens/s  = B x (new-tokens - 1) / the time after it (sampling and new-tokens - 1
//                      forwards of one position: the first new token comes from the prefill).
// Memory, in the untimed generation: peak tensor bytes = the largest sum of live tensor memory
// allocated during it, read from LibTorch's CPU allocator reports (the hook its memory profiler
// uses; the weights and anything alive before do not count), and cache bytes = the decode state's
// caches at the end (MixerState::cache_bytes: preallocated to the context, so independent of the
// lengths). Bandwidth limit: one decode step reads every weight (all parameters but the embedding
// rows, the head included) once, so at batch B decoding runs at most about B x the copy bandwidth
// measured in the run / those bytes tokens/s; decode_fraction_of_limit says how close it comes (at
// batch 1 a float32 model is memory-bound, on both sides). The peer (bench/peers/decode_peer.py
// under the build's interpreter) models mha rows (llama and gpt2 flavours); it runs after cemfrac's rows
// from the same weights and prompts, and its numbers are quoted only when its logits of the prompt
// and of the first decoded position agree with cemfrac's (kPeerLogitRtol); its greedy tokens are
// compared too and reported.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
#include "cemfrac/layers/registry.h"
#include "cemfrac/model/generate.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/run_config.h"
#include "cli/bench_util.h"
#include "cli/build_info.h"
#include "cli/commands.h"
#include "cemfrac/core/device.h"
#include "cli/peer_util.h"

namespace cemfrac::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPython = kPeerPython;
constexpr const char* kPeerRelPath = "bench/peers/decode_peer.py";
constexpr double kTargetDecodeRatio = 3.0;  // the target: decode at batch 1 >= 3x the peer
// The peer's logits (last prompt position and first decoded position, every row of the largest
// batch) must be within kPeerLogitRtol x the largest |logit| of cemfrac's. Both compute the same
// float32 function in another op order (fused vs explicit attention, other GEMM shapes): each
// reordered reduction of n <= a few thousand terms moves a value by ~sqrt(n) u (u = 6e-8, ~1e-6
// relative), compounded over 2L + 1 sub-layers; 1e-4 leaves that room, while a wrong mask, rotation
// or cache offset moves logits by a sizeable fraction of their scale. Observed (2026-12-01, this
// project's 2-core VM): tiny-llama and tiny-gpt2 at most 2.7e-7 of the largest |logit|,
// small-llama 9e-7 (1.4e-6 of 1.6), two orders of magnitude inside.
constexpr double kPeerLogitRtol = 1e-4;
constexpr const char* kKeepHeapEnv = "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295 ";

struct GenerateBenchFlags {
  std::string config, checkpoint;
  std::vector<std::string> sets;
  std::string kinds;
  std::string batches = "1,8";
  int64_t prompt_len = 128;
  int64_t new_tokens = 128;
  int reps = 3;
  bool json = false;
  bool peer = false;
  bool no_peer = false;
  std::string peer_script;
  bool malloc_default = false;
  bool peer_keep_heap = false;
  std::string device;  // the global --device ("" = cpu)
};

// Tensor memory live now and at most, from the CPU allocator's reports (alloc_size < 0: a free).
// Installed as the thread's profiler-state debug info, which is how LibTorch's allocator finds a
// memory profiler to report to; only allocations made while it is installed are counted.
class TensorMemoryPeak : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size,
                         compat::MemoryReportTotal /*total_allocated*/,
                         compat::MemoryReportTotal /*total_reserved*/, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    const int64_t now = live_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_.load(); }

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

struct RowSpec {
  std::string label;              // "mha", "cem_attention cem.steps=2"; "" = the model as given
  std::vector<std::string> sets;  // model overrides of the row
};

// --kinds: "kind[:field=value...]" items, comma-separated; "all" = every mixer kind + CEM at T = 2.
std::vector<RowSpec> parse_kinds(const std::string& text) {
  if (text.empty()) return {RowSpec{}};
  std::vector<std::string> items;
  if (text == "all") {
    items = mixer_kind_names();
    items.push_back("cem_attention:cem.steps=2");
  } else {
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = text.find(',', start);
      const std::string item =
          text.substr(start, comma == std::string::npos ? comma : comma - start);
      if (!item.empty()) items.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  CEMFRAC_CHECK(!items.empty(), "--kinds needs at least one mixer kind (or all)");
  const std::vector<std::string> kinds = mixer_kind_names();
  std::vector<RowSpec> rows;
  for (const std::string& item : items) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= item.size()) {
      const size_t colon = item.find(':', start);
      parts.push_back(item.substr(start, colon == std::string::npos ? colon : colon - start));
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    CEMFRAC_CHECK(std::find(kinds.begin(), kinds.end(), parts[0]) != kinds.end(),
                  "--kinds: '{}' is not a mixer kind (valid: {}, or all)", parts[0],
                  fmt::join(kinds, ", "));
    RowSpec row{parts[0], {"model.mixer=" + parts[0]}};
    for (size_t i = 1; i < parts.size(); ++i) {
      CEMFRAC_CHECK(parts[i].find('=') != std::string::npos,
                    "--kinds: '{}' in '{}' is not field=value (e.g. cem_attention:cem.steps=2)",
                    parts[i], item);
      row.label += " " + parts[i];
      row.sets.push_back("model." + parts[i]);
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::vector<int64_t>> rows_of(const torch::Tensor& prompts, int64_t B) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < B; ++i) {
    const torch::Tensor row = prompts[i].contiguous();
    out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  return out;
}

struct Model {
  LmModel model{nullptr};
  int64_t vocab_limit = 0;
};

torch::Device bench_device(const GenerateBenchFlags& flags) {
  return flags.device.empty() ? torch::Device(torch::kCPU) : parse_device(flags.device, "--device");
}

Model build_model(const GenerateBenchFlags& flags, const RowSpec& spec) {
  Model m;
  if (!flags.checkpoint.empty()) {
    LoadedModel loaded = load_model(flags.checkpoint, flags.sets, bench_device(flags));
    m.model = loaded.model;
    m.vocab_limit =
        loaded.tokenizer ? loaded.tokenizer->vocab_size() : loaded.model->config().vocab_size;
    return m;
  }
  RunConfig rc = load_run_config(flags.config, flags.sets);
  if (!spec.sets.empty()) rc = with_overrides(rc, spec.sets);
  torch::manual_seed(rc.train.seed);
  m.model = LmModel(rc.model, bench_device(flags));
  m.model->eval();
  m.vocab_limit = rc.model.vocab_size;
  return m;
}

// Bytes of weights one decode step reads: every parameter but the embeddings (one row each), plus
// the embedding again when the head is tied to it (the head reads all of it).
int64_t weight_bytes_per_step(const LmModelImpl& model) {
  int64_t n = 0;
  for (const ParamInfo& p : model.parameter_table()) {
    if (p.kind != ParamKind::kEmbedding || !p.tied_to.empty()) n += p.numel;
  }
  return n * 4;  // float32
}

// Copy bandwidth now (GB/s, read + write counted, as STREAM does): best of 5 copies of a float
// tensor of `bytes` into a preallocated one.
double copy_bandwidth_gbs(int64_t bytes) {
  const int64_t elems = std::max<int64_t>(bytes / 4, int64_t{1} << 20);
  const torch::Tensor src = torch::rand({elems});
  torch::Tensor dst = torch::empty_like(src);
  const Timing t = time_it([&] { dst.copy_(src); }, 5);
  return 2.0 * double(elems) * 4 / (t.best_ms * 1e-3) / 1e9;
}

// What every row of one invocation shares, and the totals the rows add to.
struct DecodeBench {
  std::vector<int64_t> batches;
  int64_t B_max = 0, P = 0, N_new = 0;
  int threads = 0;
  std::string core;
  bool have_python = false;
  std::optional<fs::path> peer_script;
  std::vector<double> mha_cache;  // cache bytes of the mha row, per batch
  double copy_gbs = 0;            // measured once, before the first row is timed
  bool met = true, any_target = false;
  int peer_rows = 0;                    // rows the peer ran for
  std::vector<std::string> unmodelled;  // rows it does not model, and why
};

// The peer's reference for one model, written with its weights: cemfrac's logits of the prompts'
// last position and, after feeding the first greedy tokens, of the next one. Returns the file.
std::string write_decode_reference(LmModelImpl& model, const torch::Tensor& prompts,
                                   const torch::Tensor& prompts_here, int64_t vocab_limit) {
  torch::NoGradGuard no_grad;
  const int64_t B = prompts.size(0);
  DecodeState state = model.new_decode_state();
  const torch::Tensor l0 =
      model.forward(prompts_here, &state).select(1, -1).narrow(-1, 0, vocab_limit).contiguous();
  const torch::Tensor first = l0.argmax(-1);
  const torch::Tensor l1 = model.forward(first.view({B, 1}), &state)
                               .select(1, -1)
                               .narrow(-1, 0, vocab_limit)
                               .contiguous();
  TensorMap tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    tensors[item.key()] = item.value().detach();
  tensors["__prompts__"] = prompts;
  tensors["__logits0__"] = l0;
  tensors["__first__"] = first.contiguous();
  tensors["__logits1__"] = l1;
  const std::string path =
      (fs::temp_directory_path() / fmt::format("cemfrac-bench-decode-{}.safetensors", getpid()))
          .string();
  save_safetensors(path, tensors, {{"producer", "cemfrac bench generate"}});
  return path;
}

// One batch size of one row: an untimed generation (warm-up, memory, the tokens), then `reps`
// timed ones.
json time_batch(const GenerateBenchFlags& flags, DecodeBench& d, LmModelImpl& model,
                const torch::Tensor& prompts, const GenerateOptions& options, size_t bi,
                int64_t weight_bytes, bool mha_row, std::vector<int64_t>& row0_tokens) {
  const int64_t B = d.batches[bi];
  const auto batch = rows_of(prompts, B);
  GenerateTimings t;
  auto tracker = std::make_shared<TensorMemoryPeak>();
  std::vector<GenerateResult> tokens;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, tracker);
    tokens = generate_batch(model, batch, options, &t);
  }
  row0_tokens = tokens[0].tokens;
  std::vector<double> prefill, decode;
  for (int r = 0; r < flags.reps; ++r) {
    GenerateTimings tr;
    generate_batch(model, batch, options, &tr);
    prefill.push_back(tr.prefill_s);
    decode.push_back(tr.decode_s);
  }
  const double pm = median(prefill), dm = median(decode);
  json b = {
      {"batch", B},
      {"prefill_s", prefill},
      {"decode_s", decode},
      {"prefill_median_s", pm},
      {"decode_median_s", dm},
      {"decode_steps", t.decode_steps},
      {"prefill_tokens_per_s", double(B * d.P) / pm},
      {"decode_tokens_per_s", double(B * t.decode_steps) / dm},
      {"peak_tensor_bytes", tracker->peak()},
      {"cache_bytes", t.cache_bytes},
      // Every decode step reads all weights once: at batch B about B x bandwidth / weight
      // bytes tokens/s at most (an estimate, not a strict bound: the cache reads are left
      // out, and a matrix-vector product only reads, which can beat a copy).
      {"decode_bandwidth_limit_tokens_per_s", double(B) * d.copy_gbs * 1e9 / double(weight_bytes)}};
  b["decode_fraction_of_limit"] = b["decode_tokens_per_s"].get<double>() /
                                  b["decode_bandwidth_limit_tokens_per_s"].get<double>();
  if (mha_row) d.mha_cache[bi] = double(t.cache_bytes);
  if (d.mha_cache[bi] > 0) b["cache_bytes_vs_mha"] = double(t.cache_bytes) / d.mha_cache[bi];
  json toks = json::array();
  for (const auto& r : tokens) toks.push_back(r.tokens);
  b["tokens"] = toks;
  return b;
}

// Greedy tokens against the peer's: rows equal over all new tokens, and the first step where any
// row differs (-1: none).
std::pair<int64_t, int64_t> token_agreement(const json& mine, const json& theirs) {
  int64_t rows_equal = 0, first_diff = -1;
  for (size_t i = 0; i < mine.size() && i < theirs.size(); ++i) {
    if (mine[i] == theirs[i]) {
      ++rows_equal;
      continue;
    }
    for (size_t s = 0; s < mine[i].size() && s < theirs[i].size(); ++s) {
      if (mine[i][s] != theirs[i][s]) {
        if (first_diff < 0 || int64_t(s) < first_diff) first_diff = int64_t(s);
        break;
      }
    }
  }
  return {rows_equal, first_diff};
}

// Runs the decode peer for one row and adds its part: the logit check, and per batch the token
// agreement and (when the logits agree) its speed and the ratios.
void add_decode_peer(const GenerateBenchFlags& flags, DecodeBench& d, const ModelConfig& c,
                     const std::string& weights_path, int64_t vocab_limit, json& row,
                     json& per_batch) {
  const std::string cmd = fmt::format(
      "{}OPENBLAS_CORETYPE={} {} {} --config-json {} --weights {} --batches {} --new-tokens {} "
      "--vocab-limit {} --reps {} --threads {}",
      flags.peer_keep_heap ? kKeepHeapEnv : "", quote_for_shell(d.core), kPython,
      quote_for_shell(d.peer_script->string()), quote_for_shell(to_json(c).dump()),
      quote_for_shell(weights_path), flags.batches, d.N_new, vocab_limit, flags.reps, d.threads);
  if (!flags.json) fmt::print(stderr, "running the PyTorch peer: {}\n", cmd);
  const std::string out = run_peer(cmd, "the PyTorch decode peer", weights_path);
  const json peer = json::parse(out, nullptr, /*allow_exceptions=*/false);
  CEMFRAC_CHECK(peer.is_object() && peer.contains("results") && peer.contains("check"),
                "the PyTorch decode peer printed no JSON result: {}", cmd);
  const double diff = peer["check"]["max_abs_diff"].get<double>();
  const double scale = peer["check"]["max_abs_logit"].get<double>();
  const bool agree = diff <= kPeerLogitRtol * scale;  // false for NaN
  row["peer_check"] = {{"max_abs_logit_diff", diff},
                       {"max_abs_logit", scale},
                       {"tolerance", kPeerLogitRtol * scale},
                       {"agree", agree}};
  row["peer_info"] = {{"python", peer["python"]},
                      {"torch", peer["torch"]},
                      {"threads", peer["threads"]},
                      {"blas_core", peer["blas_core"]},
                      {"malloc", flags.peer_keep_heap ? "heap kept" : "glibc default"}};
  if (!agree) {
    row["peer_note"] = fmt::format(
        "no ratio: the peer's logits differ from cemfrac's by {:.3g} (tolerance {:.3g}): it "
        "does not compute the same model",
        diff, kPeerLogitRtol * scale);
    d.met = false;
  }
  for (size_t bi = 0; bi < d.batches.size(); ++bi) {
    json& b = per_batch[bi];
    const json* p = nullptr;
    for (const auto& r : peer["results"])
      if (r["batch"].get<int64_t>() == d.batches[bi]) p = &r;
    if (!p) continue;
    const auto [rows_equal, first_diff] = token_agreement(b["tokens"], (*p)["tokens"]);
    b["peer_tokens_rows_equal"] = rows_equal;
    b["peer_tokens_first_difference"] = first_diff < 0 ? json(nullptr) : json(first_diff);
    if (!agree) continue;
    json pj = {{"prefill_tokens_per_s", (*p)["prefill_tokens_per_s"]},
               {"decode_tokens_per_s", (*p)["decode_tokens_per_s"]},
               {"prefill_s", (*p)["prefill_s"]},
               {"decode_s", (*p)["decode_s"]},
               {"peak_rss_growth_bytes", (*p)["peak_rss_growth_bytes"]},
               {"cache_bytes", (*p)["cache_bytes"]}};
    b["peer"] = pj;
    b["decode_ratio_vs_peer"] =
        b["decode_tokens_per_s"].get<double>() / pj["decode_tokens_per_s"].get<double>();
    b["prefill_ratio_vs_peer"] =
        b["prefill_tokens_per_s"].get<double>() / pj["prefill_tokens_per_s"].get<double>();
    if (d.batches[bi] == 1) {
      d.any_target = true;
      d.met = d.met && b["decode_ratio_vs_peer"].get<double>() >= kTargetDecodeRatio;
    }
  }
}

// One row: its model built, timed at every batch size, and compared with the peer where it runs.
json bench_row(const GenerateBenchFlags& flags, DecodeBench& d, const RowSpec& spec) {
  Model m = build_model(flags, spec);
  LmModelImpl& model = *m.model;
  const ModelConfig c = model.config();
  CEMFRAC_CHECK(d.P >= 1 && d.N_new >= 1, "--prompt-len and --new-tokens must be >= 1");
  CEMFRAC_CHECK(d.P + d.N_new - 1 <= c.context,
                "--prompt-len {} + --new-tokens {} needs {} positions; the model's context is {}",
                d.P, d.N_new, d.P + d.N_new - 1, c.context);
  const std::string label = spec.label.empty() ? c.mixer : spec.label;
  if (!flags.json) fmt::print(stderr, "timing {} ...\n", label);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const torch::Tensor prompts =
      torch::randint(0, m.vocab_limit, {d.B_max, d.P}, gen, torch::TensorOptions(torch::kInt64));
  const torch::Tensor prompts_here = prompts.to(model.head_weight().device());
  GenerateOptions options;
  options.sampling.temperature = 0;
  options.max_new_tokens = d.N_new;
  options.eos_id = -1;
  options.vocab_limit = m.vocab_limit;

  const std::string why_not = peer_unsupported(c, Peer::kDecode);
  const bool want_peer = !flags.no_peer && d.have_python && d.peer_script && why_not.empty();
  if (!why_not.empty()) d.unmodelled.push_back(label + ": " + why_not);
  d.peer_rows += want_peer ? 1 : 0;
  const std::string weights_path =
      want_peer ? write_decode_reference(model, prompts, prompts_here, m.vocab_limit) : "";

  const int64_t weight_bytes = weight_bytes_per_step(model);
  if (d.copy_gbs == 0) d.copy_gbs = copy_bandwidth_gbs(weight_bytes);
  json row = {{"label", label},
              {"mixer", c.mixer},
              {"overrides", spec.sets},
              {"parameters", model.num_parameters()},
              {"weight_bytes_per_step", weight_bytes}};
  json per_batch = json::array();
  std::vector<std::vector<int64_t>> row0_tokens(d.batches.size());
  const bool mha_row = c.mixer == "mha" && spec.sets.size() <= 1;
  for (size_t bi = 0; bi < d.batches.size(); ++bi)
    per_batch.push_back(
        time_batch(flags, d, model, prompts, options, bi, weight_bytes, mha_row, row0_tokens[bi]));
  // Every batch gives its first prompt the same greedy tokens (they share prompt 0).
  bool same = true;
  for (const auto& t : row0_tokens) same = same && t == row0_tokens[0];
  row["row0_tokens_equal_across_batches"] = same;
  m.model = nullptr;  // free cemfrac's model before the peer starts

  if (want_peer) {
    add_decode_peer(flags, d, c, weights_path, options.vocab_limit, row, per_batch);
  } else if (!flags.no_peer) {
    row["peer_note"] = !d.have_python ? fmt::format("peer skipped: no {} with torch", kPython)
                       : !d.peer_script
                           ? fmt::format("peer skipped: {} not found", kPeerRelPath)
                           : fmt::format("peer skipped: it does not model {}", why_not);
  }
  row["batches"] = per_batch;
  return row;
}

// The report as text.
void print_generate_bench(const GenerateBenchFlags& flags, const DecodeBench& d,
                          const json& report) {
  fmt::print("generate bench: {}, prompt {} + {} new tokens, greedy, {} threads, medians of {}\n",
             report["source"].get<std::string>(), d.P, d.N_new, d.threads, flags.reps);
  fmt::print("CPU {}; BLAS {} core {}; binary {}; {}\n", read_cpu_features().model_name,
             blas_status().library, d.core, build_commit(), report["date_utc"].get<std::string>());
  fmt::print(
      "copy bandwidth {:.1f} GB/s (measured now); limit = batch x bandwidth / weight bytes "
      "per decode step\n",
      d.copy_gbs);
  fmt::print("{:<28} {:>5} {:>13} {:>13} {:>7} {:>9} {:>10} {:>6} {:>13} {:>7} {:>7}\n", "model",
             "batch", "prefill tok/s", "decode tok/s", "xlimit", "peak MiB", "cache KiB", "/mha",
             "peer dec tok/s", "x peer", "pre x");
  auto ratio = [](const json& b, const char* key) {
    return b.contains(key) ? fmt::format("{:.2f}", b[key].get<double>()) : std::string("-");
  };
  for (const auto& row : report["rows"]) {
    for (const auto& b : row["batches"]) {
      fmt::print(
          "{:<28} {:>5} {:>13.1f} {:>13.1f} {:>7.2f} {:>9.1f} {:>10.1f} {:>6} {:>13} {:>7} {:>7}\n",
          row["label"].get<std::string>(), b["batch"].get<int64_t>(),
          b["prefill_tokens_per_s"].get<double>(), b["decode_tokens_per_s"].get<double>(),
          b["decode_fraction_of_limit"].get<double>(),
          b["peak_tensor_bytes"].get<double>() / (1 << 20), b["cache_bytes"].get<double>() / 1024,
          ratio(b, "cache_bytes_vs_mha"),
          b.contains("peer") ? fmt::format("{:.1f}", b["peer"]["decode_tokens_per_s"].get<double>())
                             : std::string("-"),
          ratio(b, "decode_ratio_vs_peer"), ratio(b, "prefill_ratio_vs_peer"));
    }
    if (row.contains("peer_note")) fmt::print("  {}\n", row["peer_note"].get<std::string>());
    if (row.contains("peer_check"))
      fmt::print("  peer logits: max |diff| {:.3g} (tolerance {:.3g})\n",
                 row["peer_check"]["max_abs_logit_diff"].get<double>(),
                 row["peer_check"]["tolerance"].get<double>());
  }
  fmt::print(
      "xlimit = decode tokens/s / the bandwidth limit; /mha = cache bytes / the mha row's; x peer, "
      "pre x = cemfrac / peer tokens/s, decode and prefill\n");
  if (d.any_target) {
    fmt::print("target: decode tokens/s at batch 1 >= {:.0f}x the PyTorch peer's: {}\n",
               kTargetDecodeRatio, d.met ? "met" : "NOT met");
  }
}

int run_generate_bench(const GenerateBenchFlags& flags) {
  CEMFRAC_CHECK(flags.config.empty() != flags.checkpoint.empty(),
                "bench generate needs exactly one of --config FILE and --checkpoint DIR");
  CEMFRAC_CHECK(flags.checkpoint.empty() || flags.kinds.empty(),
                "--kinds builds models from a config; a checkpoint is one model (use --config)");
  CEMFRAC_CHECK(!(flags.peer && flags.no_peer), "--peer and --no-peer exclude each other");
  DecodeBench d;
  d.batches = parse_int_list(flags.batches, "--batches", "a batch size", "1,8", 4096);
  const std::vector<RowSpec> specs = parse_kinds(flags.kinds);
  d.B_max = *std::max_element(d.batches.begin(), d.batches.end());
  d.P = flags.prompt_len;
  d.N_new = flags.new_tokens;
  if (!flags.malloc_default) keep_heap();
  d.threads = at::get_num_threads();
  d.core = blas_status().core;
  d.have_python = !flags.no_peer && python_with_torch();
  d.peer_script = flags.no_peer ? std::nullopt : locate_peer(flags.peer_script, kPeerRelPath);
  if (flags.peer) {
    CEMFRAC_CHECK(d.have_python, "--peer needs {} with torch (Debian: python3-torch)", kPython);
    CEMFRAC_CHECK(d.peer_script.has_value(),
                  "--peer: {} not found; run from the source tree, set CEMFRAC_SOURCE_DIR or pass "
                  "--peer-script",
                  kPeerRelPath);
  }
  // Every row's config is checked before any row is timed.
  if (flags.checkpoint.empty()) {
    const RunConfig rc = load_run_config(flags.config, flags.sets);
    for (const RowSpec& spec : specs) {
      if (!spec.sets.empty()) with_overrides(rc, spec.sets);
    }
  }
  d.mha_cache.assign(d.batches.size(), 0);
  json rows = json::array();
  for (const RowSpec& spec : specs) rows.push_back(bench_row(flags, d, spec));
  CEMFRAC_CHECK(!flags.peer || d.peer_rows > 0,
                "--peer: the decode peer models none of the rows (it writes mha with swiglu or "
                "gelu_mlp only): {}",
                fmt::join(d.unmodelled, "; "));
  const json report = {
      {"bench", "generate"},
      {"commit", build_commit()},
      {"date_utc", utc_now()},
      {"source", flags.checkpoint.empty() ? flags.config : flags.checkpoint},
      {"overrides", flags.sets},
      {"cpu", read_cpu_features().model_name},
      {"threads", d.threads},
      {"blas_core", d.core},
      {"copy_gbs", d.copy_gbs},
      {"prompt_len", d.P},
      {"new_tokens", d.N_new},
      {"reps", flags.reps},
      {"sampling", "greedy, no end-of-text stop"},
      {"malloc", flags.malloc_default ? "glibc default" : "heap kept (no mmap, no trim)"},
      {"memory",
       "peak_tensor_bytes: largest live tensor memory allocated during one generation (LibTorch "
       "CPU allocator reports; weights excluded); peer: peak RSS growth (VmHWM reset)"},
      {"rows", rows},
      {"targets",
       {{"decode_ratio_at_batch_1_at_least", kTargetDecodeRatio},
        {"met", d.any_target ? json(d.met) : json(nullptr)}}},
  };
  if (flags.json)
    fmt::print("{}\n", report.dump(2));
  else
    print_generate_bench(flags, d, report);
  return 0;
}

}  // namespace

Command add_bench_generate(CLI::App& bench, const GlobalOptions& global) {
  // --threads and --blas-core are applied in main() before any command runs; --device here.
  auto flags = std::make_shared<GenerateBenchFlags>();
  CLI::App* app = bench.add_subcommand(
      "generate",
      "Prefill and decode tokens/s of greedy generation, peak memory and cache bytes, per mixer "
      "kind, against a PyTorch eager peer with a KV cache");
  app->add_option("--config", flags->config, "Run config (TOML), e.g. configs/small-llama.toml");
  app->add_option("--checkpoint", flags->checkpoint,
                  "Checkpoint directory, or a run directory (newest), instead of --config");
  app->add_option("--set", flags->sets, "Override a config field: section.key=value (repeatable)");
  app->add_option("--kinds", flags->kinds,
                  "One row per mixer kind, comma-separated, each optionally with model overrides "
                  "after ':' (cem_attention:cem.steps=2); 'all' = every kind and cem_attention at "
                  "T = 2; default: the config's model");
  app->add_option("--batches", flags->batches, "Batch sizes, comma-separated")
      ->capture_default_str();
  app->add_option("--prompt-len", flags->prompt_len, "Prompt tokens per row (random ids)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app->add_option("--new-tokens", flags->new_tokens, "Greedy tokens generated per row")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app->add_option("--reps", flags->reps, "Timed generations after one untimed (medians)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app->add_flag("--json", flags->json, "Print one JSON object (every rep's times, the tokens)");
  app->add_flag(
      "--peer", flags->peer,
      "Run the PyTorch peer (bench/peers/decode_peer.py under " CEMFRAC_PEER_PYTHON
      ", the build's interpreter) for the rows it models (mha with swiglu or gelu_mlp) and fail "
      "when it cannot run or models none; default: on for those rows when it imports torch");
  app->add_flag("--no-peer", flags->no_peer, "Do not run the PyTorch peer");
  app->add_option("--peer-script", flags->peer_script,
                  "Path of decode_peer.py (default: found in the source tree)");
  app->add_flag("--malloc-default", flags->malloc_default,
                "Leave glibc malloc as configured (default: keep freed memory in the heap)");
  app->add_flag("--peer-keep-heap", flags->peer_keep_heap,
                "Run the peer with the same heap policy as cemfrac (default: glibc's defaults)");
  return {app, [flags, &global] {
            flags->device = global.device;
            return run_generate_bench(*flags);
          }};
}

}  // namespace cemfrac::cli

// cemfrac eval: loss, perplexity and bits per byte of a checkpoint on a prepared split or any text,
// with sliding windows that score every token exactly once (the protocol is printed).
// With --task: zero-shot task scores in lm-evaluation-harness's conventions (cli/eval_task.cpp).
#include <fmt/format.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"
#include "cemfrac/data/shard.h"
#include "cemfrac/eval/perplexity.h"
#include "cemfrac/layers/cem/cem_common.h"
#include "cemfrac/layers/mixer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/model_loader.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cli/eval_task.h"

namespace cemfrac::cli {
namespace {

// The UTF-8 bytes that `tokens` decode to (end-of-text separators excluded).
int64_t decoded_bytes(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  int64_t bytes = 0;
  std::vector<TokenId> run;
  auto flush = [&] {
    if (!run.empty()) bytes += static_cast<int64_t>(tokenizer.decode(run).size());
    run.clear();
  };
  for (TokenId id : ids) {
    if (id == tokenizer.eot_id()) {
      flush();
    } else {
      run.push_back(id);
    }
  }
  flush();
  return bytes;
}

// The CEM sub-layers (docs/layers/cem.md) by module name ("blocks.0.attn"), in module order, each
// with the energy trace its reports are summed into.
std::vector<std::pair<std::string, CemEnergyTrace>> cem_traces(const ModelConfig& c) {
  std::vector<std::pair<std::string, CemEnergyTrace>> out;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.mixer_of(l) == "cem_attention")
      out.emplace_back(fmt::format("blocks.{}.attn", l), CemEnergyTrace());
    if (c.ffn_of(l) == "cem_mlp")
      out.emplace_back(fmt::format("blocks.{}.mlp", l), CemEnergyTrace());
  }
  return out;
}

// Sums each reported "<module>.energy.<t>" into the module's trace.
LayerObserver energy_observer(std::vector<std::pair<std::string, CemEnergyTrace>>& traces) {
  return [&traces](const std::string& name, const torch::Tensor& value) {
    const size_t at = name.rfind(".energy.");
    if (at == std::string::npos) return;
    const std::string module = name.substr(0, at);
    const int64_t t = std::stoll(name.substr(at + 8));
    for (auto& [m, trace] : traces) {
      if (m == module) trace.add(t, value);
    }
  };
}

}  // namespace

// The flags, one declaration each (which makes this function long), then the command they run.
Command add_eval(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string checkpoint;
    std::string data;
    std::string text;
    int64_t stride = 0;
    int64_t batch = 8;
    bool json = false;
    std::vector<std::string> sets;  // --set model.cem.steps=4
    bool cem_energy = false;
    bool no_verify_data = false;
    std::string task;               // --task FILE|NAME (cli/eval_task.cpp)
    std::string request = "auto";  // --request
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("eval", "Loss, perplexity and bits per byte of a checkpoint, or zero-shot task scores");
  app->add_option("--checkpoint", f->checkpoint,
                  "Checkpoint directory, or a run directory (newest)")
      ->required();
  auto* data = app->add_option("--data", f->data, "PREPARED_DIR:SPLIT, e.g. data/brown:test");
  auto* text = app->add_option("--text", f->text, "A UTF-8 text file");
  data->excludes(text);
  auto* task = app->add_option(
      "--task", f->task,
      "Zero-shot task: a JSONL task file (docs/formats.md) or a built-in task: brown-cloze, "
      "brown-mc, brown-rolling (docs/evaluation.md)");
  task->excludes(data)->excludes(text);
  app->add_option("--request", f->request,
                  "With --task FILE: multiple_choice (mc), cloze or rolling (default auto: from "
                  "the first line's keys; a LAMBADA {\"text\"} file needs cloze)");
  app->add_option("--stride", f->stride,
                  "Window stride in tokens, 1..context (0 or unset: context / 2; with a rolling "
                  "--task: the context, the harness's non-overlapping windows)");
  app->add_option("--batch", f->batch, "Windows per forward pass")->check(CLI::Range(1, 4096));
  app->add_flag("--json", f->json, "Print one JSON object");
  app->add_flag("--no-verify-data", f->no_verify_data,
                "With --data: skip the full scan of the shard (token CRC-32, every id below the "
                "vocabulary); the header checks still run (docs/formats.md)");
  app->add_flag(
      "--cem-energy", f->cem_energy,
      "Also report each CEM sub-layer's mean energy before and after every recursive step");
  app->add_option(
      "--set", f->sets,
      "Change a field no parameter shape depends on, e.g. model.cem.steps=4 (repeatable)");
  auto run = [f, &global]() {
    if (!f->task.empty()) {
      CEMFRAC_CHECK(!f->cem_energy, "--cem-energy applies to --data and --text, not --task");
      EvalTaskArgs a;
      a.checkpoint = f->checkpoint;
      a.sets = f->sets;
      a.task = f->task;
      a.request = f->request;
      a.batch = f->batch;
      a.stride = f->stride;
      a.json = f->json;
      a.device = command_device(global);
      return run_eval_task(a);
    }
    CEMFRAC_CHECK(!f->data.empty() || !f->text.empty(),
                  "eval needs --data DIR:SPLIT, --text FILE or --task FILE|NAME");
    CEMFRAC_CHECK(f->stride >= 0, "--stride {}: must be 1..context (or 0: context / 2)", f->stride);
    if (!f->text.empty()) check_input_file(f->text, "--text", "pass a UTF-8 text file");
    LoadedModel loaded = load_model(f->checkpoint, f->sets, command_device(global));
    CEMFRAC_CHECK(loaded.tokenizer != nullptr,
                  "{} has no tokenizer/ directory: cannot read data for it", loaded.checkpoint);
    const Tokenizer& tok = *loaded.tokenizer;
    CEMFRAC_CHECK(tok.vocab_size() <= loaded.model->config().vocab_size,
                  "{}: tokenizer '{}' has {} ids, more than the model's vocab_size {}",
                  loaded.checkpoint, tok.id(), tok.vocab_size(), loaded.model->config().vocab_size);
    std::vector<TokenId> ids;
    std::string source;
    if (!f->text.empty()) {
      const std::string text = read_file(f->text);
      CEMFRAC_CHECK(!text.empty(), "{} is empty: nothing to evaluate", f->text);
      // The end-of-text id in front gives the text's first token a (document-start) history, as in
      // the shards, where every document follows an end-of-text.
      ids.push_back(tok.eot_id());
      const auto body = tok.encode(text);
      ids.insert(ids.end(), body.begin(), body.end());
      source = f->text;
    } else {
      const auto colon = f->data.rfind(':');
      CEMFRAC_CHECK(colon != std::string::npos && colon + 1 < f->data.size(),
                    "--data '{}' must be PREPARED_DIR:SPLIT (train, val or test)", f->data);
      const std::string dir = f->data.substr(0, colon), split = f->data.substr(colon + 1);
      CEMFRAC_CHECK(split == "train" || split == "val" || split == "test",
                    "--data split '{}' must be train, val or test", split);
      ShardCheck check;
      check.tokenizer = &tok;
      check.model_vocab_size = loaded.model->config().vocab_size;
      check.verify_tokens = !f->no_verify_data;
      const auto shard = open_token_shard(dir + "/" + split + ".bin", check);
      ids.reserve(shard->size() + 1);
      ids.push_back(tok.eot_id());  // the first document, like every later one, follows an eot
      std::vector<int64_t> wide(shard->size());
      shard->copy_to(0, shard->size(), wide.data());  // checks ids even under --no-verify-data
      ids.insert(ids.end(), wide.begin(), wide.end());
      source = f->data;
    }
    const int64_t bytes = decoded_bytes(tok, ids);
    auto tokens = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
    PerplexityOptions options;
    options.context = loaded.model->config().context;
    options.stride = f->stride;
    options.batch_size = f->batch;
    options.device = loaded.model->wte().weight.device();
    LmModel model = loaded.model;
    auto traces = cem_traces(model->config());
    CEMFRAC_CHECK(!f->cem_energy || !traces.empty(),
                  "--cem-energy: {} has no CEM sub-layer (mixer cem_attention or FFN cem_mlp)",
                  loaded.checkpoint);
    if (f->cem_energy) model->set_observer(energy_observer(traces));
    PerplexityResult r =
        evaluate_perplexity([model](const torch::Tensor& x) mutable { return model->forward(x); },
                            tokens, options, bytes);
    if (f->json) {
      nlohmann::json j = to_json(r);
      j["checkpoint"] = loaded.checkpoint;
      j["step"] = loaded.step;
      j["source"] = source;
      j["tokenizer"] = tok.id();
      j["set"] = f->sets;  // overrides of the checkpoint's config (e.g. model.cem.steps=4)
      if (f->cem_energy) {
        for (const auto& [name, trace] : traces) j["cem_energy"][name] = trace.mean();
      }
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("checkpoint   {} (step {})\n", loaded.checkpoint, loaded.step);
    for (const std::string& set : f->sets) fmt::print("set          {}\n", set);
    fmt::print("source       {} ({} tokens with {}, {} UTF-8 bytes)\n", source, ids.size(),
               tok.id(), bytes);
    fmt::print("protocol     {}\n", r.protocol);
    fmt::print("scored       {} tokens in {} windows (context {}, stride {})\n", r.tokens_scored,
               r.windows, r.context, r.stride);
    fmt::print("loss         {:.4f} nats/token\n", r.mean_loss);
    fmt::print("perplexity   {:.3f}\n", r.perplexity);
    if (r.bits_per_byte) fmt::print("bits/byte    {:.4f}\n", *r.bits_per_byte);
    if (f->cem_energy) {
      fmt::print("CEM energy   mean per position, before step 1 and after each step:\n");
      for (const auto& [name, trace] : traces) {
        std::string line;
        for (double e : trace.mean()) line += fmt::format(" {:.6g}", e);
        fmt::print("  {:<16}{}\n", name, line);
      }
    }
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

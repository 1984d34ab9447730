#include "cemfrac/train/model_loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/run_dir.h"
#include "cemfrac/train/run_config.h"

namespace cemfrac {

namespace {

// {"cem.steps", "cem.rope_mode", "x"} -> "model.cem.{steps, rope_mode}, model.x"
std::string grouped_keys(const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, std::vector<std::string>>>
      groups;  // table -> fields, in order
  for (const std::string& key : keys) {
    const size_t dot = key.rfind('.');
    const std::string table = dot == std::string::npos ? "" : key.substr(0, dot + 1);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == table; });
    if (it == groups.end()) it = groups.insert(groups.end(), {table, {}});
    it->second.push_back(key.substr(table.size()));
  }
  std::vector<std::string> parts;
  for (const auto& [table, fields] : groups) {
    parts.push_back(fields.size() == 1
                        ? fmt::format("model.{}{}", table, fields[0])
                        : fmt::format("model.{}{{{}}}", table, fmt::join(fields, ", ")));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

ModelConfig apply_model_overrides(const nlohmann::json& config_json,
                                  const std::vector<std::string>& overrides,
                                  const std::string& source, const std::string& flag) {
  // The fields marked OnCheckpoint::kMayChange where they are declared (visit_fields).
  const std::vector<std::string> allowed = fields_that_may_change_on_checkpoint<ModelConfig>();
  for (const std::string& text : overrides) {
    const size_t eq = text.find('=');
    const std::string key = text.substr(0, eq);
    const std::string field = key.rfind("model.", 0) == 0 ? key.substr(6) : "";
    CEMFRAC_CHECK(eq != std::string::npos &&
                      std::find(allowed.begin(), allowed.end(), field) != allowed.end(),
                  "{} {}: a checkpoint's architecture is fixed by its config.json; only fields "
                  "that change no parameter shape can be overridden: {}",
                  flag, text, grouped_keys(allowed));
  }
  ModelConfig config = model_config_from_json(config_json, source);
  if (overrides.empty()) return config;
  // The values are read as the TOML run config reads --set (4, true, "exact"; bare text is a
  // string). Its errors (a wrong type, an unknown name) quote the --set text; the checkpoint is
  // named too, as in the validation error below.
  try {
    override_model_fields(config, overrides, flag);
  } catch (const Error& e) {
    fail("{} with {}", source, e.what());
  }
  if (auto p = config.first_problem()) {
    fail("{} with {} {}: {}", source, flag, fmt::join(overrides, " " + flag + " "), p->message);
  }
  return config;
}

namespace {

LoadedModel load_resolved(const std::string& checkpoint, const std::vector<std::string>& overrides,
                          const std::string& flag, torch::Device device) {
  LoadedModel out;
  out.checkpoint = checkpoint;
  LoadOptions options;
  options.optimizer = false;
  Checkpoint ckpt = load_checkpoint(out.checkpoint, options);
  const ModelConfig config =
      apply_model_overrides(ckpt.config, overrides, out.checkpoint + "/config.json", flag);
  out.model = LmModel(config, device);
  std::vector<NamedTarget> targets;
  for (const auto& [name, tensor] : parameters_by_name(*out.model, out.model->parameter_table()))
    targets.push_back({name, tensor});
  TensorMap backbone;
  for (auto& [name, tensor] : ckpt.model.tensors) {
    (name.rfind("cls.", 0) == 0 ? out.head[name] : backbone[name]) = tensor;
  }
  load_into(backbone, targets, out.checkpoint + "/model.safetensors");
  load_state_buffers(ckpt, *out.model);  // e.g. the ladders' recorded ranges for eval clipping
  out.model->eval();
  if (ckpt.has_tokenizer) out.tokenizer = load_tokenizer(out.checkpoint + "/tokenizer");
  out.step = ckpt.trainer.step;
  return out;
}

// "<run>/checkpoints/step-N" -> "<run>", else "".
std::string run_of(const std::string& checkpoint) {
  const std::filesystem::path p = std::filesystem::path(checkpoint).lexically_normal();
  if (p.parent_path().filename() != "checkpoints") return "";
  return p.parent_path().parent_path().empty() ? "." : p.parent_path().parent_path().string();
}

}  // namespace

LoadedModel load_model(const std::string& path, const std::vector<std::string>& overrides,
                       torch::Device device, const LoadLabels& labels) {
  // eval and generate take the checkpoint as --checkpoint (resolve_checkpoint names --resume).
  std::error_code ec;
  const std::string run = run_of(path);
  auto rotated_away = [&](const std::string& what) {
    fail(
        "{}: the checkpoint {} (rotated away by its run, which keeps only its newest "
        "train.keep_checkpoints); pass the run directory {} to read its newest one",
        path, what, run);
  };
  if (!std::filesystem::is_directory(path, ec)) {
    if (!run.empty() && !list_checkpoints(run).empty()) rotated_away("no longer exists");
    fail("{} {}: no such directory", labels.path, path);
  }
  // A run directory, or the run of a checkpoint inside one, whose writer was killed outright.
  const std::string run_dir = run.empty() ? path : run;
  int64_t died_at = 0;
  if (run_status(run_dir, &died_at) == RunStatus::kDied)
    warn(
        "{}: the process training this run died at step {} (summary.json still says \"running\" "
        "but no process holds {}); reading {} (train --resume {} continues the run)",
        path, died_at, run_dir, run.empty() ? "its newest complete checkpoint" : "this checkpoint",
        run_dir);
  // Readers take no lock (core/dir_lock.h): the run writing `path` may rotate a checkpoint away
  // while it is read. A checkpoint that vanished is read again from the run's newest complete one;
  // one named directly is reported as rotated away. An error in a checkpoint that is still there is
  // that checkpoint's problem, reported as it is.
  const bool named_directly =
      !run.empty() &&
      std::filesystem::is_regular_file(std::filesystem::path(path) / kCheckpointTrainerFile, ec);
  constexpr int kAttempts = 20;
  for (int attempt = 1;; ++attempt) {
    const std::string checkpoint = resolve_checkpoint(path);
    try {
      LoadedModel out = load_resolved(checkpoint, overrides, labels.overrides, device);
      if (std::filesystem::is_directory(checkpoint, ec)) return out;  // read whole, still there
    } catch (const std::exception&) {
      if (std::filesystem::is_directory(checkpoint, ec)) throw;
    }
    if (named_directly) rotated_away("was removed while it was read");
    CEMFRAC_CHECK(attempt < kAttempts,
                  "{}: {} checkpoints in a row were rotated away while being read; the run "
                  "writing them saves faster than they can be read (raise its "
                  "train.keep_checkpoints, or read after it ends)",
                  path, kAttempts);
  }
}

InitFromReport init_from_checkpoint(LmModelImpl& model, const std::string& path,
                                    const Tokenizer* tokenizer) {
  LoadedModel source = load_model(path, {}, torch::kCPU);
  InitFromReport r;
  r.checkpoint = source.checkpoint;
  if (tokenizer && source.tokenizer)
    CEMFRAC_CHECK(
        tokenizer->id() == source.tokenizer->id(),
        "train.init_from {}: its tokenizer is {} but the data's is {}: the embedding rows "
        "would mean other tokens",
        r.checkpoint, source.tokenizer->id(), tokenizer->id());
  std::map<std::string, torch::Tensor> from;
  for (const auto& p : source.model->named_parameters()) from[p.key()] = p.value();
  // A tensor is the same thing in both models only inside a sub-layer of the same kind: a cffn's
  // w_gate is not a SwiGLU's w_gate, a LayerNorm's weight not an RMSNorm's.
  const ModelConfig& a = source.model->config();
  const ModelConfig& b = model.config();
  auto same_kind = [&](const std::string& name) {
    int64_t layer = -1;
    char part[8] = {0};
    if (std::sscanf(name.c_str(), "blocks.%ld.%4[a-z0-9]", &layer, part) == 2) {
      if (layer >= a.n_layers) return false;
      const std::string sub = part;
      if (sub == "attn") return a.mixer_of(layer) == b.mixer_of(layer);
      if (sub == "mlp") return a.ffn_of(layer) == b.ffn_of(layer);
    }
    return a.norm == b.norm || name.find("norm") == std::string::npos;
  };
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    auto it = from.find(p.key());
    if (it == from.end() || !same_kind(p.key())) {
      r.fresh.push_back(p.key());
      continue;
    }
    CEMFRAC_CHECK(it->second.sizes() == p.value().sizes(),
                  "train.init_from {}: '{}' is [{}] there but [{}] in this model", r.checkpoint,
                  p.key(), fmt::join(it->second.sizes(), ", "), fmt::join(p.value().sizes(), ", "));
    if (!p.value().is_meta()) p.value().copy_(it->second);
    r.loaded.push_back(p.key());
    from.erase(it);
  }
  for (const auto& [name, t] : from) r.unused.push_back(name);
  CEMFRAC_CHECK(!r.loaded.empty(),
                "train.init_from {}: none of its tensors is one of this model's (no name in "
                "common): nothing to start from",
                r.checkpoint);
  return r;
}

}  // namespace cemfrac

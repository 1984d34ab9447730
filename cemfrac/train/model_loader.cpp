#include "cemfrac/train/model_loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"
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
                                  const std::string& source) {
  // The fields marked OnCheckpoint::kMayChange where they are declared (visit_fields).
  const std::vector<std::string> allowed = fields_that_may_change_on_checkpoint<ModelConfig>();
  for (const std::string& text : overrides) {
    const size_t eq = text.find('=');
    const std::string key = text.substr(0, eq);
    const std::string field = key.rfind("model.", 0) == 0 ? key.substr(6) : "";
    CEMFRAC_CHECK(eq != std::string::npos &&
                      std::find(allowed.begin(), allowed.end(), field) != allowed.end(),
                  "--set {}: a checkpoint's architecture is fixed by its config.json; only fields "
                  "that change no parameter shape can be overridden: {}",
                  text, grouped_keys(allowed));
  }
  ModelConfig config = model_config_from_json(config_json, source);
  if (overrides.empty()) return config;
  // The values are read as the TOML run config reads --set (4, true, "exact"; bare text is a
  // string). Its errors (a wrong type, an unknown name) quote the --set text; the checkpoint is
  // named too, as in the validation error below.
  try {
    override_model_fields(config, overrides);
  } catch (const Error& e) {
    fail("{} with {}", source, e.what());
  }
  if (auto p = config.first_problem()) {
    fail("{} with --set {}: {}", source, fmt::join(overrides, " --set "), p->message);
  }
  return config;
}

LoadedModel load_model(const std::string& path, const std::vector<std::string>& overrides,
                       torch::Device device) {
  LoadedModel out;
  // eval and generate take the checkpoint as --checkpoint (resolve_checkpoint names --resume).
  std::error_code ec;
  CEMFRAC_CHECK(std::filesystem::is_directory(path, ec), "--checkpoint {}: no such directory",
                path);
  out.checkpoint = resolve_checkpoint(path);
  LoadOptions options;
  options.optimizer = false;
  Checkpoint ckpt = load_checkpoint(out.checkpoint, options);
  const ModelConfig config =
      apply_model_overrides(ckpt.config, overrides, out.checkpoint + "/config.json");
  out.model = LmModel(config, device);
  std::vector<NamedTarget> targets;
  for (const auto& [name, tensor] : parameters_by_name(*out.model, out.model->parameter_table()))
    targets.push_back({name, tensor});
  load_into(ckpt.model.tensors, targets, out.checkpoint + "/model.safetensors");
  load_state_buffers(ckpt, *out.model);  // e.g. the ladders' recorded ranges for eval clipping
  out.model->eval();
  if (ckpt.has_tokenizer) out.tokenizer = load_tokenizer(out.checkpoint + "/tokenizer");
  out.step = ckpt.trainer.step;
  return out;
}

}  // namespace cemfrac

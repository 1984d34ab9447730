#include "cemfrac/train/model_loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"

namespace cemfrac {

ModelConfig apply_model_overrides(const nlohmann::json& config_json,
                                  const std::vector<std::string>& overrides, const std::string& source) {
  nlohmann::json j = config_json;
  const std::vector<std::string> allowed = cem_runtime_fields();
  for (const std::string& text : overrides) {
    const size_t eq = text.find('=');
    const std::string key = text.substr(0, eq);
    const std::string prefix = "model.cem.";
    const std::string field = key.rfind(prefix, 0) == 0 ? key.substr(prefix.size()) : "";
    CEMFRAC_CHECK(eq != std::string::npos &&
                      std::find(allowed.begin(), allowed.end(), field) != allowed.end(),
                  "--set {}: a checkpoint's architecture is fixed by its config.json; only fields "
                  "that change no parameter shape can be overridden: model.cem.{{{}}}",
                  text, fmt::join(allowed, ", "));
    // The value as JSON (4, true, "exact"); bare text is a string (--set model.cem.rope_mode=none).
    nlohmann::json value = nlohmann::json::parse(text.substr(eq + 1), nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text.substr(eq + 1);
    // A config.json that is not an object, or whose "cem" is not one, gets model_config_from_json's
    // one-line error below, not a JSON type error (found by fuzz/fuzz_model_config_json.cpp).
    if (!j.is_object()) break;
    if (!j.contains("cem")) j["cem"] = nlohmann::json::object();
    if (!j["cem"].is_object()) break;
    j["cem"][field] = value;
  }
  const std::string where = overrides.empty() ? source : fmt::format("{} with --set {}", source,
                                                                      fmt::join(overrides, " --set "));
  return model_config_from_json(j, where);
}

LoadedModel load_model(const std::string& path, const std::vector<std::string>& overrides) {
  LoadedModel out;
  // eval and generate take the checkpoint as --checkpoint (resolve_checkpoint names --resume).
  std::error_code ec;
  CEMFRAC_CHECK(std::filesystem::is_directory(path, ec), "--checkpoint {}: no such directory", path);
  out.checkpoint = resolve_checkpoint(path);
  LoadOptions options;
  options.optimizer = false;
  Checkpoint ckpt = load_checkpoint(out.checkpoint, options);
  const ModelConfig config =
      apply_model_overrides(ckpt.config, overrides, out.checkpoint + "/config.json");
  out.model = LmModel(config);
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

#include "cemfrac/train/model_loader.h"

#include <vector>

#include "cemfrac/io/safetensors.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"

namespace cemfrac {

LoadedModel load_model(const std::string& path) {
  LoadedModel out;
  out.checkpoint = resolve_checkpoint(path);
  LoadOptions options;
  options.optimizer = false;
  Checkpoint ckpt = load_checkpoint(out.checkpoint, options);
  const ModelConfig config = model_config_from_json(ckpt.config, out.checkpoint + "/config.json");
  out.model = LmModel(config);
  std::vector<NamedTarget> targets;
  for (const auto& [name, tensor] : parameters_by_name(*out.model, out.model->parameter_table()))
    targets.push_back({name, tensor});
  load_into(ckpt.model.tensors, targets, out.checkpoint + "/model.safetensors");
  out.model->eval();
  if (ckpt.has_tokenizer) out.tokenizer = load_tokenizer(out.checkpoint + "/tokenizer");
  out.step = ckpt.trainer.step;
  return out;
}

}  // namespace cemfrac

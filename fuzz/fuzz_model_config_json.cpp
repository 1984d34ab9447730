// A checkpoint's config.json (cemfrac/model/model_config.h): the input is the file. It is read the
// way load_checkpoint and load_model read it: JSON parse, the comparison with the run's model on
// resume (check_config_matches), then model_config_from_json, also with an eval-time
// `--set model.cem.steps=2` (apply_model_overrides). An accepted config must survive to_json ->
// model_config_from_json unchanged.
#include <nlohmann/json.hpp>

#include "cemfrac/model/model_config.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/model_loader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  const nlohmann::json j = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;  // load_checkpoint refuses these itself
  static const nlohmann::json defaults = to_json(ModelConfig{});
  fuzz::expect_clean([&] { check_config_matches(defaults, j, "config.json"); });
  fuzz::expect_clean([&] { check_config_matches(j, j, "config.json"); });
  fuzz::expect_clean([&] {
    const ModelConfig config = model_config_from_json(j, "config.json");
    const nlohmann::json written = to_json(config);
    FUZZ_REQUIRE(model_config_from_json(written, "again") == config);
    check_config_matches(written, to_json(model_config_from_json(written, "again")), "again");
  });
  fuzz::expect_clean([&] { (void)apply_model_overrides(j, {"model.cem.steps=2"}, "config.json"); });
  return 0;
}

// The CLI's `--set key=value` (cemfrac/train/run_config.h with_overrides, as train/params/bench
// apply them, and cemfrac/train/model_loader.h apply_model_overrides, as eval/generate apply them
// to a checkpoint's config.json). The input is one override per line. What with_overrides accepts
// must print (to_toml) to a config that reads back to the same config.
#include <nlohmann/json.hpp>
#include <vector>

#include "cemfrac/model/model_config.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/run_config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  const std::string_view text = fuzz::as_text(data, size);
  std::vector<std::string> overrides;
  for (size_t start = 0; start <= text.size() && overrides.size() < 16;) {
    const size_t nl = std::min(text.find('\n', start), text.size());
    overrides.emplace_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  fuzz::expect_clean([&] {
    const RunConfig config = with_overrides(RunConfig{}, overrides);
    const std::string printed = to_toml(config);
    const std::string saved = fuzz::scratch_dir() + "/saved.toml";
    fuzz::write_bytes(saved, printed);
    const RunConfig again = load_run_config(saved);  // must not throw: it is our own output
    FUZZ_REQUIRE(to_toml(again) == printed);
  });
  static const nlohmann::json checkpoint_config = to_json(ModelConfig{});
  fuzz::expect_clean([&] {
    const ModelConfig model = apply_model_overrides(checkpoint_config, overrides, "config.json");
    FUZZ_REQUIRE(model_config_from_json(to_json(model), "again") == model);
  });
  return 0;
}

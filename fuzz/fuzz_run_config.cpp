// Run configs (cemfrac/train/run_config.h): the input is a whole TOML file, read by load_run_config
// as `cemfrac train --config FILE` reads it (toml++ is compiled from its headers in fuzz builds, so
// the TOML parser is sanitized too). A config it accepts must print (to_toml, what a run saves as
// config.toml) to a file that reads back to the same config.
#include "cemfrac/train/run_config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  const std::string path = fuzz::scratch_dir() + "/config.toml";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  fuzz::expect_clean([&] {
    const RunConfig config = load_run_config(path);
    const std::string printed = to_toml(config);
    const std::string saved = fuzz::scratch_dir() + "/saved.toml";
    fuzz::write_bytes(saved, printed);
    const RunConfig again = load_run_config(saved);  // must not throw: it is our own output
    FUZZ_REQUIRE(to_toml(again) == printed);
    FUZZ_REQUIRE(again.model == config.model);
  });
  return 0;
}

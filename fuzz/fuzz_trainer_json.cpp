// A checkpoint's trainer.json (cemfrac/train/checkpoint.h): the input is the file. It is read the
// way load_checkpoint and resume read it: JSON parse, trainer_state_from_json, then the saved torch
// RNG state (base64) restored. An accepted state must survive trainer_state_to_json -> from_json.
// base64 itself must round-trip the input bytes.
#include <nlohmann/json.hpp>

#include "cemfrac/train/checkpoint.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  const std::string text(fuzz::as_text(data, size));
  FUZZ_REQUIRE(base64_decode(base64_encode(text), "b64") == text);
  fuzz::expect_clean([&] { (void)base64_decode(text, "trainer.json"); });

  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return 0;  // load_checkpoint: "not valid JSON"
  fuzz::expect_clean([&] {
    const TrainerState s = trainer_state_from_json(j, "trainer.json");
    const TrainerState t = trainer_state_from_json(trainer_state_to_json(s), "again");
    FUZZ_REQUIRE(t.step == s.step && t.tokens == s.tokens && t.data_seed == s.data_seed);
    FUZZ_REQUIRE(t.loader == s.loader && t.recent_losses == s.recent_losses);
    FUZZ_REQUIRE(t.torch_rng == s.torch_rng);
    FUZZ_REQUIRE(t.schedule.warmup_steps == s.schedule.warmup_steps &&
                 t.schedule.total_steps == s.schedule.total_steps);
    set_torch_rng_state(s.torch_rng, "trainer.json");
  });
  return 0;
}

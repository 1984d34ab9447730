// apply_model_overrides (eval/generate --set on a checkpoint's config.json): inputs found by the
// fuzzers (fuzz/corpus/model_config_json, fuzz/corpus/set_override) that escaped as JSON type
// errors ("internal error") instead of one cemfrac::Error line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cemfrac/model/model_config.h"
#include "cemfrac/train/model_loader.h"

namespace cemfrac {
namespace {

// The cemfrac::Error message of apply_model_overrides; any other exception fails the test.
std::string override_error(const nlohmann::json& config, const std::vector<std::string>& sets) {
  try {
    apply_model_overrides(config, sets, "ckpt/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(ApplyModelOverrides, ConfigWhoseCemIsNotAnObjectIsAClearError) {
  // Was nlohmann's type_error 305 from j["cem"]["steps"] on a number.
  nlohmann::json config = to_json(ModelConfig{});
  config["cem"] = 3;
  const std::string msg = override_error(config, {"model.cem.steps=2"});
  EXPECT_NE(msg.find("ckpt/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cem = 3: expected an object"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(ApplyModelOverrides, ConfigThatIsNotAnObjectIsAClearError) {
  const std::string msg = override_error(nlohmann::json::array({1, 2}), {"model.cem.steps=2"});
  EXPECT_NE(msg.find("expected a JSON object"), std::string::npos) << msg;
}

TEST(ApplyModelOverrides, InvalidUtf8ValueIsAClearError) {
  // Was nlohmann's type_error 316 from dump() while formatting the wrong-type message.
  const std::string msg = override_error(to_json(ModelConfig{}), {"model.cem.steps=\xff\xfe"});
  EXPECT_NE(msg.find("cem.steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cemfrac

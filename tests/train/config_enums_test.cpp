// Enum-valued config fields (core/fields.h EnumNames): the names are read once, where a config is
// read (TOML, --set, config.json), an unknown one is a one-line error naming the key, the value and
// the valid names, and the files keep the strings they had when these fields were strings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/model/model_config.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/run_config.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

#define EXPECT_CONTAINS(haystack, needle)               \
  EXPECT_NE((haystack).find(needle), std::string::npos) \
      << "expected '" << (needle) << "' in: " << (haystack)

// The error of `f()`; fails the test when it does not throw or the message is not one line.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    return message;
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

// Both fixtures were written by cemfrac before these fields became enums (commit b0f289e, `cemfrac
// train` of a one-layer cem_attention + cffn model with a non-default name in every enum field):
// the checkpoint's config.json and the run directory's config.toml (which later gained the lines
// of the train fields added since, train.device and train.precision, at their defaults). Both
// later gained cem.eta_init and cem.attention at their defaults.
const char kJsonFixture[] = "tests/fixtures/enum_fields_config.json";
const char kTomlFixture[] = "tests/fixtures/enum_fields_config.toml";

TEST(ConfigEnums, ConfigJsonWrittenAsStringsReadsAndWritesBackByteIdentical) {
  const std::string text = test::read_file(test::source_path(kJsonFixture));
  const ModelConfig c = model_config_from_json(nlohmann::json::parse(text), kJsonFixture);
  EXPECT_EQ(c.norm, NormKind::kLayerNorm);
  EXPECT_EQ(c.positions, Positions::kLearned);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.cem.rope_mode, CemRopeMode::kNaive);
  EXPECT_EQ(c.cem.dlr, CemDiagonal::kPerHead);
  EXPECT_EQ(c.cem.mlp_form, CemMlpForm::kB);
  EXPECT_EQ(c.cem.recursion, CemRecursion::kDirect);
  EXPECT_EQ(c.cem.recursion_keys, CemRecursionKeys::kIterate);
  EXPECT_EQ(c.cem.prox, CemProxMode::kLearned);
  EXPECT_EQ(c.cem.step_norm, CemStepNorm::kRms);
  EXPECT_EQ(c.cofrgenet.impl, ContinuantImpl::kLiteral);
  EXPECT_EQ(c.cofrgenet.backward, ContinuantBackward::kExact);
  EXPECT_EQ(c.cofrgenet.gate, CffnGate::kSilu);
  EXPECT_EQ(c.cofrgenet.sparse_pattern, SparsePattern::kStrided);
  // What checkpoint.cpp writes as config.json.
  EXPECT_EQ(to_json(c).dump(2) + "\n", text);
  EXPECT_EQ(model_config_from_json(to_json(c)), c);
  ModelConfig other = c;
  other.cem.dlr = CemDiagonal::kShared;
  EXPECT_NE(other, c);
}

TEST(ConfigEnums, ConfigTomlWrittenAsStringsReadsAndWritesBackByteIdentical) {
  const std::string path = test::source_path(kTomlFixture);
  const RunConfig config = load_run_config(path);
  EXPECT_EQ(config.model.cofrgenet.gate, CffnGate::kSilu);
  EXPECT_EQ(to_toml(config), test::read_file(path));
}

// Every name of every enum field reads back as its value, through config.json and --set.
struct EveryName {
  std::string prefix;
  std::vector<std::pair<std::string, std::string>>* out;  // (dotted key, name)
  template <typename F>
  void operator()(const char* key, F& field, const char*, OnCheckpoint = OnCheckpoint::kFixed) {
    if constexpr (HasEnumNames<F>::value) {
      for (const auto& [value, name] : EnumNames<F>::kNames) {
        (void)value;
        out->emplace_back(prefix + key, name);
      }
    }
    if constexpr (HasVisitFields<F>::value) {
      EveryName nested{prefix + key + ".", out};
      field.visit_fields(nested);
    }
  }
};

TEST(ConfigEnums, EveryNameReadsBack) {
  std::vector<std::pair<std::string, std::string>> names;
  ModelConfig probe;
  EveryName collector{"", &names};
  probe.visit_fields(collector);
  EXPECT_GE(names.size(), 2u * 15) << "15 enum fields, at least two names each";
  ModelConfig base;
  base.mixer = "cem_attention";
  base.ffn = "cem_mlp";
  base.cem.dlr = CemDiagonal::kPerHead;  // lets cem.dlr_distance stay valid either way
  for (const auto& [key, name] : names) {
    SCOPED_TRACE(key + " = " + name);
    ModelConfig b = base;
    if (key == "cem.attention") b.cem.dlr = CemDiagonal::kNone;  // linear has no D+LR form
    nlohmann::json j = to_json(b);
    nlohmann::json* node = &j;
    for (size_t start = 0;;) {
      const size_t dot = key.find('.', start);
      if (dot == std::string::npos) {
        (*node)[key.substr(start)] = name;
        break;
      }
      node = &(*node)[key.substr(start, dot - start)];
      start = dot + 1;
    }
    const ModelConfig from_json = model_config_from_json(j);
    EXPECT_EQ(to_json(from_json), j);
    ModelConfig from_set = b;
    override_model_fields(from_set, {"model." + key + "=" + name});
    EXPECT_EQ(from_set, from_json);
  }
}

TEST(ConfigEnums, UnknownNamesAreRefusedWithTheValidNames) {
  // TOML: file:line, the key, the value as written, the valid names in table order.
  struct Case {
    std::string toml, key_and_value, valid;
  };
  const std::vector<Case> cases = {
      {"positions = \"alibi\"", "model.positions = \"alibi\"", "valid: learned, rope, none"},
      {"norm = \"batchnorm\"", "model.norm = \"batchnorm\"", "valid: layernorm, rmsnorm"},
      {"rope_scaling = { type = \"yarn\" }", "model.rope_scaling.type = \"yarn\"",
       "valid: none, llama3"},
      {"cem = { dlr = \"diag\" }", "model.cem.dlr = \"diag\"", "valid: none, per_head, shared"},
      {"cofrgenet = { gate = \"relu\" }", "model.cofrgenet.gate = \"relu\"",
       "valid: sigmoid, silu"},
  };
  const std::string dir = test::temp_dir("config-enums");
  for (const Case& k : cases) {
    SCOPED_TRACE(k.toml);
    const std::string path = dir + "/bad.toml";
    test::write_file(path, "[model]\nd_model = 32\n" + k.toml + "\n");
    const std::string e = error_of([&] { load_run_config(path); });
    EXPECT_CONTAINS(e, path + ":3: " + k.key_and_value + ": unknown; " + k.valid);
  }
  // --set names the override.
  const std::string set = error_of([] { with_overrides(RunConfig{}, {"model.cem.prox=on"}); });
  EXPECT_CONTAINS(set,
                  "--set model.cem.prox=on: model.cem.prox = \"on\": unknown; valid: none, "
                  "learned, fixed");
  // --set on a checkpoint (eval / generate) also names the checkpoint.
  EXPECT_CONTAINS(error_of([] {
                    apply_model_overrides(to_json(ModelConfig{}), {"model.cem.rope_mode=rotary"},
                                          "ckpt/config.json");
                  }),
                  "ckpt/config.json with --set model.cem.rope_mode=rotary: model.cem.rope_mode = "
                  "\"rotary\": unknown; valid: exact, naive, none");
  // A name where a string belongs, but not a string.
  const std::string type = error_of([&] {
    test::write_file(dir + "/type.toml", "[model]\npositions = 1\n");
    load_run_config(dir + "/type.toml");
  });
  EXPECT_CONTAINS(type, "model.positions = 1: expected a string");
  // config.json: the document, the dotted key, the value.
  nlohmann::json j = to_json(ModelConfig{});
  j["cofrgenet"]["sparse_pattern"] = "random";
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(j, "ckpt/config.json"); }),
                  "ckpt/config.json: cofrgenet.sparse_pattern = \"random\": unknown; valid: "
                  "fixed, strided");
  j = to_json(ModelConfig{});
  j["rope_scaling"]["type"] = 3;
  EXPECT_CONTAINS(error_of([&] { model_config_from_json(j, "ckpt/config.json"); }),
                  "ckpt/config.json: rope_scaling.type = 3: expected a string");
  // Names from elsewhere (a flag) in the same words.
  EXPECT_EQ(error_of([] { parse_enum<Positions>("learnt", "--positions"); }),
            "--positions = \"learnt\": unknown; valid: learned, rope, none");
}

}  // namespace
}  // namespace cemfrac

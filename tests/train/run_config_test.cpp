// Run configs: every preset loads; print -> parse gives the same config; unknown keys, wrong types
// and bad values are one-line errors naming the key, the value and file:line; --set overrides with
// the same checks; config.json round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cemfrac/train/run_config.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

std::string write_config(const std::string& text) {
  static int counter = 0;
  const std::string path =
      test::temp_dir("run-config") + "/c" + std::to_string(counter++) + ".toml";
  test::write_file(path, text);
  return path;
}

// The error message of loading `text` (with `overrides`); fails the test when it loads.
std::string load_error(const std::string& text, const std::vector<std::string>& overrides = {},
                       std::string* path_out = nullptr) {
  const std::string path = write_config(text);
  if (path_out) *path_out = path;
  try {
    load_run_config(path, overrides);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    return message;
  }
  ADD_FAILURE() << "expected an error for:\n" << text;
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)               \
  EXPECT_NE((haystack).find(needle), std::string::npos) \
      << "expected '" << (needle) << "' in: " << (haystack)

const char kSmall[] = "[model]\nd_model = 64\nn_heads = 4\nn_layers = 2\n\n[train]\nsteps = 7\n";

std::vector<std::string> preset_paths() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("configs"))) {
    if (entry.path().extension() == ".toml") paths.push_back(entry.path().string());
  }
  return paths;
}

TEST(RunConfig, EveryPresetLoadsAndRoundTrips) {
  const auto paths = preset_paths();
  EXPECT_GE(paths.size(), 8u);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    const RunConfig a = load_run_config(path);
    const std::string printed = to_toml(a);
    const RunConfig b = load_run_config(write_config(printed));
    EXPECT_TRUE(a.model == b.model);
    EXPECT_EQ(printed, to_toml(b));
  }
}

TEST(RunConfig, ReadsValuesAndKeepsDefaults) {
  const RunConfig c = load_run_config(write_config(kSmall));
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.model.vocab_size, ModelConfig{}.vocab_size);
  EXPECT_EQ(c.data.path, "data/brown");
}

TEST(RunConfig, UnknownKeyNamesKeyAndLine) {
  std::string path;
  const std::string e = load_error("[model]\nd_model = 64\nd_modle = 64\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":3");
  EXPECT_CONTAINS(e, "model.d_modle");
  EXPECT_CONTAINS(e, "d_model");  // the known keys are listed
}

TEST(RunConfig, UnknownSection) {
  std::string path;
  const std::string e = load_error("[model]\nd_model = 64\n\n[optim]\nlr = 1\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":4");
  EXPECT_CONTAINS(e, "[optim]");
}

TEST(RunConfig, WrongTypeNamesKeyValueAndLine) {
  std::string path;
  std::string e = load_error("[model]\n\nd_model = \"big\"\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":3");
  EXPECT_CONTAINS(e, "model.d_model = \"big\"");
  EXPECT_CONTAINS(e, "expected an integer");
  e = load_error("[model]\nbias = 1\n");
  EXPECT_CONTAINS(e, "model.bias = 1: expected true or false");
  e = load_error("[train]\nlr_max = \"fast\"\n");
  EXPECT_CONTAINS(e, "train.lr_max = \"fast\": expected a number");
}

TEST(RunConfig, BadValueNamesKeyValueAndLine) {
  std::string path;
  std::string e = load_error("[model]\nd_model = 64\nn_heads = 5\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":3");
  EXPECT_CONTAINS(e, "model.n_heads = 5");
  e = load_error("[model]\nmixer = \"attention\"\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":2");
  EXPECT_CONTAINS(e, "mixer = \"attention\"");
  EXPECT_CONTAINS(e, "mha");  // the valid kinds are listed
  e = load_error("[model]\nffn = \"relu\"\n");
  EXPECT_CONTAINS(e, "swiglu");
  e = load_error("[model]\nnorm = \"batchnorm\"\n");
  EXPECT_CONTAINS(e, "rmsnorm");
  e = load_error("[model]\npositions = \"alibi\"\n");
  EXPECT_CONTAINS(e, "model.positions = \"alibi\"");
  e = load_error("[train]\nsteps = 0\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":2: train.steps = 0");
  e = load_error("[train]\nbeta2 = 1.5\n");
  EXPECT_CONTAINS(e, "train.beta2 = 1.5");
}

TEST(RunConfig, SyntaxErrorGivesLine) {
  std::string path;
  const std::string e = load_error("[model]\nd_model = = 3\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":2");
}

// toml++ 3.3.0 has undefined behaviour on a non-ASCII character where it skips whitespace (the fuzz
// finding kept in fuzz/known/); such text is invalid TOML, and it must be refused before toml++
// reads it.
TEST(RunConfig, NonAsciiOutsideStringsIsRefusedBeforeTomlSeesIt) {
  std::string path;
  // The fuzz finding itself: '[', U+FEFD, "GR", 0x13, NUL, "# ", NUL, '['.
  const std::string finding("[\xEF\xBB\xBDGR\x13\x00# \x00[", 12);
  std::string e = load_error(finding, {}, &path);
  EXPECT_CONTAINS(e, path + ":1:2: a non-ASCII character outside a string or comment");
  e = load_error("[train]\nsteps\xC2\xA0= 3\n", {}, &path);  // a no-break space as whitespace
  EXPECT_CONTAINS(e, path + ":2:6:");
  e = load_error("[data]\npath = \"\"\"\\\n   \xC3\xA9t\xC3\xA9\"\"\"\n", {}, &path);
  EXPECT_CONTAINS(e, path + ":3:4: a non-ASCII character right after a line-ending backslash");

  // Inside strings and comments it is valid TOML and read as text.
  const RunConfig c =
      load_run_config(write_config("\xEF\xBB\xBF# caf\xC3\xA9 \xE2\x80\x94 comment\n[data]\n"
                                   "path = \"donn\xC3\xA9"
                                   "es/\\\"q\\\"\" # \xC3\xA9\n[train]\nsteps = 3\n"),
                      {});
  EXPECT_EQ(c.data.path,
            "donn\xC3\xA9"
            "es/\"q\"");
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(load_run_config(write_config("[data]\npath = '\xC3\xA9\\'\n"), {}).data.path,
            "\xC3\xA9\\");
  const std::string multi =
      write_config("[data]\npath = \"\"\"caf\xC3\xA9\"\"\"\"\n[train]\nsteps = 4 # '\xC3\xA9\n");
  const RunConfig m = load_run_config(multi, {});
  EXPECT_EQ(m.data.path, "caf\xC3\xA9\"");
  EXPECT_EQ(m.train.steps, 4);

  // A --set value is parsed as TOML first and taken as a plain string when that fails: a non-ASCII
  // unquoted value must take the second path without toml++ reading it.
  const RunConfig d = load_run_config(write_config(kSmall), {"data.path=/tmp/donn\xC3\xA9"
                                                             "es"});
  EXPECT_EQ(d.data.path,
            "/tmp/donn\xC3\xA9"
            "es");
}

TEST(RunConfig, SetOverridesAndIsValidated) {
  const std::string path = write_config(kSmall);
  RunConfig c =
      load_run_config(path, {"train.steps=20", "model.mixer=mha", "model.ffn=\"gelu_mlp\"",
                             "train.lr_max=1e-3", "model.bias=true", "data.path=data/x"});
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.model.mixer, "mha");
  EXPECT_EQ(c.model.ffn, "gelu_mlp");
  EXPECT_DOUBLE_EQ(c.train.lr_max, 1e-3);
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.data.path, "data/x");
  // Later overrides win.
  EXPECT_EQ(load_run_config(path, {"train.steps=3", "train.steps=4"}).train.steps, 4);

  std::string e = load_error(kSmall, {"train.steps=abc"});
  EXPECT_CONTAINS(e, "--set train.steps=abc");
  EXPECT_CONTAINS(e, "expected an integer");
  e = load_error(kSmall, {"model.n_heads=5"});
  EXPECT_CONTAINS(e, "--set model.n_heads=5");
  EXPECT_CONTAINS(e, "must divide");
  e = load_error(kSmall, {"model.nope=1"});
  EXPECT_CONTAINS(e, "unknown key 'model.nope'");
  e = load_error(kSmall, {"optim.lr=1"});
  EXPECT_CONTAINS(e, "[optim]");
  e = load_error(kSmall, {"steps=3"});
  EXPECT_CONTAINS(e, "section.key=value");
  e = load_error(kSmall, {"model.mixer=cem"});
  EXPECT_CONTAINS(e, "unknown mixer kind");
  // Dotted keys reach into nested tables; a dotted path through a plain field is an error.
  e = load_error(kSmall, {"model.nope.steps=2"});
  EXPECT_CONTAINS(e, "unknown key 'model.nope'");
  e = load_error(kSmall, {"model.d_model.x=2"});
  EXPECT_CONTAINS(e, "model.d_model");
  EXPECT_CONTAINS(e, "expected an integer");
  e = load_error(kSmall, {"model..x=2"});
  EXPECT_CONTAINS(e, "section.key=value");
  // A nested table field through --set, and its checks.
  const RunConfig scaled =
      load_run_config(path, {"model.rope_scaling.type=llama3", "model.rope_scaling.factor=32"});
  EXPECT_EQ(scaled.model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(scaled.model.rope_scaling.factor, 32.0);
  EXPECT_EQ(scaled.model.rope_scaling.original_context, 8192) << "other fields keep their values";
  e = load_error(kSmall, {"model.rope_scaling.type=yarn"});
  EXPECT_CONTAINS(e, "--set model.rope_scaling.type=yarn");
  EXPECT_CONTAINS(e, "valid: none, llama3");
  e = load_error(kSmall, {"model.rope_scaling.type=llama3", "model.rope_scaling.factor=0.5"});
  EXPECT_CONTAINS(e, "rope_scaling.factor = 0.5");
  e = load_error(kSmall, {"model.rope_scaling.typo=1"});
  EXPECT_CONTAINS(e, "unknown key 'model.rope_scaling.typo'");
}

TEST(RunConfig, LayerOverridesAsArrayOfTables) {
  const std::string text =
      std::string(kSmall) + "\n[[model.layer_overrides]]\nlayer = 1\nffn = \"gelu_mlp\"\n";
  // [[model.layer_overrides]] after [train] reopens the model table: valid TOML.
  const RunConfig c = load_run_config(write_config(text));
  ASSERT_EQ(c.model.layer_overrides.size(), 1u);
  EXPECT_EQ(c.model.ffn_of(1), "gelu_mlp");
  EXPECT_EQ(c.model.ffn_of(0), "swiglu");
  EXPECT_EQ(c.model.mixer_of(1), "mha");
  // Inline form, via --set, and its checks.
  const RunConfig d =
      load_run_config(write_config(kSmall), {"model.layer_overrides=[{layer=0, mixer=\"mha\"}]"});
  EXPECT_EQ(d.model.layer_overrides.at(0).mixer, "mha");
  std::string e = load_error(std::string(kSmall) +
                             "\n[[model.layer_overrides]]\nlayer = 5\nffn = \"swiglu\"\n");
  EXPECT_CONTAINS(e, "model.layer_overrides[0].layer = 5");
  e = load_error(std::string(kSmall) +
                 "\n[[model.layer_overrides]]\nlayer = 1\nfnn = \"swiglu\"\n");
  EXPECT_CONTAINS(e, "model.layer_overrides[0].fnn");
  e = load_error(kSmall, {"model.layer_overrides=[{layer=1, ffn=3}]"});
  EXPECT_CONTAINS(e, "model.layer_overrides[0].ffn = 3: expected a string");
  // Round trip through to_toml.
  const RunConfig again = load_run_config(write_config(to_toml(c)));
  EXPECT_TRUE(again.model == c.model);
}

TEST(ModelConfigJson, RoundTripIsExact) {
  ModelConfig c;
  c.d_model = 96;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  c.init_std = 0.1 / 3;  // not a short decimal
  c.tie_embeddings = true;
  c.layer_overrides = {{1, "", "gelu_mlp"}};
  const std::string text = to_json(c).dump();
  const ModelConfig back = model_config_from_json(nlohmann::json::parse(text));
  EXPECT_TRUE(back == c);
  ModelConfig other = c;
  other.init_std = 0.0333;
  EXPECT_FALSE(other == c);  // equality sees every field
  other = c;
  other.layer_overrides[0].ffn = "swiglu";
  EXPECT_FALSE(other == c);
}

TEST(ModelConfigJson, RejectsUnknownKeysWrongTypesAndBadValues) {
  nlohmann::json j = to_json(ModelConfig{});
  auto error_of = [](const nlohmann::json& doc) -> std::string {
    try {
      model_config_from_json(doc, "ckpt/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json unknown = j;
  unknown["d_mdoel"] = 3;
  EXPECT_CONTAINS(error_of(unknown), "ckpt/config.json: unknown key 'd_mdoel'");
  nlohmann::json wrong = j;
  wrong["n_layers"] = "two";
  EXPECT_CONTAINS(error_of(wrong), "n_layers = \"two\": expected an integer");
  nlohmann::json bad = j;
  bad["n_heads"] = 3;
  EXPECT_CONTAINS(error_of(bad), "n_heads = 3");
  nlohmann::json nested = j;
  nested["layer_overrides"] = nlohmann::json::array({{{"layer", 0}, {"mixr", "mha"}}});
  EXPECT_CONTAINS(error_of(nested), "layer_overrides[0].mixr");
}

}  // namespace
}  // namespace cemfrac

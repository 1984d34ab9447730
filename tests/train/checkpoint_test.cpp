// Checkpoint directories: round trip, keep-last-N, resolution of --resume, and a clear error for
// every damaged or mismatched checkpoint.
#include "cemfrac/train/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

LoadOptions load_options(bool optimizer, const json* expected_config) {
  LoadOptions o;
  o.optimizer = optimizer;
  o.expected_config = expected_config;
  return o;
}

CheckpointContents contents(int64_t step) {
  CheckpointContents c;
  c.model["w"] = torch::full({2, 3}, static_cast<float>(step));
  c.model["b"] = torch::arange(3.0f);
  c.optimizer["w.exp_avg"] = torch::zeros({2, 3});
  c.optimizer_metadata = {{"groups", "{}"}};
  c.trainer.step = step;
  c.trainer.tokens = step * 100;
  c.trainer.data_seed = 77;
  c.trainer.loader = {{"epoch", 2}, {"index", 5}};
  c.trainer.torch_rng = torch_rng_state();
  c.trainer.schedule = {1e-3, 1e-4, 10, 100};
  c.trainer.lr = 5e-4;
  c.trainer.last_loss = 2.5;
  c.trainer.best_val_loss = 2.25;
  c.trainer.elapsed_s = 12.5;
  c.config = {{"d_model", 64}, {"n_layers", 2}, {"norm", "rmsnorm"}, {"nested", {{"a", 1}}}};
  return c;
}

// Expects fn() to throw one cemfrac::Error line containing every string of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line: " << msg;
  }
}

TEST(Checkpoint, RoundTrip) {
  const std::string run = test::temp_dir("ckpt_roundtrip");
  CheckpointContents c = contents(123);
  auto tok = make_tokenizer("byte");
  c.tokenizer = tok.get();
  const std::string dir = save_checkpoint(run, c, 2);
  EXPECT_EQ(dir, run + "/checkpoints/step-000123");
  for (const char* f : {kCheckpointModelFile, kCheckpointOptimizerFile, kCheckpointTrainerFile,
                        kCheckpointConfigFile})
    EXPECT_TRUE(fs::is_regular_file(fs::path(dir) / f)) << f;
  const Checkpoint loaded = load_checkpoint(dir, load_options(true, &c.config));
  EXPECT_EQ(loaded.config, c.config);
  EXPECT_TRUE(torch::equal(loaded.model.tensors.at("w"), c.model["w"]));
  EXPECT_TRUE(torch::equal(loaded.optimizer.tensors.at("w.exp_avg"), c.optimizer["w.exp_avg"]));
  EXPECT_EQ(loaded.optimizer.metadata.at("groups"), "{}");
  const TrainerState& t = loaded.trainer;
  EXPECT_EQ(t.step, 123);
  EXPECT_EQ(t.tokens, 12300);
  EXPECT_EQ(t.data_seed, 77u);
  EXPECT_EQ(t.loader, (nlohmann::json{{"epoch", 2}, {"index", 5}}));
  EXPECT_EQ(t.torch_rng, c.trainer.torch_rng);
  EXPECT_EQ(t.schedule.warmup_steps, 10);
  EXPECT_EQ(t.schedule.total_steps, 100);
  EXPECT_EQ(t.lr, 5e-4);
  EXPECT_EQ(t.last_loss, 2.5);
  EXPECT_FALSE(t.last_val_loss.has_value());
  EXPECT_EQ(t.best_val_loss, 2.25);
  EXPECT_EQ(t.elapsed_s, 12.5);
  ASSERT_TRUE(loaded.has_tokenizer);
  EXPECT_EQ(load_tokenizer(dir + "/tokenizer")->id(), "byte");
  // Eval and generate skip the optimizer.
  EXPECT_TRUE(load_checkpoint(dir, load_options(false, nullptr)).optimizer.tensors.empty());
}

// Fuzz finding (trainer_json): a 'format' that is a number made j.value("format", std::string())
// throw nlohmann's type_error 302, an "internal error", instead of naming the file.
TEST(Checkpoint, NonStringFormatIsAClearError) {
  for (const char* text :
       {R"({"format": 10240, "data_seed": 5071, "best_val_loss": 4.75})", R"({"format": null})",
        R"({"format": ["cemfrac-checkpoint"]})", R"({})"}) {
    try {
      (void)trainer_state_from_json(nlohmann::json::parse(text), "trainer.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("trainer.json: 'format' is not"), std::string::npos)
          << e.what();
    }
  }
}

// Fuzz finding (trainer_json): "data_seed": 1.234e55 (a float, as JSON reads an integer beyond
// uint64) reached nlohmann's float-to-integer cast, undefined behaviour; now a wrong-type error.
TEST(Checkpoint, FloatInAnIntegerFieldIsAClearError) {
  ::cemfrac::TrainerState state;
  nlohmann::json good = trainer_state_to_json(state);
  for (const char* key : {"data_seed", "step", "tokens", "format_version"}) {
    for (const nlohmann::json& bad :
         {nlohmann::json(1.234e55), nlohmann::json(3.5), nlohmann::json(-1e300)}) {
      nlohmann::json j = good;
      j[key] = bad;
      try {
        (void)trainer_state_from_json(j, "trainer.json");
        ADD_FAILURE() << key << " = " << bad.dump() << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("field '") + key + "' has the wrong type"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(Checkpoint, TorchRngStateRoundTrip) {
  torch::manual_seed(99);
  const std::string state = torch_rng_state();
  const torch::Tensor a = torch::randn({5});
  set_torch_rng_state(state, "t");
  EXPECT_TRUE(torch::equal(torch::randn({5}), a));
  expect_error([] { set_torch_rng_state("AAAA", "trainer.json"); }, {"trainer.json", "RNG"});
}

// The GPUs' generator states, as far as a machine without one can check: one state per visible GPU
// (none here), a saved list of two round-trips through trainer.json exactly, and states of GPUs that
// are not there are ignored on resume (the run resumes; no value depends on them). The device side
// (draw, restore, draw the same) is tests/cuda/model_cuda_test.cpp's.
TEST(Checkpoint, CudaRngStatesRoundTripAndAbsentGpusAreIgnored) {
  EXPECT_EQ(cuda_rng_states().size(), static_cast<size_t>(torch::cuda::device_count()));
  ::cemfrac::TrainerState state;
  state.cuda_rng = {"c3RhdGUtb2YtZ3B1LTA=", "c3RhdGUtb2YtZ3B1LTE="};
  const nlohmann::json j = trainer_state_to_json(state);
  EXPECT_EQ(trainer_state_from_json(j, "trainer.json").cuda_rng, state.cuda_rng);
  nlohmann::json older = j;
  older.erase("cuda_rng");  // checkpoints written before the field: no states, not an error
  EXPECT_TRUE(trainer_state_from_json(older, "trainer.json").cuda_rng.empty());
  if (torch::cuda::device_count() == 0) {
    EXPECT_NO_THROW(set_cuda_rng_states(state.cuda_rng, "trainer.json"));
  }
}

TEST(Checkpoint, Base64) {
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"})
    EXPECT_EQ(base64_decode(base64_encode(s), "x"), s);
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
  EXPECT_EQ(base64_decode(base64_encode(bytes), "x"), bytes);
  expect_error([] { base64_decode("Zm9", "trainer.json"); }, {"trainer.json", "multiple of 4"});
  expect_error([] { base64_decode("Zm!v", "trainer.json"); }, {"trainer.json", "offset 2"});
}

TEST(Checkpoint, KeepsTheLastNAndResolvesTheNewest) {
  const std::string run = test::temp_dir("ckpt_keep");
  for (int64_t step : {1, 2, 3, 10, 11}) save_checkpoint(run, contents(step), 2);
  const auto left = list_checkpoints(run);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 10);
  EXPECT_EQ(left[1].first, 11);
  // A stray temporary (a killed writer) is neither listed nor resolved.
  fs::create_directories(run + "/checkpoints/step-000012.tmp-1-abc");
  EXPECT_EQ(resolve_checkpoint(run), run + "/checkpoints/step-000011");
  EXPECT_EQ(resolve_checkpoint(run + "/checkpoints"), run + "/checkpoints/step-000011");
  EXPECT_EQ(resolve_checkpoint(run + "/checkpoints/step-000010"), run + "/checkpoints/step-000010");
  // Steps sort numerically, not as text.
  save_checkpoint(run, contents(1000000), 0);
  EXPECT_EQ(resolve_checkpoint(run), run + "/checkpoints/step-1000000");
  EXPECT_EQ(list_checkpoints(run).size(), 3u) << "keep = 0 keeps all";
  expect_error([&] { resolve_checkpoint(test::temp_dir("ckpt_empty")); },
               {"ckpt_empty", "run directory"});
  expect_error([] { resolve_checkpoint("/nonexistent/run"); }, {"/nonexistent/run", "no such"});
}

class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = test::temp_dir("ckpt_damaged");
    c_ = contents(7);
    dir_ = save_checkpoint(run_, c_, 0);
  }
  std::string file(const char* name) const { return dir_ + "/" + name; }
  void load() const { load_checkpoint(dir_, load_options(true, &c_.config)); }
  void edit_trainer(const std::function<void(json&)>& edit) {
    json j = json::parse(read_file(file(kCheckpointTrainerFile)));
    edit(j);
    test::write_file(file(kCheckpointTrainerFile), j.dump());
  }
  std::string run_, dir_;
  CheckpointContents c_;
};

TEST_F(DamagedCheckpoint, IntactLoads) {
  EXPECT_NO_THROW(load());
}

TEST_F(DamagedCheckpoint, MissingFiles) {
  for (const char* f : {kCheckpointModelFile, kCheckpointOptimizerFile, kCheckpointConfigFile,
                        kCheckpointTrainerFile}) {
    SCOPED_TRACE(f);
    const std::string bytes = read_file(file(f));
    fs::remove(file(f));
    expect_error([&] { load(); }, {dir_, f, "missing"});
    test::write_file(file(f), bytes);
  }
}

TEST_F(DamagedCheckpoint, TruncatedModel) {
  const std::string bytes = read_file(file(kCheckpointModelFile));
  test::write_file(file(kCheckpointModelFile), bytes.substr(0, bytes.size() - 4));
  expect_error([&] { load(); }, {file(kCheckpointModelFile), "truncated"});
}

TEST_F(DamagedCheckpoint, CorruptedModelHeader) {
  std::string bytes = read_file(file(kCheckpointModelFile));
  bytes[8] = '#';  // the header's opening brace
  test::write_file(file(kCheckpointModelFile), bytes);
  expect_error([&] { load(); }, {file(kCheckpointModelFile), "JSON"});
}

TEST_F(DamagedCheckpoint, TrainerJsonProblems) {
  test::write_file(file(kCheckpointTrainerFile), "{ not json");
  expect_error([&] { load(); }, {file(kCheckpointTrainerFile), "not valid JSON"});
  test::write_file(file(kCheckpointTrainerFile), trainer_state_to_json(c_.trainer).dump());
  edit_trainer([](json& j) { j["format"] = "something-else"; });
  expect_error([&] { load(); }, {file(kCheckpointTrainerFile), "not a cemfrac checkpoint"});
  test::write_file(file(kCheckpointTrainerFile), trainer_state_to_json(c_.trainer).dump());
  edit_trainer([](json& j) { j["format_version"] = 99; });
  expect_error([&] { load(); }, {file(kCheckpointTrainerFile), "version 99", "reads version 1"});
  test::write_file(file(kCheckpointTrainerFile), trainer_state_to_json(c_.trainer).dump());
  edit_trainer([](json& j) { j.erase("step"); });
  expect_error([&] { load(); }, {file(kCheckpointTrainerFile), "missing field 'step'"});
  test::write_file(file(kCheckpointTrainerFile), trainer_state_to_json(c_.trainer).dump());
  edit_trainer([](json& j) { j["loader"] = "x"; });
  expect_error([&] { load(); }, {file(kCheckpointTrainerFile), "'loader'", "wrong type"});
  // What is inside the cursor belongs to the training data, which checks it on resume
  // (Trainer.RefusesADamagedDataCursor).
}

TEST_F(DamagedCheckpoint, ConfigDisagreeingWithTheRun) {
  json other = c_.config;
  other["d_model"] = 128;
  expect_error([&] { load_checkpoint(dir_, load_options(false, &other)); },
               {file(kCheckpointConfigFile), "field 'd_model' is 64 but the run's model has 128"});
  other = c_.config;
  other["nested"]["a"] = 2;
  expect_error([&] { load_checkpoint(dir_, load_options(false, &other)); },
               {"field 'nested.a' is 1"});
  other = c_.config;
  other["bias"] = true;
  expect_error([&] { load_checkpoint(dir_, load_options(false, &other)); },
               {"field 'bias' is missing"});
  other = c_.config;
  other.erase("norm");
  expect_error([&] { load_checkpoint(dir_, load_options(false, &other)); },
               {"field 'norm' = \"rmsnorm\" is unknown"});
  other = c_.config;
  other["d_model"] = 64.0;  // the same value written as a float is not a difference
  EXPECT_NO_THROW(load_checkpoint(dir_, load_options(false, &other)));
}

TEST(Checkpoint, IncompleteCheckpointsAreSkippedAndStaleTemporariesRemoved) {
  const std::string run = test::temp_dir("ckpt_partial");
  const std::string ck = run + "/checkpoints/";
  save_checkpoint(run, contents(2), 0);
  save_checkpoint(run, contents(5), 0);
  fs::remove(ck + "step-000005/model.safetensors");  // cut short (by a copy, say)
  fs::create_directories(ck + "step-000009");        // made by hand
  EXPECT_EQ(checkpoint_problem(ck + "step-000002"), "");
  EXPECT_EQ(checkpoint_problem(ck + "step-000005"), "model.safetensors is missing");
  EXPECT_EQ(checkpoint_problem(ck + "step-000009"), "empty directory");
  testing::internal::CaptureStderr();
  EXPECT_EQ(resolve_checkpoint(run), ck + "step-000002");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("skipped incomplete checkpoint " + ck +
                     "step-000009 (empty directory); using " + ck + "step-000002"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(ck + "step-000005 (model.safetensors is missing)"), std::string::npos) << err;

  // Pruning counts and deletes complete checkpoints only.
  save_checkpoint(run, contents(3), 1);
  EXPECT_FALSE(fs::exists(ck + "step-000002"));
  EXPECT_TRUE(fs::exists(ck + "step-000003"));
  EXPECT_TRUE(fs::exists(ck + "step-000005"));
  EXPECT_TRUE(fs::exists(ck + "step-000009"));
  fs::remove_all(ck + "step-000003");
  expect_error([&] { resolve_checkpoint(run); }, {"no complete checkpoint", "step-000009"});

  // Temporaries of dead writers go (pid 99999999 is above any pid_max); a live writer's stay.
  const std::string live = fmt::format("{}step-000012.tmp-{}-abc", ck, getppid());
  for (const std::string& d :
       {ck + "step-000010.tmp-99999999-abc", ck + "step-000011.tmp-99999999-abc.old", live})
    fs::create_directories(d + "/inner");
  test::write_file(ck + "notes.tmp-99999999-abc", "not a checkpoint temporary");
  EXPECT_EQ(clean_stale_temporaries(run),
            (std::vector<std::string>{ck + "step-000010.tmp-99999999-abc",
                                      ck + "step-000011.tmp-99999999-abc.old"}));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(ck + "notes.tmp-99999999-abc"));
  EXPECT_FALSE(fs::exists(ck + "step-000010.tmp-99999999-abc"));
}

}  // namespace
}  // namespace cemfrac

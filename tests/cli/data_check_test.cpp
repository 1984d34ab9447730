// What train, eval and generate check before they use outside data: every shard a
// command opens is checked (header, tokenizer identity, end-of-text id, every token id, token CRC)
// before the first step; weights are finite and of the model's dtype; padding ids are never
// sampled; bad flags are refused before anything runs. Each failure is one line with a non-zero
// exit.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "cemfrac/data/shard.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;
using test::expect_one_line_error;
using test::run_cemfrac;

// A prepared dataset with the byte tokenizer (257 ids): tokenizer/, meta.json and three shards of
// 40 documents of 30 bytes each.
std::string make_prepared(const std::string& tag) {
  const std::string dir = test::temp_dir(tag);
  auto tok = make_tokenizer("byte");
  tok->save(dir + "/tokenizer");
  test::write_file(dir + "/meta.json", "{}");
  std::vector<std::vector<TokenId>> docs;
  for (int d = 0; d < 40; ++d) {
    std::vector<TokenId> doc;
    for (int i = 0; i < 30; ++i) doc.push_back(static_cast<TokenId>('a' + (d * 7 + i * 3) % 26));
    docs.push_back(doc);
  }
  const ShardInfo info{tok->vocab_size(), tok->eot_id(), tok->id()};
  for (const char* split : {"train", "val", "test"})
    write_shard(dir + "/" + split + ".bin", info, docs);
  return dir;
}

// Overwrites uint16 token `index` of a shard, then (unless stale_crc) restores a valid token CRC.
void set_token(const std::string& path, size_t index, uint16_t id, bool stale_crc = false) {
  std::string bytes = test::read_file(path);
  bytes[kShardHeaderSize + 2 * index] = static_cast<char>(id & 0xff);
  bytes[kShardHeaderSize + 2 * index + 1] = static_cast<char>(id >> 8);
  if (!stale_crc) {
    const uint32_t crc =
        crc32_update(0, bytes.data() + kShardHeaderSize, bytes.size() - kShardHeaderSize);
    ShardHeader h = ShardReader(path).header();
    h.tokens_crc32 = crc;
    bytes.replace(0, kShardHeaderSize, encode_shard_header(h));
  }
  test::write_file(path, bytes);
}

// Rewrites a shard's header fields (checksums valid).
void set_header(const std::string& path, const std::function<void(ShardHeader&)>& change) {
  std::string bytes = test::read_file(path);
  ShardHeader h = ShardReader(path).header();
  change(h);
  bytes.replace(0, kShardHeaderSize, encode_shard_header(h));
  test::write_file(path, bytes);
}

// A tiny run config over `data` writing to `out`; vocab_size 512 > 257 (padding rows, as the tiny
// presets have).
std::string make_config(const std::string& dir, const std::string& data, const std::string& out) {
  const std::string path = dir + "/run.toml";
  test::write_file(path,
                   "[model]\nvocab_size = 512\nd_model = 16\nn_layers = 1\nn_heads = 2\n"
                   "d_ff = 32\ncontext = 16\nmixer = \"mha\"\nffn = \"gelu_mlp\"\n"
                   "norm = \"layernorm\"\npositions = \"learned\"\nbias = true\n"
                   "tie_embeddings = true\n[data]\npath = \"" +
                       data +
                       "\"\n"
                       "[train]\nsteps = 1\nmicro_batch = 2\nlr_max = 1e-3\nlr_min = 1e-4\n"
                       "warmup_steps = 0\nlog_every = 1\neval_every = 0\neval_tokens = 64\n"
                       "checkpoint_every = 0\nout = \"" +
                       out + "\"\n");
  return path;
}

// A checkpoint of an untrained 512-row model with the byte tokenizer (written in process).
std::string make_checkpoint(const std::string& tag, int64_t context = 16) {
  ModelConfig c;
  c.vocab_size = 512;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.d_ff = 32;
  c.context = context;
  torch::manual_seed(3);
  LmModel model(c);
  return test::save_byte_checkpoint(model, tag);
}

std::vector<std::string> train_args(const std::string& config) {
  return {"train", "--config", config, "--quiet"};
}

// Item 1: a stale token CRC (token bytes changed after prepare) is refused by train and eval before
// anything runs; --no-verify-data is the explicit opt-out.
TEST(DataCheck, StaleTokenChecksumIsRefusedBeforeTheFirstStep) {
  const std::string data = make_prepared("dc_crc");
  const std::string run = test::temp_dir("dc_crc_run") + "/run";
  const std::string config = make_config(fs::path(run).parent_path().string(), data, run);
  set_token(data + "/train.bin", 5, 'z', /*stale_crc=*/true);
  const test::RunResult r = run_cemfrac(train_args(config));
  expect_one_line_error(r, data + "/train.bin: token checksum mismatch");
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl")) << "no step may run on corrupt data";
  EXPECT_TRUE(list_checkpoints(run).empty());
  const test::RunResult skipped = run_cemfrac(
      {"train", "--config", config, "--quiet", "--no-verify-data", "--out", run + "-unchecked"});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.err;

  const std::string ckpt = make_checkpoint("dc_crc_ckpt");
  set_token(data + "/test.bin", 7, 'q', /*stale_crc=*/true);
  expect_one_line_error(run_cemfrac({"eval", "--checkpoint", ckpt, "--data", data + ":test"}),
                        data + "/test.bin: token checksum mismatch");
  EXPECT_EQ(
      run_cemfrac({"eval", "--checkpoint", ckpt, "--data", data + ":test", "--no-verify-data"})
          .exit_code,
      0);
}

// Items 1 and 2: an id at or above the tokenizer's vocabulary (below the model's 512, or above it)
// is refused before training or scoring, naming the file, the index and the id.
TEST(DataCheck, TokenIdsOutsideTheVocabularyAreRefusedUpFront) {
  const std::string data = make_prepared("dc_ids");
  const std::string dir = test::temp_dir("dc_ids_run");
  const std::string config = make_config(dir, data, dir + "/run");
  set_token(data + "/val.bin", 33, 300);  // 257 <= 300 < 512: the old code trained on it
  expect_one_line_error(
      run_cemfrac(train_args(config)),
      data + "/val.bin: token 300 at index 33 is not below the vocabulary size 257");
  set_token(data + "/val.bin", 33, 'a');
  set_token(data + "/train.bin", 100, 600);  // >= 512: the old code hit "index out of range"
  expect_one_line_error(
      run_cemfrac(train_args(config)),
      data + "/train.bin: token 600 at index 100 is not below the vocabulary size 257");
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
  const std::string ckpt = make_checkpoint("dc_ids_ckpt");
  set_token(data + "/test.bin", 12, 511);
  expect_one_line_error(run_cemfrac({"eval", "--checkpoint", ckpt, "--data", data + ":test"}),
                        data + "/test.bin: token 511 at index 12");
}

// Item 12: train and eval check the same header fields (one shared function): another tokenizer's
// name, or an end-of-text id that is not the tokenizer's, is refused by both.
TEST(DataCheck, HeaderTokenizerAndEndOfTextAreCheckedEverywhere) {
  const std::string data = make_prepared("dc_hdr");
  const std::string dir = test::temp_dir("dc_hdr_run");
  const std::string config = make_config(dir, data, dir + "/run");
  const std::string ckpt = make_checkpoint("dc_hdr_ckpt");
  for (const char* split : {"train", "test"})
    set_header(data + "/" + split + ".bin", [](ShardHeader& h) { h.tokenizer_id = "sp:257"; });
  expect_one_line_error(
      run_cemfrac(train_args(config)),
      data + "/train.bin: the shard was prepared with tokenizer 'sp:257', not the model's 'byte'");
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", ckpt, "--data", data + ":test"}),
      data + "/test.bin: the shard was prepared with tokenizer 'sp:257', not the model's 'byte'");
  for (const char* split : {"train", "test"})
    set_header(data + "/" + split + ".bin", [](ShardHeader& h) {
      h.tokenizer_id = "byte";
      h.eot_id = 0;
    });
  expect_one_line_error(
      run_cemfrac(train_args(config)),
      data + "/train.bin: end-of-text id 0 in the header differs from tokenizer 'byte' (256)");
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", ckpt, "--data", data + ":test"}),
      data + "/test.bin: end-of-text id 0 in the header differs from tokenizer 'byte' (256)");
}

// Item 3: the model has 512 rows but the byte tokenizer 257 ids; an untrained model puts about half
// its mass on the padding rows, so the old code drew one within a few tokens and aborted.
TEST(DataCheck, GenerateNeverSamplesPaddingIds) {
  const std::string ckpt = make_checkpoint("dc_pad", /*context=*/128);
  for (const char* temperature : {"1", "0"}) {
    const test::RunResult r =
        run_cemfrac({"generate", "--checkpoint", ckpt, "--prompt", "ab", "--max-new-tokens", "100",
                     "--temperature", temperature, "--top-p", "1", "--no-stop", "--seed", "5"});
    EXPECT_EQ(r.exit_code, 0) << "temperature " << temperature << ": " << r.err;
  }
}

// Item 8: non-finite weights are refused on load, naming the file and the tensor.
TEST(DataCheck, NonFiniteWeightsAreRefusedOnLoad) {
  const std::string ckpt = make_checkpoint("dc_nan");
  const std::string file = ckpt + "/" + kCheckpointModelFile;
  SafetensorsFile weights = load_safetensors(file);
  const std::string name = weights.tensors.begin()->first;
  weights.tensors.begin()->second.view({-1})[3] = std::numeric_limits<float>::quiet_NaN();
  save_safetensors(file, weights.tensors, weights.metadata);
  const std::string text = fs::path(ckpt).parent_path().string() + "/t.txt";
  test::write_file(text, "hello there\n");
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", ckpt, "--text", text}),
      file + ": tensor '" + name +
          "' holds 1 non-finite (NaN or Inf) value(s), the first at flat index 3");
  weights.tensors.begin()->second.view({-1})[3] = std::numeric_limits<float>::infinity();
  save_safetensors(file, weights.tensors, weights.metadata);
  expect_one_line_error(run_cemfrac({"generate", "--checkpoint", ckpt, "--temperature", "0"}),
                        "tensor '" + name + "' holds 1 non-finite");
}

// Item 12: flags are checked before anything is loaded or printed, with short messages naming the
// flag the user typed.
TEST(DataCheck, BadFlagsAreRefusedUpFrontNamingTheFlag) {
  // Inputs are checked first (a missing --text is named before the checkpoint is opened).
  expect_one_line_error(run_cemfrac({"eval", "--checkpoint", "nope", "--text", "x"}),
                        "--text x: no such file");
  const std::string early_text = test::temp_dir("dc_flags_early") + "/t.txt";
  test::write_file(early_text, "hello\n");
  expect_one_line_error(run_cemfrac({"eval", "--checkpoint", "nope", "--text", early_text}),
                        "--checkpoint nope: no such directory");
  expect_one_line_error(run_cemfrac({"generate", "--checkpoint", "nope"}),
                        "--checkpoint nope: no such directory");
  const std::string ckpt = make_checkpoint("dc_flags");
  const std::string text = fs::path(ckpt).parent_path().string() + "/t.txt";
  test::write_file(text, "hello there, general kenobi\n");
  expect_one_line_error(
      run_cemfrac({"eval", "--checkpoint", ckpt, "--text", text, "--stride", "-5"}), "--stride -5");
  const test::RunResult top_p =
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompt", "Hi", "--top-p", "0"});
  expect_one_line_error(top_p, "--top-p 0: must be in (0, 1]");
  EXPECT_EQ(top_p.out, "") << "nothing is printed before the refusal";
  const test::RunResult top_k = run_cemfrac({"generate", "--checkpoint", ckpt, "--top-k", "-1"});
  expect_one_line_error(top_k, "--top-k -1: must be >= 0");
  EXPECT_LT(top_k.err.size(), 120u) << top_k.err;
  // The prompt count says it includes the end-of-text every document starts after: 15 bytes of text
  // + 1 = 16 tokens = the context.
  expect_one_line_error(
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompt", "fifteen bytes!!"}),
      "the prompt is 16 tokens with byte (15 of text + the end-of-text id every document starts "
      "after)");
  const std::string data = make_prepared("dc_flags_data");
  const std::string dir = test::temp_dir("dc_flags_run");
  expect_one_line_error(run_cemfrac({"train", "--config", make_config(dir, data, dir + "/run"),
                                     "--stop-at-step", "-1"}),
                        "--stop-at-step -1: must be a step number >= 1");
}

}  // namespace
}  // namespace cemfrac

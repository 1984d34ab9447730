// `cemfrac generate --prompts FILE`: several prompts decoded as one batch (generate_batch), one
// JSON line per prompt; each prompt gets the text `--prompt` gives it alone, greedy and sampled;
// bad files are one-line errors.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/checkpoint.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::expect_one_line_error;
using test::run_cemfrac;

// An untrained Llama-flavoured 512-row model with the byte tokenizer, context 32 (written in
// process).
std::string make_llama_checkpoint(const std::string& tag) {
  ModelConfig c;
  c.vocab_size = 512;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.d_ff = 64;
  c.context = 32;
  c.norm = NormKind::kRmsNorm;
  c.positions = Positions::kRope;
  c.bias = false;
  c.tie_embeddings = false;
  torch::manual_seed(7);
  LmModel model(c);
  return test::save_byte_checkpoint(model, tag);
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// What a JSON line holds for raw text: invalid UTF-8 (an untrained byte model draws any byte)
// becomes U+FFFD, as `generate --prompts` writes it.
std::string as_json_text(const std::string& raw) {
  return nlohmann::json::parse(
             nlohmann::json(raw).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

TEST(GeneratePrompts, EachLineGetsWhatPromptGivesItAlone) {
  const std::string ckpt = make_llama_checkpoint("gp_solo");
  const std::string dir = test::temp_dir("gp_solo_in");
  // Different lengths (1 to 14 bytes), CRLF on one line, and no final newline.
  const std::vector<std::string> prompts = {"The jury", "a", "said that the", "x y",
                                            "Atlanta's own"};
  test::write_file(dir + "/p.txt", "The jury\na\r\nsaid that the\nx y\nAtlanta's own");
  for (const char* temperature : {"0", "1"}) {
    const std::vector<std::string> common = {"--max-new-tokens", "9",       "--temperature",
                                             temperature,        "--top-p", "0.9",
                                             "--seed",           "4",       "--no-stop"};
    std::vector<std::string> args = {"generate",     "--checkpoint", ckpt, "--prompts",
                                     dir + "/p.txt", "--batch-size", "3"};
    args.insert(args.end(), common.begin(), common.end());
    const test::RunResult batch = run_cemfrac(args);
    ASSERT_EQ(batch.exit_code, 0) << batch.err;
    // The keys in the order docs/formats.md gives.
    EXPECT_EQ(batch.out.rfind("{\"line\":1,\"prompt\":\"The jury\",\"completion\":", 0), 0u)
        << batch.out;
    const auto lines = json_lines(batch.out);
    ASSERT_EQ(lines.size(), prompts.size()) << batch.out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(lines[i]["line"].get<int64_t>(), int64_t(i + 1));
      EXPECT_EQ(lines[i]["prompt"].get<std::string>(), prompts[i]);
      EXPECT_EQ(lines[i]["new_tokens"].get<int64_t>(), 9);
      EXPECT_EQ(lines[i]["stop"].get<std::string>(), "max_new_tokens");
      std::vector<std::string> solo_args = {"generate", "--checkpoint", ckpt, "--prompt",
                                            prompts[i]};
      solo_args.insert(solo_args.end(), common.begin(), common.end());
      const test::RunResult solo = run_cemfrac(solo_args);
      ASSERT_EQ(solo.exit_code, 0) << solo.err;
      // --prompt prints the prompt, the continuation and a newline.
      ASSERT_EQ(solo.out.rfind(prompts[i], 0), 0u) << solo.out;
      ASSERT_EQ(solo.out.back(), '\n');
      const std::string text =
          solo.out.substr(prompts[i].size(), solo.out.size() - prompts[i].size() - 1);
      EXPECT_EQ(lines[i]["completion"].get<std::string>(), as_json_text(text))
          << "prompt " << i << " at temperature " << temperature;
    }
  }
}

TEST(GeneratePrompts, BadFilesAreOneLineErrors) {
  const std::string ckpt = make_llama_checkpoint("gp_bad");
  const std::string dir = test::temp_dir("gp_bad_in");
  expect_one_line_error(
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompts", dir + "/none.txt"}),
      "--prompts " + dir + "/none.txt: no such file");
  test::write_file(dir + "/empty.txt", "");
  expect_one_line_error(
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompts", dir + "/empty.txt"}),
      "--prompts " + dir + "/empty.txt: the file is empty");
  test::write_file(dir + "/blank.txt", "one\n\nthree\n");
  expect_one_line_error(
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompts", dir + "/blank.txt"}),
      "--prompts " + dir + "/blank.txt line 2: empty line");
  // 31 bytes + the end-of-text = 32 tokens = the context: no position left to generate into.
  test::write_file(dir + "/long.txt", "short\n" + std::string(31, 'z') + "\n");
  const test::RunResult long_prompt =
      run_cemfrac({"generate", "--checkpoint", ckpt, "--prompts", dir + "/long.txt"});
  expect_one_line_error(long_prompt,
                        "--prompts " + dir + "/long.txt line 2: the prompt is 32 tokens with byte");
  EXPECT_EQ(long_prompt.out, "") << "nothing is generated before the refusal";
  const test::RunResult both = run_cemfrac(
      {"generate", "--checkpoint", ckpt, "--prompt", "a", "--prompts", dir + "/blank.txt"});
  expect_one_line_error(both, "excludes");
}

}  // namespace
}  // namespace cemfrac

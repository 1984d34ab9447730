// `cemfrac tokenize`: ids on one line or as JSON, from stdin or --text, with byte, gpt2 or a saved
// tokenizer directory; --decode goes back exactly; errors are one line with a non-zero exit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cemfrac/data/tokenizer.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

using test::run_cemfrac;

using test::expect_one_line_error;

TEST(Tokenize, ByteFromStdin) {
  const auto r = run_cemfrac({"tokenize", "--tokenizer", "byte"}, "Hi!\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "72 105 33 10\n");
}

TEST(Tokenize, Gpt2FromFileAsJson) {
  const std::string dir = test::temp_dir("cli-tok");
  test::write_file(dir + "/in.txt", "Hello world");
  const auto r =
      run_cemfrac({"tokenize", "--tokenizer", "gpt2", "--text", dir + "/in.txt", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json({15496, 995}));
}

TEST(Tokenize, DecodeGoesBackExactly) {
  const std::string text = "  It's 日本語 😀\n\ttabs\n\n";
  const auto ids = run_cemfrac({"tokenize", "-t", "gpt2"}, text);
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const auto back = run_cemfrac({"tokenize", "-t", "gpt2", "--decode"}, ids.out);
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, text);
  const auto json_ids = run_cemfrac({"tokenize", "-t", "gpt2", "--json"}, text);
  const auto back_json =
      run_cemfrac({"tokenize", "-t", "gpt2", "--decode", "--json"}, json_ids.out);
  ASSERT_EQ(back_json.exit_code, 0) << back_json.err;
  EXPECT_EQ(nlohmann::json::parse(back_json.out).get<std::string>(), text);
  const auto eot = run_cemfrac({"tokenize", "-t", "byte", "--decode"}, "65 256 66");
  EXPECT_EQ(eot.out, "A<|endoftext|>B");
}

TEST(Tokenize, SavedTokenizerDirectory) {
  const std::string dir = test::temp_dir("cli-tok-saved") + "/tokenizer";
  make_tokenizer("byte")->save(dir);
  const auto r = run_cemfrac({"tokenize", "--tokenizer", dir}, "ab");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "97 98\n");
}

TEST(Tokenize, EmptyInputGivesAnEmptyLine) {
  const auto r = run_cemfrac({"tokenize", "--tokenizer", "gpt2"}, "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "\n");
}

TEST(Tokenize, Errors) {
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "nope"}, "x"),
                        "--tokenizer nope: not byte or gpt2, and no such directory");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "sp:4096"}, "x"),
                        "sentencepiece tokenizers are trained on data");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "byte", "--text", "/no/such/file"}),
                        "--text /no/such/file");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "gpt2"}, "bad \xFF byte"),
                        "invalid UTF-8 at byte offset 4");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "gpt2", "--decode"}, "1 2 x3"),
                        "'x3' at byte 4 of the input is not a token id");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", "gpt2", "--decode"}, "50257"),
                        "id 50257 at position 0 is outside the vocabulary");
  const std::string empty_dir = test::temp_dir("cli-tok-empty");
  expect_one_line_error(run_cemfrac({"tokenize", "--tokenizer", empty_dir}, "x"),
                        "has no tokenizer.json");
  expect_one_line_error(run_cemfrac({"tokenize"}, "x"), "--tokenizer");
}

}  // namespace
}  // namespace cemfrac

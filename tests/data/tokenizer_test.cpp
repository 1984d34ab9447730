// The tokenizer interface: byte ids and round trips, spec parsing, make_tokenizer, save/load round
// trips and every load error (one line each, naming the path), and the UTF-8 check.
// gpt2 details: gpt2_tokenizer_test.cpp; SentencePiece: sentencepiece_tokenizer_test.cpp.
#include "cemfrac/data/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "cemfrac/core/check.h"
#include "cemfrac/data/byte_tokenizer.h"
#include "cemfrac/data/gpt2_tokenizer.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;

// Runs `body`, expects a cemfrac::Error whose one-line message contains every part of `parts`.
template <typename Body>
void expect_error(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const auto& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "error must be one line: " << message;
  }
}

const Tokenizer& gpt2() {
  static const Tokenizer* tokenizer = make_tokenizer("gpt2").release();
  return *tokenizer;
}

// ---- byte --------------------------------------------------------------------------------------

TEST(ByteTokenizer, IdsAreBytesAndEndOfTextIs256) {
  const ByteTokenizer t;
  EXPECT_EQ(t.id(), "byte");
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.eot_id(), 256);
  EXPECT_EQ(t.encode("Az\n\xC3\xA9"), (std::vector<TokenId>{65, 122, 10, 0xC3, 0xA9}));
  EXPECT_EQ(t.decode({72, 105, 256, 33}), "Hi<|endoftext|>!");
  EXPECT_EQ(t.encode("<|endoftext|>").size(), 13u) << "the literal is plain text";
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  const ByteTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));  // not valid UTF-8: allowed
  EXPECT_EQ(t.decode(t.encode(all)), all);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 500; ++i) {
    const std::string text = test::random_utf8(rng, 100);
    ASSERT_EQ(t.decode(t.encode(text)), text);
  }
  for (const auto& text : test::tricky_texts()) EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(ByteTokenizer, DecodeRejectsIdsOutOfRange) {
  const ByteTokenizer t;
  expect_error([&] { t.decode({1, 257}); }, {"byte tokenizer", "id 257 at position 1"});
  expect_error([&] { t.decode({-3}); }, {"id -3 at position 0"});
}

// ---- specs and make_tokenizer ------------------------------------------------------------------

TEST(TokenizerSpec, ParsesEveryForm) {
  EXPECT_EQ(parse_tokenizer_spec("byte").kind, "byte");
  EXPECT_EQ(parse_tokenizer_spec("gpt2").kind, "gpt2");
  const TokenizerSpec sp = parse_tokenizer_spec("sp:4096");
  EXPECT_EQ(sp.kind, "sp");
  EXPECT_EQ(sp.sp.vocab_size, 4096);
  EXPECT_EQ(sp.sp.model_type, "bpe");
  EXPECT_EQ(parse_tokenizer_spec("sp:512:bpe").sp.model_type, "bpe");
  const TokenizerSpec unigram = parse_tokenizer_spec("sp:8000:unigram");
  EXPECT_EQ(unigram.sp.vocab_size, 8000);
  EXPECT_EQ(unigram.sp.model_type, "unigram");
}

TEST(TokenizerSpec, RejectsMalformedSpecs) {
  for (const std::string spec : {"", "bytes", "GPT2", "sp", "sp:", "sp:abc", "sp:12x", "sp:-5",
                                 "sp:4096:wordpiece", "sp:4096:", "sp:4096:bpe:x", "tiktoken"})
    expect_error([&] { parse_tokenizer_spec(spec); }, {"unknown tokenizer '" + spec + "'"});
  expect_error([] { parse_tokenizer_spec("sp:100"); }, {"sp:100", "[260, 1048576]"});
  expect_error([] { parse_tokenizer_spec("sp:99999999"); }, {"[260, 1048576]"});
}

TEST(MakeTokenizer, MakesByteAndGpt2AndExplainsSp) {
  EXPECT_EQ(make_tokenizer("byte")->id(), "byte");
  EXPECT_EQ(make_tokenizer("gpt2")->id(), "gpt2");
  expect_error([] { make_tokenizer("sp:4096"); },
               {"sp:4096", "trained on data", "cemfrac prepare"});
  expect_error([] { make_tokenizer("wordpiece"); }, {"unknown tokenizer 'wordpiece'"});
}

// ---- save / load --------------------------------------------------------------------------------

TEST(SaveLoad, ByteRoundTrip) {
  const std::string dir = test::temp_dir("tok-byte") + "/tokenizer";  // created by save
  make_tokenizer("byte")->save(dir);
  const auto j = nlohmann::json::parse(test::read_file(dir + "/tokenizer.json"));
  EXPECT_EQ(j.at("format"), "cemfrac-tokenizer");
  EXPECT_EQ(j.at("format_version"), 1);
  EXPECT_EQ(j.at("kind"), "byte");
  EXPECT_EQ(j.at("id"), "byte");
  EXPECT_EQ(j.at("vocab_size"), 257);
  EXPECT_EQ(j.at("eot_id"), 256);
  const auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->id(), "byte");
  EXPECT_EQ(loaded->encode("abc"), (std::vector<TokenId>{97, 98, 99}));
}

TEST(SaveLoad, Gpt2RoundTripCopiesTheFiles) {
  const std::string dir = test::temp_dir("tok-gpt2");
  gpt2().save(dir);
  const auto j = nlohmann::json::parse(test::read_file(dir + "/tokenizer.json"));
  EXPECT_EQ(j.at("kind"), "gpt2");
  EXPECT_EQ(j.at("id"), "gpt2");
  EXPECT_EQ(j.at("vocab_size"), 50257);
  EXPECT_EQ(j.at("eot_id"), 50256);
  EXPECT_EQ(j.at("files").at("encoder"), "encoder.json");
  EXPECT_EQ(j.at("files").at("merges"), "vocab.bpe");
  EXPECT_TRUE(fs::exists(dir + "/encoder.json"));
  EXPECT_TRUE(fs::exists(dir + "/vocab.bpe"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << "temporary file left behind: " << entry.path();
  const auto loaded = load_tokenizer(dir);
  const std::string text = "Loaded from a saved directory, it's the same: 日本 😀\n";
  EXPECT_EQ(loaded->encode(text), gpt2().encode(text));
  EXPECT_EQ(loaded->decode(loaded->encode(text)), text);
  gpt2().save(dir);  // saving over an existing tokenizer works
  EXPECT_EQ(load_tokenizer(dir)->id(), "gpt2");
}

// A saved byte tokenizer whose tokenizer.json is then replaced by `json`.
std::string dir_with_manifest(const std::string& json) {
  const std::string dir = test::temp_dir("tok-bad");
  make_tokenizer("byte")->save(dir);
  test::write_file(dir + "/tokenizer.json", json);
  return dir;
}

std::string manifest(const std::string& kind, const std::string& id, int64_t vocab, int64_t eot,
                     const std::string& files = "{}") {
  return fmt::format(
      R"({{"format": "cemfrac-tokenizer", "format_version": 1, "kind": "{}", "id": "{}", )"
      R"("vocab_size": {}, "eot_id": {}, "files": {}}})",
      kind, id, vocab, eot, files);
}

TEST(SaveLoad, MissingDirectoryIsAnError) {
  const std::string dir = test::temp_dir("tok-missing") + "/nope";
  expect_error([&] { load_tokenizer(dir); }, {dir, "does not exist"});
}

TEST(SaveLoad, FileInsteadOfDirectoryIsAnError) {
  const std::string file = test::temp_dir("tok-file") + "/file";
  test::write_file(file, "x");
  expect_error([&] { load_tokenizer(file); }, {file, "is not a directory"});
}

TEST(SaveLoad, MissingManifestIsAnError) {
  const std::string dir = test::temp_dir("tok-empty");
  expect_error([&] { load_tokenizer(dir); }, {dir, "has no tokenizer.json"});
}

TEST(SaveLoad, GarbledManifestIsAnError) {
  expect_error([] { load_tokenizer(dir_with_manifest("{\"kind\": \"byte\",")); },
               {"tokenizer.json is not valid JSON", "parse error at byte"});
  expect_error([] { load_tokenizer(dir_with_manifest("")); }, {"is not valid JSON"});
  expect_error([] { load_tokenizer(dir_with_manifest("[1, 2]")); },
               {"must hold a JSON object, not array"});
  expect_error(
      [] { load_tokenizer(dir_with_manifest(R"({"format": "other", "format_version": 1})")); },
      {"format is \"other\", expected \"cemfrac-tokenizer\""});
  expect_error(
      [] {
        load_tokenizer(
            dir_with_manifest(R"({"format": "cemfrac-tokenizer", "format_version": 9})"));
      },
      {"format_version 9 is not supported", "reads version 1"});
  expect_error(
      [] {
        load_tokenizer(dir_with_manifest(
            R"({"format": "cemfrac-tokenizer", "format_version": 1, "kind": "byte", "id": "byte",)"
            R"( "eot_id": 256})"));
      },
      {"field \"vocab_size\" is missing"});
  expect_error(
      [] {
        load_tokenizer(dir_with_manifest(
            R"({"format": "cemfrac-tokenizer", "format_version": 1, "kind": "byte", "id": "byte",)"
            R"( "vocab_size": "257", "eot_id": 256})"));
      },
      {"field \"vocab_size\" must be an integer"});
  expect_error([] { load_tokenizer(dir_with_manifest(manifest("byte", "byte", 257, 300))); },
               {"eot_id 300 is outside the vocabulary [0, 257)"});
  expect_error(
      [] { load_tokenizer(dir_with_manifest(manifest("byte", "byte", 257, 256, "[\"x\"]"))); },
      {"field \"files\" must be an object"});
  expect_error(
      [] {
        load_tokenizer(
            dir_with_manifest(manifest("gpt2", "gpt2", 50257, 50256, R"({"encoder": "../x"})")));
      },
      {"must be a plain file name"});
}

TEST(SaveLoad, UnknownKindIsAnError) {
  expect_error([] { load_tokenizer(dir_with_manifest(manifest("wordpiece", "wp", 30000, 0))); },
               {"unknown tokenizer kind 'wordpiece'"});
}

TEST(SaveLoad, ManifestThatDisagreesWithTheFilesIsAnError) {
  expect_error([] { load_tokenizer(dir_with_manifest(manifest("byte", "byte", 300, 256))); },
               {"says id byte, vocab_size 300", "files give byte, 257, 256"});
}

TEST(SaveLoad, MissingTokenizerFilesAreErrors) {
  const std::string dir = test::temp_dir("tok-gpt2-missing");
  gpt2().save(dir);
  fs::remove(dir + "/vocab.bpe");
  expect_error([&] { load_tokenizer(dir); }, {dir + "/vocab.bpe is missing", "gpt2", "merges"});
  const std::string dir2 = dir_with_manifest(manifest("gpt2", "gpt2", 50257, 50256, "{}"));
  expect_error([&] { load_tokenizer(dir2); }, {"needs files.encoder"});
  const std::string dir3 =
      dir_with_manifest(manifest("sp", "sp:4096", 4096, 1, R"({"model": "sentencepiece.model"})"));
  expect_error([&] { load_tokenizer(dir3); }, {"sentencepiece.model is missing"});
}

TEST(SaveLoad, CorruptGpt2FilesAreErrors) {
  const std::string dir = test::temp_dir("tok-gpt2-corrupt");
  gpt2().save(dir);
  const std::string merges = test::read_file(dir + "/vocab.bpe");
  // Swap the first two merges: the files no longer belong together.
  const size_t a = merges.find('\n') + 1, b = merges.find('\n', a) + 1,
               c = merges.find('\n', b) + 1;
  test::write_file(dir + "/vocab.bpe", merges.substr(0, a) + merges.substr(b, c - b) +
                                           merges.substr(a, b - a) + merges.substr(c));
  expect_error([&] { load_tokenizer(dir); },
               {"vocab.bpe: merge 1 makes token id 257", "expected 256"});
  test::write_file(dir + "/vocab.bpe", merges.substr(0, merges.size() / 2));
  expect_error([&] { load_tokenizer(dir); }, {"vocab.bpe holds", "merges, GPT-2 has 50000"});
  test::write_file(dir + "/vocab.bpe", merges);
  test::write_file(dir + "/encoder.json", "{\"a\": 0}");
  expect_error([&] { load_tokenizer(dir); }, {"encoder.json must map 50257 tokens"});
  test::write_file(dir + "/encoder.json", "{not json");
  expect_error([&] { load_tokenizer(dir); }, {"encoder.json is not valid JSON"});
}

// ---- UTF-8 --------------------------------------------------------------------------------------

TEST(CheckUtf8, AcceptsValidAndNamesTheFirstInvalidByte) {
  EXPECT_NO_THROW(check_utf8("plain \xC3\xA9 \xF0\x9F\x98\x80", "test"));
  expect_error([] { check_utf8("ab\xC3", "who"); },
               {"who: invalid UTF-8 at byte offset 2 (byte 0xc3)", "iconv"});
}

}  // namespace
}  // namespace cemfrac

// gpt2: ids equal js-tiktoken's (committed fixtures, plus a fuzz comparison run through node when
// it is installed), the pre-tokenizer's character classes equal JavaScript's for every code point,
// round trips, the plain-text handling of "<|endoftext|>", and the errors for invalid UTF-8 and bad
// ids.
#include "cemfrac/data/gpt2_tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

const Gpt2Tokenizer& gpt2() {
  static const Gpt2Tokenizer* tokenizer = Gpt2Tokenizer::from_cache().release();
  return *tokenizer;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (const TokenId id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Expects equal id lists, reporting the first difference and the tokens around it.
void expect_same_ids(const std::vector<TokenId>& got, const std::vector<TokenId>& want,
                     const std::string& label) {
  if (got == want) return;
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i >= 3 ? i - 3 : 0;
  auto window = [&](const std::vector<TokenId>& v) {
    std::vector<TokenId> w(v.begin() + std::min(from, v.size()),
                           v.begin() + std::min(i + 4, v.size()));
    return show(w);
  };
  ADD_FAILURE() << label << ": ids differ first at index " << i << " (cemfrac " << got.size()
                << " ids, js-tiktoken " << want.size() << "); from index " << from << ": cemfrac ["
                << window(got) << "] vs js-tiktoken [" << window(want) << "]";
}

TEST(Gpt2Tokenizer, VocabularyAndEndOfText) {
  EXPECT_EQ(gpt2().id(), "gpt2");
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().eot_id(), 50256);
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(0), "!");
  EXPECT_EQ(gpt2().token_bytes(198), "\n");
  EXPECT_EQ(gpt2().token_bytes(220), " ");
  EXPECT_EQ(gpt2().token_bytes(262), " the");
}

TEST(Gpt2Tokenizer, KnownIds) {
  // Values from GPT-2's encoder.json / js-tiktoken.
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(gpt2().encode(" the"), (std::vector<TokenId>{262}));
  EXPECT_EQ(gpt2().encode("\n\n"), (std::vector<TokenId>{628}));
  EXPECT_EQ(gpt2().encode("I'm"), (std::vector<TokenId>{40, 1101}));
  EXPECT_TRUE(gpt2().encode("").empty());
}

// The documented choice: a literal "<|endoftext|>" is text ("<|", "endoftext", "|>"), never 50256.
TEST(Gpt2Tokenizer, EndOfTextLiteralIsPlainText) {
  const std::vector<TokenId> ids = gpt2().encode("<|endoftext|>");
  EXPECT_EQ(ids, (std::vector<TokenId>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(gpt2().decode(ids), "<|endoftext|>");
  const std::vector<TokenId> more = gpt2().encode("a<|endoftext|>b <|endoftext|>");
  EXPECT_EQ(std::count(more.begin(), more.end(), gpt2().eot_id()), 0);
}

TEST(Gpt2Tokenizer, MatchesJsTiktokenFixtures) {
  const auto fixtures =
      nlohmann::json::parse(test::read_file(test::source_path("tests/fixtures/gpt2_ids.json")));
  ASSERT_GE(fixtures.at("cases").size(), 50u) << "gpt2_ids.json lost its cases";
  for (const auto& c : fixtures.at("cases")) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<TokenId>>();
    const std::vector<TokenId> got = gpt2().encode(text);
    expect_same_ids(got, want, "case '" + name + "'");
    EXPECT_EQ(gpt2().decode(got), text) << "case '" << name << "' does not round-trip";
  }
}

TEST(Gpt2Tokenizer, RoundTripsRandomUtf8) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    const std::string text = test::random_utf8(rng, i % 10 == 0 ? 400 : 40);
    ASSERT_EQ(gpt2().decode(gpt2().encode(text)), text) << "random text " << i;
  }
}

TEST(Gpt2Tokenizer, RoundTripsTrickyText) {
  for (const auto& text : test::tricky_texts())
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << nlohmann::json(text).dump();
  const std::string spaces(100000, ' ');  // one piece of 100000 bytes: the heap merge path
  EXPECT_EQ(gpt2().decode(gpt2().encode(spaces)), spaces);
  const std::string runs = std::string(5000, '\n') + "x" + std::string(3000, '\t') + "y";
  EXPECT_EQ(gpt2().decode(gpt2().encode(runs)), runs);
}

TEST(Gpt2Tokenizer, InvalidUtf8NamesTheByteOffset) {
  struct Case {
    std::string text;
    size_t offset;
  };
  const Case cases[] = {
      {"abc\xFF", 3},                       // not a UTF-8 byte
      {"ok \x80 stray", 3},                 // continuation byte without a lead
      {"trunc\xE6\x97", 5},                 // truncated sequence at the end
      {"\xC0\xAF", 0},                      // overlong '/'
      {"ab\xED\xA0\x80", 2},                // surrogate U+D800
      {"caf\xC3\xA9 \xF4\x90\x80\x80", 6},  // above U+10FFFF
  };
  for (const auto& c : cases) {
    try {
      gpt2().encode(c.text);
      ADD_FAILURE() << "no error for the case with offset " << c.offset;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("invalid UTF-8 at byte offset " + std::to_string(c.offset) + " "),
                std::string::npos)
          << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << "error must be one line: " << message;
    }
  }
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutOfRange) {
  EXPECT_THROW(gpt2().decode({15496, 50257}), Error);
  EXPECT_THROW(gpt2().decode({-1}), Error);
  try {
    gpt2().decode({1, 2, 99999});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 99999 at position 2"), std::string::npos) << e.what();
  }
}

// The cache must not change results: the same words from many threads at once give the ids of a
// fresh tokenizer.
TEST(Gpt2Tokenizer, CachedAndConcurrentEncodingAgree) {
  std::mt19937_64 rng(11);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(test::random_utf8(rng, 200));
  std::vector<std::vector<TokenId>> fresh;
  {
    const auto tokenizer = Gpt2Tokenizer::from_cache();
    for (const auto& t : texts) fresh.push_back(tokenizer->encode(t));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < texts.size(); ++i)
          if (gpt2().encode(texts[(i + t * 37) % texts.size()]) !=
              fresh[(i + t * 37) % texts.size()])
            ++mismatches[t];
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// Every code point is classified as JavaScript does: letter (\p{L}), number (\p{N}), whitespace
// (JS \s), or other. Probes: "a"+c is one piece iff c is a letter, "1"+c iff a number, "\t"+c iff
// whitespace, "!"+c iff none of them.
TEST(Gpt2Pretokenizer, ClassesMatchJavaScript) {
  const auto classes = nlohmann::json::parse(
      test::read_file(test::source_path("tests/fixtures/js_unicode_classes.json")));
  EXPECT_EQ(classes.at("unicode").get<std::string>(), kGpt2UnicodeVersion)
      << "fixtures from another Unicode version: update kGpt2UnicodeVersion and the extra ranges";
  auto member_table = [&](const char* key) {
    std::vector<bool> in(0x110000, false);
    for (const auto& r : classes.at(key))
      for (uint32_t cp = r.at(0); cp <= r.at(1).get<uint32_t>(); ++cp) in[cp] = true;
    return in;
  };
  const std::vector<bool> js_letter = member_table("L"), js_number = member_table("N"),
                          js_space = member_table("s");
  Gpt2Pretokenizer::Matcher matcher(gpt2().pretokenizer());
  auto one_piece = [&](const char* probe, uint32_t cp) {
    std::string text = probe;
    test::append_utf8(text, cp);
    return matcher.piece_end(text, 0) == text.size();
  };
  const char* names[] = {"letter", "number", "whitespace", "other"};
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> wrong(4);  // ranges per class
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const bool want[4] = {js_letter[cp], js_number[cp], js_space[cp],
                          !js_letter[cp] && !js_number[cp] && !js_space[cp]};
    const bool got[4] = {one_piece("a", cp), one_piece("1", cp), one_piece("\t", cp),
                         one_piece("!", cp)};
    for (int k = 0; k < 4; ++k) {
      if (want[k] == got[k]) continue;
      auto& w = wrong[k];
      if (!w.empty() && w.back().second + 1 == cp)
        w.back().second = cp;
      else
        w.push_back({cp, cp});
    }
  }
  for (int k = 0; k < 4; ++k) {
    if (wrong[k].empty()) continue;
    std::string ranges;
    for (const auto& [a, b] : wrong[k])
      ranges +=
          a == b ? fmt::format("\\x{{{:X}}}", a) : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", a, b);
    ADD_FAILURE() << "code points whose " << names[k]
                  << " class differs from JavaScript's (add to the extra ranges in "
                     "gpt2_tokenizer.cpp if JS has them): "
                  << ranges.substr(0, 2000);
  }
}

TEST(Gpt2Pretokenizer, SplitsLikeGpt2) {
  const auto pieces = gpt2().pretokenizer().split("Hello, world!  It's 2024\n\n  ok ");
  const std::vector<std::string_view> want = {"Hello", ",",     " world", "!",   " ", " It",
                                              "'s",    " 2024", "\n\n ",  " ok", " "};
  EXPECT_EQ(pieces, want);
  EXPECT_TRUE(gpt2().pretokenizer().jit()) << "PCRE2 JIT is off: encoding will be slower";
}

// ---- comparison with js-tiktoken at test time ------------------------------------------------

bool have_node() {
  return std::system("command -v node >/dev/null 2>&1") == 0;
}

// Random texts of every kind, encoded here and by js-tiktoken (through node), must give equal ids.
TEST(Gpt2Tokenizer, MatchesJsTiktokenOnRandomText) {
  if (!have_node()) GTEST_SKIP() << "node is not installed: the js-tiktoken comparison needs it";
  const std::string tiktoken = cache_dir() + "/npm/js-tiktoken/dist/index.cjs";
  ASSERT_TRUE(std::filesystem::exists(tiktoken))
      << tiktoken << " is missing: run scripts/setup.sh --no-apt to fetch js-tiktoken";
  std::mt19937_64 rng(2024);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) texts.push_back(test::random_utf8(rng, i % 20 == 0 ? 2000 : 60));
  // Long runs that take the merge loop through long pieces.
  texts.push_back(std::string(3000, ' ') + "end");
  texts.push_back(std::string(2000, 'a') + " " + std::string(1500, '7'));
  std::string punct;
  for (int i = 0; i < 600; ++i) punct += "=-+*"[i % 4];
  texts.push_back(punct);
  const std::string dir = test::temp_dir("gpt2-fuzz");
  const std::string in = dir + "/texts.json", out = dir + "/ids.json";
  test::write_file(in, nlohmann::json(texts).dump());
  const std::string command = "node '" + test::source_path("scripts/gen_gpt2_fixtures.mjs") +
                              "' --encode '" + in + "' '" + out + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << "failed: " << command;
  const auto want = nlohmann::json::parse(test::read_file(out));
  ASSERT_EQ(want.size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
    const std::vector<TokenId> got = gpt2().encode(texts[i]);
    if (got != want[i].get<std::vector<TokenId>>()) {
      ++failures;
      expect_same_ids(got, want[i].get<std::vector<TokenId>>(),
                      "random text " + std::to_string(i) + " " + nlohmann::json(texts[i]).dump());
    }
  }
}

}  // namespace
}  // namespace cemfrac

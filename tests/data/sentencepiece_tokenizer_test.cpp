// sp:N: training through the shim module inside a process that also runs LibTorch (the reason the
// shim exists), the id layout, exact round trips on the Brown text and on tricky whitespace,
// U+2581, end-of-text, determinism for a seed, save/load, and the errors.
#include "cemfrac/data/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cemfrac/core/check.h"
#include "cemfrac/data/brown.h"
#include "cemfrac/data/sentencepiece_library.h"
#include "cemfrac/data/tokenizer.h"
#include "tests/data/tokenizer_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;

const std::vector<Document>& brown() {
  static const auto* documents = new std::vector<Document>(read_brown_corpus());
  return *documents;
}

std::vector<std::string> brown_texts(size_t first, size_t count) {
  std::vector<std::string> texts;
  for (size_t i = first; i < first + count && i < brown().size(); ++i)
    texts.push_back(brown()[i].text);
  return texts;
}

// sp:4096 trained on 50 Brown documents (every 10th, so all genres), shared by the tests.
const SentencePieceTokenizer& sp() {
  static const SentencePieceTokenizer* tokenizer = [] {
    std::vector<std::string> train;
    for (size_t i = 0; i < brown().size(); i += 10) train.push_back(brown()[i].text);
    auto t = train_sentencepiece(train, SentencePieceOptions{4096, "bpe", 1});
    return static_cast<SentencePieceTokenizer*>(t.release());
  }();
  return *tokenizer;
}

TEST(SentencePieceTokenizer, TrainsBesideLibTorch) {
  // This binary links LibTorch; libsentencepiece linked into it directly would crash at start-up.
  const torch::Tensor before = torch::arange(10, torch::kFloat).sum();
  EXPECT_EQ(sp().vocab_size(), 4096);
  const torch::Tensor after = torch::ones({3, 3}).matmul(torch::ones({3, 1})).sum();
  EXPECT_EQ(before.item<float>(), 45.0f);
  EXPECT_EQ(after.item<float>(), 9.0f);
  EXPECT_FALSE(sentencepiece_shim_path().empty());
}

TEST(SentencePieceTokenizer, IdLayout) {
  EXPECT_EQ(sp().id(), "sp:4096");
  EXPECT_EQ(sp().model_type(), "bpe");
  EXPECT_EQ(sp().eot_id(), 1);
  const SentencePieceModel& m = sp().model();
  EXPECT_EQ(m.id_to_piece(0), "<unk>");
  EXPECT_EQ(m.piece_kind(0), SentencePieceModel::PieceKind::kUnknown);
  EXPECT_EQ(m.id_to_piece(1), "<|endoftext|>");
  EXPECT_EQ(m.piece_kind(1), SentencePieceModel::PieceKind::kControl);
  EXPECT_EQ(m.id_to_piece(2), "\n");
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(m.id_to_piece(3 + b), fmt::format("<0x{:02X}>", b));
    EXPECT_EQ(m.piece_kind(3 + b), SentencePieceModel::PieceKind::kByte);
  }
  EXPECT_EQ(m.bos_id(), -1);
  EXPECT_EQ(m.pad_id(), -1);
}

TEST(SentencePieceTokenizer, RoundTripsTheBrownText) {
  size_t tokens = 0, bytes = 0;
  for (const auto& doc : brown()) {  // 450 of them were not in the training set
    const std::vector<TokenId> ids = sp().encode(doc.text);
    ASSERT_EQ(sp().decode(ids), doc.text) << "document " << doc.name;
    ASSERT_EQ(std::count(ids.begin(), ids.end(), 0), 0) << "<unk> in " << doc.name;
    ASSERT_EQ(std::count(ids.begin(), ids.end(), sp().eot_id()), 0) << doc.name;
    tokens += ids.size();
    bytes += doc.text.size();
  }
  // A real vocabulary, not bytes: Brown English gives well over 3 bytes per token at 4096.
  EXPECT_GT(static_cast<double>(bytes) / tokens, 3.0);
}

// encode() hands SentencePiece bounded pieces. Cut where SentencePiece starts a
// piece anyway, the ids equal one unbounded call: checked on Brown text with 64-byte pieces (a cut
// every few words) and through encode() itself on a text longer than one chunk.
TEST(SentencePieceTokenizer, BoundedPiecesGiveTheWholeTextIds) {
  std::string text;
  for (const std::string& t : brown_texts(300, 40)) text += t;
  ASSERT_GT(text.size(), kSentencePieceEncodeChunkBytes) << "needs more than one chunk";
  ASSERT_EQ(text.find("\xE2\x96\x81"), std::string::npos) << "no U+2581 (encode() cuts there too)";
  std::vector<TokenId> whole;
  sp().model().encode(text, whole);  // one unbounded call
  EXPECT_EQ(sp().encode(text), whole);
  const std::string head = text.substr(0, 20000);
  std::vector<TokenId> head_whole, pieced;
  sp().model().encode(head, head_whole);
  const auto pieces = sentencepiece_encode_pieces(head, 64);
  EXPECT_GT(pieces.size(), 300u);
  std::string joined;
  for (std::string_view p : pieces) {
    EXPECT_LE(p.size(), 64u);
    sp().model().encode(p, pieced);
    joined += p;
  }
  EXPECT_EQ(joined, head);
  EXPECT_EQ(pieced, head_whole);
}

// A "word" longer than a piece (no space, no newline) is cut at UTF-8 character boundaries: the
// pieces are valid UTF-8 and the ids decode to the text (they may differ from an unbounded call at
// the cuts).
TEST(SentencePieceTokenizer, AnEnormousWordIsCutAtCharacterBoundaries) {
  std::string word;
  for (int i = 0; i < 200; ++i) word += i % 3 ? "x" : "\xC3\xA9";  // x and e-acute
  const auto pieces = sentencepiece_encode_pieces(word, 16);
  std::string joined;
  for (std::string_view p : pieces) {
    EXPECT_LE(p.size(), 16u);
    EXPECT_NO_THROW(check_utf8(p, "piece"));
    joined += p;
  }
  EXPECT_EQ(joined, word);
  const std::string big(kSentencePieceEncodeChunkBytes * 2 + 5, 'z');
  EXPECT_EQ(sp().decode(sp().encode(big)), big);
}

TEST(SentencePieceTokenizer, RoundTripsTrickyTextAndU2581) {
  for (const auto& text : test::tricky_texts())
    EXPECT_EQ(sp().decode(sp().encode(text)), text) << nlohmann::json(text).dump();
  // U+2581 is SentencePiece's own space mark; it must come back as itself, not as a space.
  const std::string meta =
      "a\xE2\x96\x81"
      "b \xE2\x96\x81\xE2\x96\x81 c\xE2\x96\x81";
  const std::vector<TokenId> ids = sp().encode(meta);
  EXPECT_EQ(sp().decode(ids), meta);
  const std::vector<TokenId> meta_bytes = {3 + 0xE2, 3 + 0x96, 3 + 0x81};  // <0xE2><0x96><0x81>
  EXPECT_NE(std::search(ids.begin(), ids.end(), meta_bytes.begin(), meta_bytes.end()), ids.end());
}

TEST(SentencePieceTokenizer, RoundTripsRandomUtf8) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 1000; ++i) {
    const std::string text = test::random_utf8(rng, 60);
    ASSERT_EQ(sp().decode(sp().encode(text)), text) << nlohmann::json(text).dump();
  }
}

// Threads of this program call into the shim's namespace at once (its own libc and libstdc++).
TEST(SentencePieceTokenizer, ConcurrentEncodingAgrees) {
  const std::vector<std::string> texts = brown_texts(200, 8);
  std::vector<std::vector<TokenId>> want;
  for (const auto& t : texts) want.push_back(sp().encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t j = (i + k) % texts.size();
          if (sp().encode(texts[j]) != want[j] || sp().decode(want[j]) != texts[j]) ++mismatches[k];
        }
    });
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
}

TEST(SentencePieceTokenizer, EndOfText) {
  EXPECT_EQ(sp().decode({sp().eot_id()}), "<|endoftext|>");
  const std::vector<TokenId> a = sp().encode("The jury"), b = sp().encode(" said.");
  std::vector<TokenId> joined = a;
  joined.push_back(sp().eot_id());
  joined.insert(joined.end(), b.begin(), b.end());
  joined.push_back(sp().eot_id());
  EXPECT_EQ(sp().decode(joined), "The jury<|endoftext|> said.<|endoftext|>");
  // The literal is plain text, never the end-of-text id.
  const std::vector<TokenId> literal = sp().encode("x<|endoftext|>y");
  EXPECT_EQ(std::count(literal.begin(), literal.end(), sp().eot_id()), 0);
  EXPECT_EQ(sp().decode(literal), "x<|endoftext|>y");
}

TEST(SentencePieceTokenizer, Errors) {
  try {
    sp().encode("ok\xE2\x82");
    ADD_FAILURE() << "no error for invalid UTF-8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sp:4096 tokenizer: invalid UTF-8 at byte offset 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(sp().decode({5, 4096}), Error);
  EXPECT_THROW(sp().decode({-1}), Error);
  EXPECT_THROW(train_sentencepiece({"", ""}, SentencePieceOptions{}), Error);
  EXPECT_THROW(train_sentencepiece({"abc"}, SentencePieceOptions{4096, "char", 0}), Error);
  try {
    // Far more pieces than a tiny text can give: SentencePiece's message comes through, one line.
    train_sentencepiece({"tiny text"}, SentencePieceOptions{5000, "bpe", 0});
    ADD_FAILURE() << "no error for an impossible vocabulary";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("training sp:5000 failed"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(SentencePieceTokenizer, SameSeedSameModelAndUnigram) {
  const std::vector<std::string> train = brown_texts(0, 10);
  const SentencePieceOptions options{800, "unigram", 42};
  const auto a = train_sentencepiece(train, options);
  const auto b = train_sentencepiece(train, options);
  EXPECT_EQ(a->id(), "sp:800:unigram");
  EXPECT_EQ(a->vocab_size(), 800);
  EXPECT_EQ(static_cast<const SentencePieceTokenizer&>(*a).model_bytes(),
            static_cast<const SentencePieceTokenizer&>(*b).model_bytes())
      << "training is not deterministic for a fixed seed";
  for (const auto& doc : brown_texts(10, 5)) EXPECT_EQ(a->decode(a->encode(doc)), doc);
}

TEST(SentencePieceTokenizer, SaveLoadRoundTrip) {
  const std::string dir = test::temp_dir("tok-sp") + "/tokenizer";
  sp().save(dir);
  const auto j = nlohmann::json::parse(test::read_file(dir + "/tokenizer.json"));
  EXPECT_EQ(j.at("kind"), "sp");
  EXPECT_EQ(j.at("id"), "sp:4096");
  EXPECT_EQ(j.at("vocab_size"), 4096);
  EXPECT_EQ(j.at("eot_id"), 1);
  EXPECT_EQ(j.at("files").at("model"), "sentencepiece.model");
  const auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->id(), "sp:4096");
  const std::string text = brown()[1].text;
  EXPECT_EQ(loaded->encode(text), sp().encode(text));
  EXPECT_EQ(loaded->decode({1}), "<|endoftext|>");
}

TEST(SentencePieceTokenizer, LoadErrors) {
  const std::string dir = test::temp_dir("tok-sp-bad");
  sp().save(dir);
  test::write_file(dir + "/sentencepiece.model", "not a model");
  try {
    load_tokenizer(dir);
    ADD_FAILURE() << "no error for a corrupt model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/sentencepiece.model"), std::string::npos)
        << e.what();
  }
  sp().save(dir);
  auto j = nlohmann::json::parse(test::read_file(dir + "/tokenizer.json"));
  j["id"] = "sp:4096:unigram";  // the model is a bpe one: id from the files differs
  test::write_file(dir + "/tokenizer.json", j.dump());
  EXPECT_THROW(load_tokenizer(dir), Error);
  j["id"] = "gpt2";
  test::write_file(dir + "/tokenizer.json", j.dump());
  EXPECT_THROW(load_tokenizer(dir), Error);
}

// ---- how the shim is loaded ---------------------------------------------------------------------

TEST(SentencePieceShim, LoadsInItsOwnNamespaceByDefault) {
  const char* forced = std::getenv("CEMFRAC_SPM_LOAD");
  EXPECT_EQ(sentencepiece_shim_mode(), forced && *forced && std::string(forced) != "auto"
                                           ? std::string(forced)
                                           : std::string("namespace"));
}

// Also run by DeepBindFallbackWorks in a child process with CEMFRAC_SPM_LOAD=deepbind.
TEST(SentencePieceShim, SmallModelTrainsAndRoundTrips) {
  const auto t = train_sentencepiece(brown_texts(0, 10), SentencePieceOptions{600, "bpe", 3});
  EXPECT_EQ(t->id(), "sp:600");
  for (const auto& doc : brown_texts(10, 3)) EXPECT_EQ(t->decode(t->encode(doc)), doc);
  for (const auto& text : test::tricky_texts()) EXPECT_EQ(t->decode(t->encode(text)), text);
  // SentencePiece logs a warning on its way to this error; that must not crash in either mode.
  EXPECT_THROW(train_sentencepiece({"tiny text"}, SentencePieceOptions{5000, "bpe", 0}), Error);
}

// The shim's other input: with no sentences, SentencePiece reads the file named by "input".
TEST(SentencePieceShim, TrainsFromATextFile) {
  const std::string file = test::temp_dir("sp-file") + "/train.txt";
  std::string text;
  for (const auto& doc : brown_texts(0, 5)) text += doc + "\n";
  test::write_file(file, text);
  const std::string model = train_sentencepiece_model(
      {},
      {{"input", file}, {"vocab_size", "500"}, {"model_type", "bpe"}, {"byte_fallback", "true"}},
      0);
  const SentencePieceModel m(model, "file-trained model");
  EXPECT_EQ(m.vocab_size(), 500);
  std::vector<TokenId> ids;
  m.encode("The jury", ids);
  EXPECT_FALSE(ids.empty());
  EXPECT_THROW(
      train_sentencepiece_model({}, {{"input", file + ".missing"}, {"vocab_size", "500"}}, 0),
      Error);
}

TEST(SentencePieceShim, DeepBindFallbackWorks) {
  if (const char* forced = std::getenv("CEMFRAC_SPM_LOAD"); forced && *forced)
    GTEST_SKIP() << "CEMFRAC_SPM_LOAD is set: this is the child run";
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string log = test::temp_dir("sp-deepbind") + "/log";
  const std::string command = "CEMFRAC_SPM_LOAD=deepbind '" + self +
                              "' --gtest_filter='SentencePieceShim.SmallModelTrainsAndRoundTrips:"
                              "SentencePieceShim.LoadsInItsOwnNamespaceByDefault' >'" +
                              log + "' 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << "the DEEPBIND child failed (status " << status << "):\n"
                       << test::read_file(log);
}

}  // namespace
}  // namespace cemfrac

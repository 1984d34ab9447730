// cemfrac prepare: --text sources (files, directories, UTF-8 checks); the prepared directory end
// to end with a byte tokenizer defined here (independent of data/tokenizer.cpp); shards that decode
// back to the documents; determinism, --force, atomicity; the CLI's errors and its byte run.
#include "cemfrac/data/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/shard.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;

// 256 byte ids + end-of-text 256, like the "byte" tokenizer, but under its own id.
class TestByteTokenizer : public Tokenizer {
 public:
  std::string id() const override { return "testbyte"; }
  int64_t vocab_size() const override { return 257; }
  TokenId eot_id() const override { return 256; }
  std::vector<TokenId> encode(std::string_view text) const override {
    if (text.find("POISON") != std::string_view::npos) throw Error("test tokenizer: poisoned text");
    std::vector<TokenId> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<TokenId>& ids) const override {
    std::string text;
    for (TokenId id : ids)
      text += id == 256 ? std::string("<|endoftext|>") : std::string(1, char(id));
    return text;
  }
  void save(const std::string& dir) const override {
    fs::create_directories(dir);
    write_file_atomic(dir + "/tokenizer.json", "{\"kind\": \"testbyte\"}\n");
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string message = error_of(f);
  ASSERT_FALSE(message.empty()) << "expected a cemfrac::Error holding '" << parts.front() << "'";
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' missing in: " << message;
}

// Seven documents (one in a subdirectory, one with multi-byte UTF-8, one that is not .txt).
const std::vector<std::pair<std::string, std::string>> kDocs = {
    {"a.txt", "Alpha document.\n\nSecond paragraph.\n"},
    {"b.txt", "Beta: caf\xC3\xA9, na\xC3\xAFve, \xE2\x82\xAC 5, \xF0\x9D\x84\x9E clef."},
    {"c.txt", "Gamma <|endoftext|> is plain text here."},
    {"d.txt", "Delta"},
    {"e.txt", "Epsilon\r\nwith CRLF\r\n"},
    {"sub/f.txt", "Zeta in a subdirectory."},
    {"sub/g.txt", "Eta, the last one."},
};

std::string make_text_dir() {
  const std::string dir = test::temp_dir("prepare-src");
  for (const auto& [name, text] : kDocs) {
    fs::create_directories(fs::path(dir + "/" + name).parent_path());
    test::write_file(dir + "/" + name, text);
  }
  test::write_file(dir + "/notes.md", "not a document");
  return dir;
}

PrepareOptions byte_options(const std::string& text_path, const std::string& out_dir,
                            std::vector<std::string>* train_texts = nullptr) {
  PrepareOptions options;
  options.text_path = text_path;
  options.out_dir = out_dir;
  options.tokenizer = "testbyte";
  options.make_tokenizer = [train_texts](const std::vector<std::string>& texts) {
    if (train_texts) *train_texts = texts;
    return std::make_unique<TestByteTokenizer>();
  };
  return options;
}

// The documents of a shard: cut after each end-of-text, decoded.
std::vector<std::string> decode_documents(const ShardReader& shard, const Tokenizer& tokenizer) {
  std::vector<std::string> docs;
  std::vector<TokenId> current;
  for (TokenId id : shard.to_vector()) {
    if (id == tokenizer.eot_id()) {
      docs.push_back(tokenizer.decode(current));
      current.clear();
    } else {
      current.push_back(id);
    }
  }
  EXPECT_TRUE(current.empty()) << "tokens after the last end-of-text";
  return docs;
}

TEST(FindInvalidUtf8, FindsTheFirstBadByte) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii").has_value());
  EXPECT_FALSE(
      find_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9D\x84\x9E \xF4\x8F\xBF\xBF").has_value());
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);               // continuation without a lead
  EXPECT_EQ(find_invalid_utf8("x\xC0\xAF"), 1u);            // overlong '/'
  EXPECT_EQ(find_invalid_utf8("xy\xE0\x80\xAF"), 2u);       // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);         // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("ok \xF4\x90\x80\x80"), 3u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("end \xE2\x82"), 4u);         // truncated sequence
  EXPECT_EQ(find_invalid_utf8("\xC3("), 0u);                // bad continuation
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0u);
}

TEST(ReadTextSource, DirectoryGivesSortedTxtFiles) {
  const std::string dir = make_text_dir();
  const std::vector<Document> docs = read_text_source(dir);
  ASSERT_EQ(docs.size(), kDocs.size());  // notes.md is not a document
  for (size_t i = 0; i < kDocs.size(); ++i) {
    EXPECT_EQ(docs[i].name, kDocs[i].first);
    EXPECT_EQ(docs[i].text, kDocs[i].second) << docs[i].name;
  }
}

TEST(ReadTextSource, SingleFileIsOneDocumentWithoutItsByteOrderMark) {
  const std::string dir = test::temp_dir("prepare-src");
  test::write_file(dir + "/book.text", "\xEF\xBB\xBFOnce upon a time.");
  const std::vector<Document> docs = read_text_source(dir + "/book.text");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].name, "book.text");
  EXPECT_EQ(docs[0].text, "Once upon a time.");
}

TEST(ReadTextSource, ErrorsNameTheFile) {
  const std::string dir = test::temp_dir("prepare-src");
  expect_error([&] { read_text_source(dir + "/nope"); }, {dir + "/nope", "does not exist"});
  expect_error([&] { read_text_source(dir); }, {dir, "no .txt files"});
  test::write_file(dir + "/readme.md", "x");
  expect_error([&] { read_text_source(dir); }, {dir, "no .txt files"});
  test::write_file(dir + "/a.txt", "fine");
  test::write_file(dir + "/b.txt", "Latin-1 caf\xE9 here");
  expect_error([&] { read_text_source(dir); },
               {dir + "/b.txt", "not valid UTF-8", "0xe9", "byte offset 11"});
  test::write_file(dir + "/b.txt", "");
  expect_error([&] { read_text_source(dir); }, {dir + "/b.txt", "is empty"});
  test::write_file(dir + "/b.txt", "fixed");
  EXPECT_EQ(read_text_source(dir).size(), 2u);
  if (::geteuid() != 0) {  // root reads anything
    fs::permissions(dir + "/b.txt", fs::perms::none);
    expect_error([&] { read_text_source(dir); }, {dir + "/b.txt", "cannot read"});
  }
}

TEST(Prepare, WritesTheDocumentedDirectory) {
  const std::string src = make_text_dir();
  const std::string out = test::temp_dir("prepare-out") + "/data";
  std::vector<std::string> train_texts;
  std::vector<std::string> progress;
  PrepareOptions options = byte_options(src, out, &train_texts);
  options.progress = [&](const std::string& line) { progress.push_back(line); };
  const PrepareResult result = prepare_dataset(options);

  for (const char* f :
       {"train.bin", "val.bin", "test.bin", "meta.json", "tokenizer/tokenizer.json"})
    EXPECT_TRUE(fs::is_regular_file(out + "/" + f)) << f;
  EXPECT_EQ(
      std::distance(fs::directory_iterator(fs::path(out).parent_path()), fs::directory_iterator()),
      1)
      << "temporary directories left beside the output";
  EXPECT_FALSE(progress.empty());

  // 7 documents at 90/5/5: val and test get one each, train the other five.
  EXPECT_EQ(result.splits[0].document_names.size(), 5u);
  EXPECT_EQ(result.splits[1].document_names.size(), 1u);
  EXPECT_EQ(result.splits[2].document_names.size(), 1u);
  EXPECT_EQ(result.tokenizer_id, "testbyte");
  EXPECT_EQ(result.vocab_size, 257);

  // The tokenizer saw the training documents only.
  std::vector<std::string> expected_train;
  for (const auto& name : result.splits[0].document_names)
    for (const auto& [doc_name, text] : kDocs)
      if (doc_name == name) expected_train.push_back(text);
  EXPECT_EQ(train_texts, expected_train);

  const nlohmann::json meta = nlohmann::json::parse(test::read_file(out + "/meta.json"));
  EXPECT_EQ(meta, result.meta);
  EXPECT_EQ(meta["format"], "cemfrac-prepared");
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["shard_format_version"], 1);
  EXPECT_EQ(meta["source"]["kind"], "text");
  EXPECT_EQ(meta["source"]["path"], fs::absolute(src).lexically_normal().string());
  EXPECT_EQ(meta["tokenizer"]["id"], "testbyte");
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 257);
  EXPECT_EQ(meta["tokenizer"]["eot_id"], 256);
  EXPECT_EQ(meta["tokenizer"]["dir"], "tokenizer");
  EXPECT_EQ(meta["tokenizer"]["token_dtype"], "uint16");
  EXPECT_EQ(meta["seed"], 0);
  EXPECT_DOUBLE_EQ(meta["split"]["train"].get<double>(), 0.9);
  EXPECT_EQ(meta["document_separator"], "eot_after_each_document");

  std::set<std::string> seen;
  uint64_t total_bytes = 0;
  for (int s = 0; s < kNumSplits; ++s) {
    const PreparedSplit& split = result.splits[s];
    const nlohmann::json& j = meta["splits"][kSplitNames[s]];
    EXPECT_EQ(j["file"], std::string(kSplitNames[s]) + ".bin");
    EXPECT_EQ(j["documents"], split.document_names.size());
    EXPECT_EQ(j["document_names"].get<std::vector<std::string>>(), split.document_names);
    EXPECT_EQ(j["tokens"], split.tokens);
    EXPECT_EQ(j["bytes"], split.bytes);

    ShardReader shard(out + "/" + split.file, {257, "testbyte"});
    EXPECT_NO_THROW(shard.verify());
    EXPECT_EQ(shard.size(), split.tokens);
    EXPECT_EQ(shard.header().document_count, split.document_names.size());
    // Byte tokens: one per byte plus one end-of-text per document.
    EXPECT_EQ(split.tokens, split.bytes + split.document_names.size());
    EXPECT_DOUBLE_EQ(split.bytes_per_token, 1.0);

    // The shard decodes back to the documents, in input order, each followed by the separator.
    const std::vector<std::string> decoded = decode_documents(shard, TestByteTokenizer());
    ASSERT_EQ(decoded.size(), split.document_names.size());
    std::string joined;
    for (size_t i = 0; i < decoded.size(); ++i) {
      const std::string& name = split.document_names[i];
      EXPECT_TRUE(seen.insert(name).second) << name << " is in two splits";
      const auto it =
          std::find_if(kDocs.begin(), kDocs.end(), [&](const auto& d) { return d.first == name; });
      ASSERT_NE(it, kDocs.end());
      EXPECT_EQ(decoded[i], it->second) << name;
      joined += it->second + "<|endoftext|>";
      total_bytes += it->second.size();
    }
    EXPECT_EQ(TestByteTokenizer().decode(shard.to_vector()), joined);
    EXPECT_TRUE(std::is_sorted(split.document_names.begin(), split.document_names.end()));
  }
  EXPECT_EQ(seen.size(), kDocs.size());
  uint64_t expected_bytes = 0;
  for (const auto& d : kDocs) expected_bytes += d.second.size();
  EXPECT_EQ(total_bytes, expected_bytes);
}

TEST(Prepare, SameInputsGiveIdenticalFiles) {
  const std::string src = make_text_dir();
  const std::string root = test::temp_dir("prepare-out");
  prepare_dataset(byte_options(src, root + "/one"));
  prepare_dataset(byte_options(src, root + "/two"));
  for (const char* f : {"train.bin", "val.bin", "test.bin", "meta.json"})
    EXPECT_EQ(test::read_file(root + "/one/" + f), test::read_file(root + "/two/" + f)) << f;
  // Another seed moves documents between splits (7 documents, seeds 0 and 3 differ).
  PrepareOptions other = byte_options(src, root + "/three");
  other.seed = 3;
  const PrepareResult r3 = prepare_dataset(other);
  const nlohmann::json m1 = nlohmann::json::parse(test::read_file(root + "/one/meta.json"));
  EXPECT_NE(m1["splits"]["val"]["document_names"], r3.meta["splits"]["val"]["document_names"]);
}

TEST(Prepare, ExistingOutputNeedsForceAndIsReplacedWhole) {
  const std::string src = make_text_dir();
  const std::string out = test::temp_dir("prepare-out") + "/data";
  prepare_dataset(byte_options(src, out));
  test::write_file(out + "/stale.txt", "left from an earlier run");

  PrepareOptions again = byte_options(src, out);
  again.seed = 3;
  expect_error([&] { prepare_dataset(again); }, {out, "already exists", "--force"});
  again.force = true;
  const PrepareResult result = prepare_dataset(again);
  EXPECT_FALSE(fs::exists(out + "/stale.txt")) << "--force must replace the directory, not merge";
  EXPECT_EQ(nlohmann::json::parse(test::read_file(out + "/meta.json"))["seed"], 3);
  EXPECT_EQ(result.meta["seed"], 3);

  // --force never deletes a directory that is not a prepared dataset.
  const std::string precious = test::temp_dir("prepare-out") + "/precious";
  fs::create_directories(precious);
  test::write_file(precious + "/thesis.tex", "years of work");
  PrepareOptions forced = byte_options(src, precious);
  forced.force = true;
  expect_error([&] { prepare_dataset(forced); }, {precious, "not a prepared dataset"});
  EXPECT_EQ(test::read_file(precious + "/thesis.tex"), "years of work");

  // An empty directory is fine with --force.
  const std::string empty = test::temp_dir("prepare-out");
  forced.out_dir = empty;
  prepare_dataset(forced);
  EXPECT_TRUE(fs::is_regular_file(empty + "/meta.json"));
}

TEST(Prepare, AFailureLeavesNoOutputDirectory) {
  const std::string src = make_text_dir();
  test::write_file(src + "/sub/h.txt", "POISON makes the test tokenizer throw");
  const std::string parent = test::temp_dir("prepare-out");
  PrepareOptions options = byte_options(src, parent + "/data");
  options.split = parse_split_fractions("100,0,0");  // h.txt is encoded (after some shards exist)
  expect_error([&] { prepare_dataset(options); }, {"poisoned"});
  EXPECT_FALSE(fs::exists(parent + "/data"));
  EXPECT_TRUE(fs::is_empty(parent)) << "temporary files left behind";
}

TEST(Prepare, OptionErrors) {
  const std::string src = make_text_dir();
  const std::string out = test::temp_dir("prepare-out") + "/data";
  PrepareOptions none = byte_options("", out);
  expect_error([&] { prepare_dataset(none); },
               {"no input", "--corpus brown, --corpus mix or --text"});
  PrepareOptions both = byte_options(src, out);
  both.corpus = "brown";
  expect_error([&] { prepare_dataset(both); }, {"both --corpus and --text"});
  PrepareOptions unknown = byte_options("", out);
  unknown.corpus = "gutenberg";
  expect_error([&] { prepare_dataset(unknown); },
               {"unknown corpus 'gutenberg'", "'brown' and 'mix'"});
  expect_error([&] { prepare_dataset(byte_options(src, "")); }, {"--out"});
  // One file is one document: the default split needs three.
  expect_error([&] { prepare_dataset(byte_options(src + "/a.txt", out)); },
               {"1 document cannot be split", "--split 100,0,0"});
  PrepareOptions single = byte_options(src + "/a.txt", out);
  single.split = parse_split_fractions("100,0,0");
  const PrepareResult r = prepare_dataset(single);
  EXPECT_EQ(r.splits[0].document_names, std::vector<std::string>{"a.txt"});
  EXPECT_EQ(ShardReader(out + "/val.bin").size(), 0u);  // an empty split is an empty shard
}

// ---- CLI ----

int count_lines(const std::string& s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// Non-zero exit, nothing on stdout, and stderr ending in ONE error line that holds `part` (progress
// lines such as "prepare: reading ..." may come before it).
void expect_cli_error(const std::vector<std::string>& args, const std::string& part) {
  const test::RunResult r = test::run_cemfrac(args);
  EXPECT_NE(r.exit_code, 0) << "args ending in " << args.back();
  EXPECT_EQ(r.out, "");
  ASSERT_FALSE(r.err.empty());
  ASSERT_EQ(r.err.back(), '\n');
  const size_t start = r.err.rfind('\n', r.err.size() - 2) + 1;  // 0 when there is one line
  const std::string last = r.err.substr(start);
  EXPECT_EQ(last.rfind("cemfrac: error: ", 0), 0u) << "last line is not the error: " << r.err;
  EXPECT_NE(last.find(part), std::string::npos) << "'" << part << "' missing in: " << r.err;
  EXPECT_EQ(r.err.find("cemfrac: error"), start) << "more than one error line: " << r.err;
  EXPECT_LE(count_lines(r.err), 3) << r.err;
}

TEST(PrepareCli, ErrorsAreOneLineAndNonZero) {
  const std::string src = make_text_dir();
  const std::string out = test::temp_dir("prepare-cli") + "/data";
  expect_cli_error({"prepare", "--text", src}, "--out");
  expect_cli_error({"prepare", "--corpus", "brown", "--text", src, "--out", out}, "--text");
  expect_cli_error({"prepare", "--out", out}, "no input");
  expect_cli_error({"prepare", "--text", src + "/missing", "--out", out}, "does not exist");
  const std::string empty = test::temp_dir("prepare-cli");
  expect_cli_error({"prepare", "--text", empty, "--out", out}, "no .txt files");
  expect_cli_error({"prepare", "--corpus", "gutenberg", "--out", out},
                   "unknown corpus 'gutenberg'");
  expect_cli_error({"prepare", "--text", src, "--out", out, "--split", "90,10"}, "--split 90,10");
  expect_cli_error({"prepare", "--text", src, "--out", out, "--tokenizer", "wordpiece"},
                   "wordpiece");
  expect_cli_error({"prepare", "--text", src, "--out", empty}, "already exists");
  EXPECT_FALSE(fs::exists(out));
}

TEST(PrepareCli, ByteTokenizerEndToEnd) {
  // Uses the real "byte" tokenizer (data/tokenizer.cpp).
  const std::string src = make_text_dir();
  const std::string out = test::temp_dir("prepare-cli") + "/data";
  const test::RunResult r =
      test::run_cemfrac({"prepare", "--text", src, "--tokenizer", "byte", "--out", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("prepare: encoding train"), std::string::npos) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["out"], out);
  EXPECT_EQ(j["tokenizer"]["id"], "byte");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 257);
  EXPECT_TRUE(j.contains("seconds")) << "no timings in --json";
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(out + "/tokenizer");
  EXPECT_EQ(tokenizer->id(), "byte");
  size_t documents = 0;
  for (const char* split : {"train", "val", "test"}) {
    ShardReader shard(out + "/" + split + ".bin", {257, "byte"});
    shard.verify();
    const std::vector<std::string> decoded = decode_documents(shard, *tokenizer);
    const auto names = j["splits"][split]["document_names"].get<std::vector<std::string>>();
    ASSERT_EQ(decoded.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_EQ(decoded[i], test::read_file(src + "/" + names[i]));
    documents += names.size();
  }
  EXPECT_EQ(documents, kDocs.size());

  // The readable summary.
  const test::RunResult table = test::run_cemfrac(
      {"prepare", "--text", src, "--tokenizer", "byte", "--out", out, "--force", "--seed", "5"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("bytes/token"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("train"), std::string::npos);
  EXPECT_NE(table.out.find("total"), std::string::npos);
}

}  // namespace
}  // namespace cemfrac

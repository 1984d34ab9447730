// Token shards: write -> read round trips in both dtypes, the documented byte layout, every
// corruption the reader must reject (a one-line message naming the file and the problem), and
// atomic writing.
#include "cemfrac/data/shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {
namespace fs = std::filesystem;

// The message of the cemfrac::Error that `f` throws ("" when it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Asserts that `f` throws a cemfrac::Error whose single-line message holds every piece of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  const std::string message = error_of(f);
  ASSERT_FALSE(message.empty()) << "expected a cemfrac::Error holding '" << parts.front() << "'";
  EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' missing in: " << message;
}

const ShardInfo kInfo300{300, 299, "test:300"};

// A shard file made from header fields and raw uint16 tokens (both checksums valid unless changed).
std::string raw_shard(ShardHeader header, const std::vector<uint16_t>& tokens) {
  std::string body(tokens.size() * 2, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    body[2 * i] = static_cast<char>(tokens[i] & 0xff);
    body[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  header.tokens_crc32 = crc32_update(0, body.data(), body.size());
  return encode_shard_header(header) + body;
}

ShardHeader header300(uint64_t tokens, uint64_t documents) {
  ShardHeader h;
  h.dtype = TokenDtype::kUint16;
  h.eot_id = 299;
  h.vocab_size = 300;
  h.token_count = tokens;
  h.document_count = documents;
  h.tokenizer_id = "test:300";
  return h;
}

uint32_t read_u32(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return v;
}

uint64_t read_u64(const std::string& bytes, size_t offset) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return v;
}

TEST(Crc32, MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
  // Running checksum over two pieces equals one pass.
  EXPECT_EQ(crc32_update(crc32_update(0, "1234", 4), "56789", 5), 0xCBF43926u);
  EXPECT_EQ(crc32_update(0, "", 0), 0u);
}

TEST(ShardDtype, Uint16UpToVocab65536) {
  EXPECT_EQ(token_dtype_for_vocab(257), TokenDtype::kUint16);
  EXPECT_EQ(token_dtype_for_vocab(50257), TokenDtype::kUint16);
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDtype::kUint16);
  EXPECT_EQ(token_dtype_for_vocab(65537), TokenDtype::kUint32);
}

TEST(Shard, RoundTripUint16) {
  const std::string path = test::temp_dir("shard") + "/a.bin";
  const std::vector<std::vector<TokenId>> docs = {{1, 2, 3}, {}, {298, 0, 255, 256}};
  const ShardHeader written = write_shard(path, kInfo300, docs);
  EXPECT_EQ(written.token_count, 10u);
  EXPECT_EQ(written.document_count, 3u);

  ShardReader reader(path, {300, "test:300"});
  EXPECT_EQ(reader.path(), path);
  EXPECT_EQ(reader.dtype(), TokenDtype::kUint16);
  EXPECT_EQ(reader.header().version, kShardVersion);
  EXPECT_EQ(reader.header().vocab_size, 300);
  EXPECT_EQ(reader.header().eot_id, 299);
  EXPECT_EQ(reader.header().tokenizer_id, "test:300");
  EXPECT_EQ(reader.header().document_count, 3u);
  EXPECT_EQ(reader.header().tokens_crc32, written.tokens_crc32);
  ASSERT_EQ(reader.size(), 10u);
  const std::vector<TokenId> expected = {1, 2, 3, 299, 299, 298, 0, 255, 256, 299};
  EXPECT_EQ(reader.to_vector(), expected);
  EXPECT_EQ(fs::file_size(path), kShardHeaderSize + 10 * 2);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(reader.at(i), expected[i]) << "token " << i;
    EXPECT_EQ(reader.data_u16()[i], expected[i]) << "mapped token " << i;
  }
  std::vector<int64_t> window(4);
  reader.copy_to(5, 4, window.data());
  EXPECT_EQ(window, (std::vector<int64_t>{298, 0, 255, 256}));
  EXPECT_NO_THROW(reader.verify());
  expect_error([&] { reader.at(10); }, {path, "index 10 is out of range"});
  expect_error([&] { reader.copy_to(8, 3, window.data()); }, {path, "out of range"});
  expect_error([&] { reader.data_u32(); }, {path, "not uint32"});

  // A moved-to reader keeps the mapping.
  ShardReader moved = std::move(reader);
  EXPECT_EQ(moved.to_vector(), expected);
}

TEST(Shard, RoundTripUint32) {
  const std::string path = test::temp_dir("shard") + "/b.bin";
  const ShardInfo info{70000, 0, "sp:70000"};
  const std::vector<std::vector<TokenId>> docs = {{69999, 65536, 65535, 1}, {42}};
  write_shard(path, info, docs);
  ShardReader reader(path, {70000, "sp:70000"});
  EXPECT_EQ(reader.dtype(), TokenDtype::kUint32);
  EXPECT_EQ(fs::file_size(path), kShardHeaderSize + 7 * 4);
  const std::vector<TokenId> expected = {69999, 65536, 65535, 1, 0, 42, 0};
  EXPECT_EQ(reader.to_vector(), expected);
  EXPECT_EQ(reader.data_u32()[1], 65536u);
  EXPECT_NO_THROW(reader.verify());
}

TEST(Shard, EmptyShardRoundTrips) {
  const std::string path = test::temp_dir("shard") + "/empty.bin";
  write_shard(path, kInfo300, std::vector<std::vector<TokenId>>{});
  ShardReader reader(path);
  EXPECT_EQ(reader.size(), 0u);
  EXPECT_EQ(fs::file_size(path), kShardHeaderSize);
  EXPECT_NO_THROW(reader.verify());
}

TEST(Shard, StreamsMoreThanOneWriteBuffer) {
  // 1.5 M uint16 tokens = 3 MB, past the writer's 1 MiB buffer; verify() recomputes the checksum.
  const std::string path = test::temp_dir("shard") + "/big.bin";
  const ShardInfo info{1000, 999, "test:1000"};
  write_shard(path, info, [](ShardSink& sink) {
    std::vector<TokenId> doc(1499);
    for (int d = 0; d < 1000; ++d) {
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<TokenId>((d * 7 + i) % 999);
      sink.append_document(doc);
    }
  });
  ShardReader reader(path);
  ASSERT_EQ(reader.size(), 1'500'000u);
  EXPECT_EQ(reader.header().document_count, 1000u);
  EXPECT_EQ(reader.at(1500 * 999 + 3), static_cast<TokenId>((999 * 7 + 3) % 999));
  EXPECT_EQ(reader.at(1500 * 1000 - 1), 999);
  EXPECT_NO_THROW(reader.verify());
}

TEST(Shard, HeaderHasTheDocumentedLayout) {
  // docs/formats.md: little-endian fields at fixed offsets, tokens from byte 128.
  const std::string path = test::temp_dir("shard") + "/layout.bin";
  write_shard(path, ShardInfo{4096, 1, "sp:4096"}, std::vector<std::vector<TokenId>>{{0x0102, 7}});
  const std::string bytes = test::read_file(path);
  ASSERT_EQ(bytes.size(), 128u + 3 * 2);
  EXPECT_EQ(bytes.substr(0, 8), "CEMFTOKS");
  EXPECT_EQ(read_u32(bytes, 8), 1u);      // version
  EXPECT_EQ(read_u32(bytes, 12), 128u);   // header size
  EXPECT_EQ(read_u32(bytes, 16), 2u);     // dtype uint16
  EXPECT_EQ(read_u32(bytes, 20), 1u);     // end-of-text id
  EXPECT_EQ(read_u64(bytes, 24), 4096u);  // vocabulary size
  EXPECT_EQ(read_u64(bytes, 32), 3u);     // token count
  EXPECT_EQ(read_u64(bytes, 40), 1u);     // document count
  EXPECT_EQ(bytes.substr(48, 7), "sp:4096");
  EXPECT_EQ(bytes.substr(55, 64 - 7), std::string(57, '\0'));  // NUL padding
  EXPECT_EQ(read_u32(bytes, 112), crc32_update(0, bytes.data() + 128, 6));
  EXPECT_EQ(bytes.substr(116, 8), std::string(8, '\0'));  // reserved
  EXPECT_EQ(read_u32(bytes, 124), crc32_update(0, bytes.data(), 124));
  EXPECT_EQ(static_cast<unsigned char>(bytes[128]), 0x02);  // 0x0102, low byte first
  EXPECT_EQ(static_cast<unsigned char>(bytes[129]), 0x01);
  EXPECT_EQ(static_cast<unsigned char>(bytes[132]), 0x01);  // trailing end-of-text
  EXPECT_EQ(static_cast<unsigned char>(bytes[133]), 0x00);
}

TEST(ShardReader, RejectsWrongMagic) {
  const std::string dir = test::temp_dir("shard");
  std::string bytes = raw_shard(header300(2, 1), {5, 299});
  bytes[0] = 'X';
  test::write_file(dir + "/m.bin", bytes);
  expect_error([&] { ShardReader(dir + "/m.bin"); },
               {dir + "/m.bin", "not a cemfrac token shard", "XEMFTOKS"});
  test::write_file(dir + "/t.bin", "hello");  // shorter than the magic
  expect_error([&] { ShardReader(dir + "/t.bin"); }, {dir + "/t.bin", "not a cemfrac token shard"});
  test::write_file(dir + "/e.bin", "");
  expect_error([&] { ShardReader(dir + "/e.bin"); }, {dir + "/e.bin", "empty"});
  expect_error([&] { ShardReader(dir + "/missing.bin"); }, {dir + "/missing.bin", "no such file"});
}

TEST(ShardReader, RejectsUnknownVersion) {
  const std::string path = test::temp_dir("shard") + "/v.bin";
  ShardHeader h = header300(2, 1);
  h.version = 2;
  test::write_file(path, raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader{path}; },
               {path, "format version 2 is not supported", "version 1"});
}

TEST(ShardReader, RejectsTruncatedFiles) {
  const std::string dir = test::temp_dir("shard");
  const std::string full = raw_shard(header300(3, 1), {5, 6, 299});
  test::write_file(dir + "/short.bin", full.substr(0, full.size() - 1));
  expect_error([&] { ShardReader(dir + "/short.bin"); },
               {dir + "/short.bin", "truncated", "3 uint16 tokens", "134 bytes", "133 bytes"});
  test::write_file(dir + "/header.bin", full.substr(0, 64));  // magic intact, header cut
  expect_error([&] { ShardReader(dir + "/header.bin"); },
               {dir + "/header.bin", "truncated", "64 bytes"});
  test::write_file(dir + "/long.bin", full + "xy");
  expect_error([&] { ShardReader(dir + "/long.bin"); }, {dir + "/long.bin", "2 unexpected bytes"});
}

TEST(ShardReader, RejectsUnknownDtype) {
  const std::string path = test::temp_dir("shard") + "/d.bin";
  ShardHeader h = header300(2, 1);
  h.dtype = static_cast<TokenDtype>(3);
  test::write_file(path, raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader{path}; }, {path, "unknown token dtype code 3"});
}

TEST(ShardReader, RejectsUint16ForALargeVocabulary) {
  const std::string path = test::temp_dir("shard") + "/u.bin";
  ShardHeader h = header300(2, 1);
  h.vocab_size = 70000;
  test::write_file(path, raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader{path}; }, {path, "uint16 cannot hold vocabulary size 70000"});
}

TEST(ShardReader, RejectsACorruptHeader) {
  const std::string dir = test::temp_dir("shard");
  std::string bytes = raw_shard(header300(2, 1), {5, 299});
  bytes[24] = 0x2d;  // vocabulary 300 -> 301, checksum left as it was
  test::write_file(dir + "/c.bin", bytes);
  expect_error([&] { ShardReader(dir + "/c.bin"); }, {dir + "/c.bin", "header checksum mismatch"});

  ShardHeader h = header300(2, 1);
  h.eot_id = 300;
  test::write_file(dir + "/eot.bin", raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader(dir + "/eot.bin"); },
               {dir + "/eot.bin", "end-of-text id 300 is not below the vocabulary size 300"});

  h = header300(2, 3);
  test::write_file(dir + "/docs.bin", raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader(dir + "/docs.bin"); }, {dir + "/docs.bin", "3 documents"});

  h = header300(2, 1);
  h.tokenizer_id = "";
  test::write_file(dir + "/id.bin", raw_shard(h, {5, 299}));
  expect_error([&] { ShardReader(dir + "/id.bin"); }, {dir + "/id.bin", "tokenizer id field"});
}

TEST(ShardReader, RejectsAVocabularyOrTokenizerMismatch) {
  const std::string path = test::temp_dir("shard") + "/x.bin";
  write_shard(path, kInfo300, std::vector<std::vector<TokenId>>{{1, 2}});
  expect_error(
      [&] {
        ShardReader(path, {4096, ""});
      },
      {path, "vocabulary size 300", "'test:300'", "expected 4096"});
  expect_error(
      [&] {
        ShardReader(path, {-1, "sp:4096"});
      },
      {path, "tokenizer 'test:300' does not match the expected 'sp:4096'"});
  EXPECT_NO_THROW(ShardReader(path, {300, "test:300"}));
}

TEST(ShardReader, VerifyFindsTokensOutOfRange) {
  const std::string path = test::temp_dir("shard") + "/r.bin";
  test::write_file(path, raw_shard(header300(4, 1), {5, 300, 7, 299}));
  ShardReader reader(path);  // opening is O(1) and does not scan
  expect_error([&] { reader.verify(); },
               {path, "token 300 at index 1 is not below the vocabulary size 300"});
}

TEST(ShardReader, VerifyFindsCorruptTokens) {
  const std::string dir = test::temp_dir("shard");
  std::string bytes = raw_shard(header300(3, 1), {5, 6, 299});
  bytes[128] = 9;  // token 5 -> 9: still in range, but the checksum no longer matches
  test::write_file(dir + "/crc.bin", bytes);
  expect_error([&] { ShardReader(dir + "/crc.bin").verify(); },
               {dir + "/crc.bin", "token checksum mismatch"});

  test::write_file(dir + "/eots.bin", raw_shard(header300(3, 2), {5, 6, 299}));
  expect_error([&] { ShardReader(dir + "/eots.bin").verify(); },
               {dir + "/eots.bin", "1 end-of-text tokens but the header lists 2 documents"});

  test::write_file(dir + "/tail.bin", raw_shard(header300(3, 1), {5, 299, 6}));
  expect_error([&] { ShardReader(dir + "/tail.bin").verify(); },
               {dir + "/tail.bin", "last token is not the end-of-text"});
}

// A tokenizer that only has an identity (id, vocabulary, end-of-text): what open_token_shard asks.
class IdentityTokenizer final : public Tokenizer {
 public:
  IdentityTokenizer(std::string id, int64_t vocab, TokenId eot)
      : id_(std::move(id)), vocab_(vocab), eot_(eot) {}
  std::string id() const override { return id_; }
  int64_t vocab_size() const override { return vocab_; }
  TokenId eot_id() const override { return eot_; }
  std::vector<TokenId> encode(std::string_view) const override { return {}; }
  std::string decode(const std::vector<TokenId>&) const override { return ""; }
  void save(const std::string&) const override {}

 private:
  std::string id_;
  int64_t vocab_;
  TokenId eot_;
};

// The slicing-by-8 CRC equals the bit-by-bit definition for every length and alignment.
TEST(Crc32, SlicingEqualsTheBitwiseDefinition) {
  auto bitwise = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
    }
    return ~c;
  };
  std::vector<unsigned char> bytes(300);
  uint32_t x = 12345;
  for (auto& b : bytes) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t offset = 0; offset < 9; ++offset)
    for (size_t n = 0; n + offset <= bytes.size(); n += 7)
      ASSERT_EQ(crc32_update(0, bytes.data() + offset, n), bitwise(bytes.data() + offset, n))
          << "offset " << offset << " length " << n;
  // A running checksum split at an odd place equals one pass.
  EXPECT_EQ(crc32_update(crc32_update(0, bytes.data(), 13), bytes.data() + 13, 287),
            crc32_update(0, bytes.data(), 300));
}

// open_token_shard is the one check train and eval run before reading: header, tokenizer identity
// (id, vocabulary size, end-of-text id), the model's vocabulary, then the full scan.
TEST(OpenTokenShard, ChecksTokenizerIdentityAndModelVocabulary) {
  const std::string path = test::temp_dir("shard") + "/x.bin";
  write_shard(path, kInfo300, std::vector<std::vector<TokenId>>{{1, 2}});
  const IdentityTokenizer same("test:300", 300, 299);
  ShardCheck check;
  check.tokenizer = &same;
  check.model_vocab_size = 300;
  EXPECT_EQ(open_token_shard(path, check)->size(), 3u);

  const IdentityTokenizer other_name("sp:300", 300, 299), other_vocab("test:300", 301, 299),
      other_eot("test:300", 300, 0);
  check.tokenizer = &other_name;
  expect_error([&] { open_token_shard(path, check); },
               {path, "prepared with tokenizer 'test:300', not the model's 'sp:300'"});
  check.tokenizer = &other_vocab;
  expect_error([&] { open_token_shard(path, check); },
               {path, "vocabulary size 300 in the header differs from tokenizer 'test:300' (301)"});
  check.tokenizer = &other_eot;
  expect_error([&] { open_token_shard(path, check); },
               {path, "end-of-text id 299 in the header differs from tokenizer 'test:300' (0)"});
  check.tokenizer = &same;
  check.model_vocab_size = 299;
  expect_error([&] { open_token_shard(path, check); },
               {path,
                "data's vocabulary (300, tokenizer 'test:300') is larger than the model's "
                "vocab_size (299)"});
}

TEST(OpenTokenShard, ScansEveryTokenUnlessOptedOut) {
  const std::string dir = test::temp_dir("shard");
  const IdentityTokenizer tok("test:300", 300, 299);
  ShardCheck check;
  check.tokenizer = &tok;
  check.model_vocab_size = 512;  // padded: ids 300..511 exist in the model but not in the data
  // A stale checksum (token bytes changed after writing).
  std::string bytes = raw_shard(header300(3, 1), {5, 6, 299});
  bytes[128] = 9;
  test::write_file(dir + "/crc.bin", bytes);
  expect_error([&] { open_token_shard(dir + "/crc.bin", check); },
               {dir + "/crc.bin", "token checksum mismatch"});
  // An id at or above the tokenizer's vocabulary but below the model's, checksum valid: the first
  // bad index and id are named (the scan reports ids before the checksum).
  std::vector<uint16_t> tokens(200000, 7);
  tokens[70001] = 400;
  tokens[150000] = 301;
  tokens.back() = 299;
  test::write_file(dir + "/ids.bin", raw_shard(header300(tokens.size(), 1), tokens));
  expect_error([&] { open_token_shard(dir + "/ids.bin", check); },
               {dir + "/ids.bin", "token 400 at index 70001 is not below the vocabulary size 300"});
  // An id at or above the model's vocabulary too.
  tokens[70001] = 600;
  test::write_file(dir + "/big.bin", raw_shard(header300(tokens.size(), 1), tokens));
  expect_error([&] { open_token_shard(dir + "/big.bin", check); },
               {dir + "/big.bin", "token 600 at index 70001"});
  // The opt-out skips the scan, but the loader's copy still refuses the id when it reaches it.
  check.verify_tokens = false;
  const auto shard = open_token_shard(dir + "/big.bin", check);
  std::vector<int64_t> window(10);
  EXPECT_NO_THROW(shard->copy_to(0, 10, window.data()));
  expect_error([&] { shard->copy_to(70000, 10, window.data()); },
               {dir + "/big.bin", "token 600 at index 70001"});
  EXPECT_NO_THROW(open_token_shard(dir + "/crc.bin", check));
}

TEST(ShardWriter, RejectsBadTokensAndSettings) {
  const std::string dir = test::temp_dir("shard");
  expect_error(
      [&] {
        write_shard(dir + "/a.bin", kInfo300, {{1, 300}});
      },
      {dir + "/a.bin", "token id 300 is outside the vocabulary [0, 300)"});
  expect_error([&] { write_shard(dir + "/b.bin", kInfo300, {{-1}}); }, {"token id -1"});
  expect_error(
      [&] {
        write_shard(dir + "/c.bin", kInfo300, {{1}, {2, 299}});
      },
      {"end-of-text id 299 appears inside document 1"});
  expect_error(
      [&] {
        write_shard(dir + "/d.bin", ShardInfo{300, 299, std::string(64, 'x')}, {{1}});
      },
      {"1 to 63 bytes"});
  expect_error(
      [&] {
        write_shard(dir + "/e.bin", ShardInfo{300, 300, "t"}, {{1}});
      },
      {"end-of-text id 300 is outside the vocabulary"});
  EXPECT_TRUE(fs::is_empty(dir)) << "a rejected write left a file behind";
}

TEST(ShardWriter, NothingAppearsWhenTheWriterThrowsMidway) {
  const std::string dir = test::temp_dir("shard");
  const std::string path = dir + "/train.bin";
  auto failing = [](ShardSink& sink) {
    for (int d = 0; d < 2000; ++d) sink.append_document(std::vector<TokenId>(1000, d % 299));
    throw std::runtime_error("encoder crashed");  // after ~4 MB were written
  };
  EXPECT_THROW(write_shard(path, kInfo300, failing), std::runtime_error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir)) << "the temporary file was left behind";

  // An existing shard survives a failed rewrite unchanged.
  write_shard(path, kInfo300, {{1, 2, 3}});
  const std::string before = test::read_file(path);
  EXPECT_THROW(write_shard(path, kInfo300, failing), std::runtime_error);
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace cemfrac

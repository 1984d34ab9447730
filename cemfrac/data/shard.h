// Token shards: one binary file of token ids per data split (train.bin, val.bin, test.bin), written
// by `cemfrac prepare` and memory-mapped by the data loader. docs/formats.md describes the layout
// byte by byte; in short (all integers little-endian):
//
//   offset size  field
//        0    8  magic "CEMFTOKS"
//        8    4  format version (kShardVersion = 1)
//       12    4  header size in bytes (128 in version 1; the tokens start here)
//       16    4  token dtype: 2 = uint16, 4 = uint32 (the value is the bytes per token)
//       20    4  end-of-text id (the document separator)
//       24    8  vocabulary size V (every token is < V)
//       32    8  token count (end-of-text separators included)
//       40    8  document count (= the number of end-of-text tokens)
//       48   64  tokenizer id, UTF-8, NUL-padded ("byte", "gpt2", "sp:4096")
//      112    4  CRC-32 of the token bytes
//      116    8  reserved, zero
//      124    4  CRC-32 of header bytes 0..123
//      128  ...  token count x dtype bytes
//
// Documents: each document's tokens are followed by ONE end-of-text id (after, not before as GPT-2
// does), so the shard ends with an end-of-text, the document count is the number of end-of-text
// tokens, and cutting the token stream after each end-of-text gives the documents back.
//
// No torch here: the reader hands out raw pointers into the mapping; the loader wraps them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"

namespace cemfrac {

inline constexpr char kShardMagic[8] = {'C', 'E', 'M', 'F', 'T', 'O', 'K', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardHeaderSize = 128;
inline constexpr size_t kShardTokenizerIdSize = 64;  // bytes, NUL-padded; ids up to 63 bytes
inline constexpr int64_t kShardMaxUint16Vocab = 65536;

enum class TokenDtype : uint32_t { kUint16 = 2, kUint32 = 4 };

// uint16 when every id fits (vocab_size <= 65536), else uint32.
TokenDtype token_dtype_for_vocab(int64_t vocab_size);
const char* to_string(TokenDtype dtype);

// What the writer needs to know; the reader's header repeats it.
struct ShardInfo {
  int64_t vocab_size = 0;
  TokenId eot_id = 0;
  std::string tokenizer_id;
};

struct ShardHeader {
  uint32_t version = kShardVersion;
  TokenDtype dtype = TokenDtype::kUint16;
  TokenId eot_id = 0;
  int64_t vocab_size = 0;
  uint64_t token_count = 0;
  uint64_t document_count = 0;
  std::string tokenizer_id;
  uint32_t tokens_crc32 = 0;
};

// Receives the tokens of one shard, document by document. Ids are checked as they arrive: each must
// be in [0, vocab_size) and must not be the end-of-text id (end_document() adds that).
class ShardSink {
 public:
  virtual ~ShardSink() = default;
  virtual void append(const TokenId* ids, size_t n) = 0;
  virtual void end_document() = 0;  // appends the end-of-text id
  void append_document(const std::vector<TokenId>& ids) {
    append(ids.data(), ids.size());
    end_document();
  }
  virtual uint64_t token_count() const = 0;
  virtual uint64_t document_count() const = 0;
};

// Streams a shard to `path`: produce(sink) appends the documents, then the header is completed. The
// file is written under a temporary name and renamed when complete (core/atomic_file.h): if produce
// or the writing throws, nothing appears at `path`. Returns the header that was written.
ShardHeader write_shard(const std::string& path, const ShardInfo& info,
                        const std::function<void(ShardSink& sink)>& produce);

// Convenience: one call for documents already in memory.
ShardHeader write_shard(const std::string& path, const ShardInfo& info,
                        const std::vector<std::vector<TokenId>>& documents);

// What a caller expects of a shard it opens; empty / negative fields are not checked.
struct ShardExpectation {
  int64_t vocab_size = -1;
  std::string tokenizer_id;
};

// A read-only memory mapping of one shard. Opening validates the header (magic, version, header
// size and checksum, dtype, field ranges, file size) and the expectation, in O(1); verify() scans
// all tokens. Every failure is a cemfrac::Error whose one line names the file and the problem.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path, const ShardExpectation& expect = {});
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t size() const { return header_.token_count; }
  TokenDtype dtype() const { return header_.dtype; }

  // The raw little-endian tokens (token_count elements of dtype()); data_u16 / data_u32 check
  // that the dtype is the one asked for.
  const void* data() const { return tokens_; }
  const uint16_t* data_u16() const;
  const uint32_t* data_u32() const;

  // Token i (bounds-checked).
  TokenId at(uint64_t i) const;
  // Copies tokens [begin, begin + count) as int64 (the loader's dtype); throws when out of range
  // or when a token is not below the header's vocabulary size (naming the index and the id), so an
  // unverified shard (--no-verify-data) still never hands out an id the header does not allow.
  void copy_to(uint64_t begin, uint64_t count, int64_t* out) const;
  // All tokens as int32 (tests and small shards).
  std::vector<TokenId> to_vector() const;

  // Full scan: every token < vocab size (the error names the first bad index and id), end-of-text
  // count == document count, the last token an end-of-text when there is any token, and the token
  // checksum. One pass over the mapping for the ids, one for the CRC (slicing-by-8, GB/s).
  void verify() const;

 private:
  void unmap();
  std::string path_;
  ShardHeader header_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
};

// What a command holds a shard it is about to read against (open_token_shard). Fields left at
// their defaults are not checked.
struct ShardCheck {
  // The tokenizer of the run or checkpoint: the header's tokenizer id, vocabulary size and
  // end-of-text id must all equal its own.
  const Tokenizer* tokenizer = nullptr;
  // The model's vocabulary (embedding rows): the header's vocabulary must not exceed it, so every
  // token id, being below the header's vocabulary, is below it too.
  int64_t model_vocab_size = -1;
  // The full scan of ShardReader::verify(): every token id below the vocabulary (the error names
  // the first bad index and id), the end-of-text count, the last token and the token CRC-32.
  // false only on an explicit user opt-out (--no-verify-data).
  bool verify_tokens = true;
};

// The one way a command (train, eval) opens a token shard: the header checks of ShardReader, then
// `check`, all before the caller reads a token. Every failure is one line naming the file.
std::shared_ptr<const ShardReader> open_token_shard(const std::string& path,
                                                    const ShardCheck& check);

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as in zlib: crc32_update(0, "123456789", 9)
// == 0xCBF43926. Pass the previous result to continue a running checksum.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

// The 128-byte header for `header`, both checksums included (the writer's encoder, exposed so tests
// can build shards with chosen, possibly invalid, field values).
std::string encode_shard_header(const ShardHeader& header);

}  // namespace cemfrac

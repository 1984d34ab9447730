// Tokenizers behind one interface.
//   byte    256 byte ids + end-of-text (id 256)
//   gpt2    GPT-2's byte-level BPE from encoder.json + vocab.bpe (ids equal the reference tokenizer's)
//   sp:N    a SentencePiece model of vocabulary N trained on the training split by `cemfrac prepare`
// A tokenizer saves itself into a directory (beside prepared data, inside checkpoints) as
// tokenizer.json (kind and settings) plus the files it needs, and load_tokenizer() reads it back.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cemfrac {

using TokenId = int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Stable identifier, also written into token shards: "byte", "gpt2", "sp:4096".
  virtual std::string id() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual TokenId eot_id() const = 0;  // end-of-text: separates documents in shards

  // Text to ids. Plain text only: a literal "<|endoftext|>" in the text is encoded as ordinary text,
  // never as the end-of-text id (documents are separated by the caller).
  virtual std::vector<TokenId> encode(std::string_view text) const = 0;
  // Ids to text. The end-of-text id decodes to "<|endoftext|>"; ids out of range are an error.
  virtual std::string decode(const std::vector<TokenId>& ids) const = 0;

  // Writes tokenizer.json and the tokenizer's files into `dir` (created if missing), atomically.
  virtual void save(const std::string& dir) const = 0;
};

// "byte" | "gpt2" | "sp:N" (the last only through train_sentencepiece). gpt2 reads its files from the
// npm cache (scripts/setup.sh). Throws cemfrac::Error for unknown specs.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// Reads what Tokenizer::save wrote.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

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
std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& documents,
                                               const SentencePieceOptions& options);

// Parses "byte" | "gpt2" | "sp:N" | "sp:N:unigram" | "sp:N:bpe"; throws cemfrac::Error otherwise.
struct TokenizerSpec {
  std::string kind;  // "byte", "gpt2", "sp"
  SentencePieceOptions sp;
};
TokenizerSpec parse_tokenizer_spec(const std::string& spec);

}  // namespace cemfrac

// "sp:N" / "sp:N:unigram": a SentencePiece model trained by train_sentencepiece (tokenizer.h has
// the settings), run through the shim module (sentencepiece_library.h). Two things SentencePiece
// does not do for us, done here so that decode(encode(s)) == s:
//  - end-of-text: the model's eos control piece "<|endoftext|>" (id 1) is the eot id; SentencePiece
//    decodes control pieces to nothing, so decode() cuts the ids at each eot and puts
//    kEndOfText back.
//  - U+2581 ("▁"): SentencePiece writes spaces as this character and turns it back into a
//    space when decoding, so a literal U+2581 in the text would come back as a space. encode()
//    therefore cuts the text at each U+2581 and writes it as its three byte pieces
//    <0xE2><0x96><0x81>, which decode as the character itself.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cemfrac/data/sentencepiece_library.h"
#include "cemfrac/data/tokenizer.h"

namespace cemfrac {

// train_sentencepiece reads at most this many training lines (a seeded sample of them beyond that).
inline constexpr int64_t kSentencePieceMaxSentences = 2'000'000;
// Training lines longer than this are cut (at a space where possible) before training.
inline constexpr size_t kSentencePieceMaxLineBytes = 8192;

// encode() hands SentencePiece at most this many bytes per call: its memory grows by ~230 bytes per
// input byte within one call (a 50 MB line took 11.6 GB), so a text is encoded in bounded pieces.
inline constexpr size_t kSentencePieceEncodeChunkBytes = size_t{256} << 10;

// The pieces encode() cuts `text` into, each at most max_bytes long (max_bytes >= 4). A cut goes
// where SentencePiece itself starts a new piece, so the ids equal those of one whole-text call:
// right before a space that follows a non-space (the start of a "▁word" or of a whitespace run), or
// right after a newline (a user-defined symbol, always a piece of its own); the last such place
// that fits is taken. A run of more than max_bytes with neither (one enormous "word", e.g. 50 MB
// without a space or newline) is cut at the last UTF-8 character boundary that fits: its ids
// decode to the same text but may differ from an unbounded call at each such cut.
std::vector<std::string_view> sentencepiece_encode_pieces(std::string_view text, size_t max_bytes);

class SentencePieceTokenizer final : public Tokenizer {
 public:
  static constexpr const char* kModelFile = "sentencepiece.model";

  // `model` is a serialized model made by train_sentencepiece (its type, bpe or unigram, is read
  // from it); `what` names the model in errors. Throws cemfrac::Error when the model is not one, is
  // of another type, or lacks the end-of-text control piece or byte fallback.
  SentencePieceTokenizer(std::string model, const std::string& what);

  std::string id() const override { return id_; }
  int64_t vocab_size() const override { return model_.vocab_size(); }
  TokenId eot_id() const override { return eot_id_; }
  // Throws cemfrac::Error for invalid UTF-8, naming the byte offset. Encodes the pieces of
  // sentencepiece_encode_pieces(text, kSentencePieceEncodeChunkBytes) one after another.
  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  // Writes sentencepiece.model, then tokenizer.json.
  void save(const std::string& dir) const override;

  const std::string& model_type() const { return model_type_; }
  const SentencePieceModel& model() const { return model_; }
  // The serialized model (the bytes of sentencepiece.model).
  const std::string& model_bytes() const { return model_bytes_; }

 private:
  std::string model_bytes_;
  std::string model_type_;
  SentencePieceModel model_;
  std::string id_;
  TokenId eot_id_ = -1;
  TokenId meta_space_bytes_[3] = {-1, -1, -1};  // <0xE2> <0x96> <0x81>
};

}  // namespace cemfrac

// SentencePiece, reached through the shim module libcemfrac_spm.so (cemfrac/data/spm_shim/), loaded
// on first use. libsentencepiece exports its own protobuf-lite, and linked beside LibTorch's
// libprotobuf the two collide at start-up, so the module is loaded where it cannot see LibTorch:
//  - "namespace" (default): dlmopen(LM_ID_NEWLM), a link-map namespace of its own with its own
//    libstdc++ and libc. Memory crosses only as copies (the C interface frees on the shim's side).
//  - "deepbind" (fallback when dlmopen fails, or CEMFRAC_SPM_LOAD=deepbind): dlopen(RTLD_NOW |
//    RTLD_LOCAL | RTLD_DEEPBIND). Works, but libsentencepiece then sees an unconstructed std::cerr
//    (the program holds the live, copy-relocated one) and crashes on its first log message, so
//    SentencePiece's logging is off in this mode.
// CEMFRAC_SPM_LOAD=auto|namespace|deepbind chooses; CEMFRAC_SPM_VERBOSE=1 shows SentencePiece's
// info messages (namespace mode). Where the module is looked for, in order: $CEMFRAC_SPM_SHIM (must
// exist when set), the path of this build's cemfrac_spm target, next to the running executable,
// ../lib.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cemfrac/data/tokenizer.h"

struct CemfracSpm;

namespace cemfrac {

// The path of the loaded shim module; loads it if needed (throws cemfrac::Error when it cannot).
std::string sentencepiece_shim_path();
// "namespace" or "deepbind" (see above); loads the module if needed.
std::string sentencepiece_shim_mode();

// Trains a model on `sentences` with SentencePiece trainer flags given as name/value pairs
// ("vocab_size", "4096"); returns the serialized model (the bytes of a .model file). `seed` seeds
// SentencePiece's sampling and shuffling. Throws cemfrac::Error with SentencePiece's message on
// failure.
std::string train_sentencepiece_model(const std::vector<std::string_view>& sentences,
                                      const std::vector<std::pair<std::string, std::string>>& flags,
                                      uint32_t seed);

// A loaded model. Move-only; every const method is thread-safe (SentencePieceProcessor's are).
class SentencePieceModel {
 public:
  enum class PieceKind { kNormal, kUnknown, kControl, kByte, kUnused };

  // Parses a serialized model; throws cemfrac::Error naming `what` (a path or "trained model").
  SentencePieceModel(std::string_view serialized, const std::string& what);
  ~SentencePieceModel();
  SentencePieceModel(SentencePieceModel&& other) noexcept;
  SentencePieceModel& operator=(SentencePieceModel&& other) noexcept;
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<TokenId>& out) const;
  // Ids must be in [0, vocab_size()).
  std::string decode(const TokenId* ids, size_t count) const;

  int32_t vocab_size() const;
  // -1 when `piece` is not in the vocabulary.
  int32_t piece_to_id(std::string_view piece) const;
  std::string id_to_piece(TokenId id) const;
  PieceKind piece_kind(TokenId id) const;
  int32_t unk_id() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  // The model as serialized bytes (what a .model file holds).
  std::string serialize() const;

 private:
  CemfracSpm* handle_ = nullptr;
};

}  // namespace cemfrac

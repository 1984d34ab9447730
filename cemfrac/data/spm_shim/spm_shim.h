// C interface of the SentencePiece shim module (libcemfrac_spm.so). The shim is the only code that
// links libsentencepiece, whose private copy of protobuf-lite must never meet LibTorch's
// libprotobuf in one symbol scope; cemfrac loads it in a separate link-map namespace (dlmopen), or
// with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) as a fallback: cemfrac/data/sentencepiece_library.cpp.
// Plain C types only, so nothing C++ crosses the boundary; memory is allocated and freed on the
// shim's side only (in its own namespace it has its own malloc).
//
// Conventions: functions returning int return 0 on success. On failure they return non-zero and,
// when `error` is not null, set *error to a malloc'd one-line message. Every buffer the shim
// returns through an out-pointer (model bytes, ids, text, messages) is malloc'd and released with
// cemfrac_spm_free.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The shim builds with hidden visibility and marks only these functions for export.
#ifndef CEMFRAC_SPM_EXPORT
#define CEMFRAC_SPM_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a signature below changes; the loader refuses a shim built for another version.
#define CEMFRAC_SPM_ABI_VERSION 1

typedef struct CemfracSpm CemfracSpm;  // a loaded model (a SentencePieceProcessor)

CEMFRAC_SPM_EXPORT int cemfrac_spm_abi_version(void);
CEMFRAC_SPM_EXPORT void cemfrac_spm_free(void* buffer);
// SentencePiece's minimum log level, process-wide: 0 info, 1 warning, 2 error, 3 fatal, 4 nothing.
// Its messages go to std::cerr.
CEMFRAC_SPM_EXPORT void cemfrac_spm_set_log_level(int level);

// Trains a model and returns its serialized ModelProto in *model / *model_size.
// Sentences: `count` byte strings (texts[i], lengths[i]); with count == 0 the trainer reads the
// file(s) named by the "input" option instead. Options are SentencePiece trainer/normalizer flags
// given as name/value pairs without leading dashes ("vocab_size" = "4096"); "model_prefix" is not
// needed. `seed` seeds SentencePiece's random generator (sentence sampling, shuffling).
CEMFRAC_SPM_EXPORT int cemfrac_spm_train(const char* const* texts, const size_t* lengths,
                                         size_t count, const char* const* option_names,
                                         const char* const* option_values, size_t option_count,
                                         uint32_t seed, char** model, size_t* model_size,
                                         char** error);

// Loads a serialized ModelProto (the bytes of a .model file).
CEMFRAC_SPM_EXPORT int cemfrac_spm_load(const char* model, size_t model_size, CemfracSpm** out,
                                        char** error);
CEMFRAC_SPM_EXPORT void cemfrac_spm_destroy(CemfracSpm* spm);

// Text (any bytes; SentencePiece expects UTF-8) to ids; *ids is malloc'd (null when there are
// none).
CEMFRAC_SPM_EXPORT int cemfrac_spm_encode(const CemfracSpm* spm, const char* text, size_t size,
                                          int32_t** ids, size_t* count, char** error);
// Ids to text; *text is malloc'd and NUL-terminated, *size excludes the NUL.
CEMFRAC_SPM_EXPORT int cemfrac_spm_decode(const CemfracSpm* spm, const int32_t* ids, size_t count,
                                          char** text, size_t* size, char** error);

CEMFRAC_SPM_EXPORT int32_t cemfrac_spm_vocab_size(const CemfracSpm* spm);
// -1 when the piece is not in the vocabulary.
CEMFRAC_SPM_EXPORT int32_t cemfrac_spm_piece_to_id(const CemfracSpm* spm, const char* piece,
                                                   size_t size);
// The piece's bytes, owned by the model (valid until cemfrac_spm_destroy). Non-zero for a bad id.
CEMFRAC_SPM_EXPORT int cemfrac_spm_id_to_piece(const CemfracSpm* spm, int32_t id,
                                               const char** piece, size_t* size);

enum {
  CEMFRAC_SPM_UNK = 0,
  CEMFRAC_SPM_BOS = 1,
  CEMFRAC_SPM_EOS = 2,
  CEMFRAC_SPM_PAD = 3,
};
// The id of unk/bos/eos/pad (one of the constants above); -1 when the model has none.
CEMFRAC_SPM_EXPORT int32_t cemfrac_spm_special_id(const CemfracSpm* spm, int which);

enum {
  CEMFRAC_SPM_PIECE_NORMAL = 0,
  CEMFRAC_SPM_PIECE_UNKNOWN = 1,
  CEMFRAC_SPM_PIECE_CONTROL = 2,
  CEMFRAC_SPM_PIECE_BYTE = 3,
  CEMFRAC_SPM_PIECE_UNUSED = 4,
  CEMFRAC_SPM_PIECE_INVALID = -1,  // id out of range
};
CEMFRAC_SPM_EXPORT int cemfrac_spm_piece_kind(const CemfracSpm* spm, int32_t id);

// The loaded model as serialized ModelProto bytes (what a .model file holds).
CEMFRAC_SPM_EXPORT int cemfrac_spm_serialize(const CemfracSpm* spm, char** model,
                                             size_t* model_size, char** error);

#ifdef __cplusplus
}  // extern "C"
#endif

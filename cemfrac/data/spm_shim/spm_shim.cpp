// The SentencePiece shim module: implements spm_shim.h on top of libsentencepiece(_train). Built as
// a MODULE library and never linked into a binary that links LibTorch (see spm_shim.h for why). No
// exception leaves this file: every entry point converts failures into an error message.
#include "cemfrac/data/spm_shim/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace sentencepiece::logging {
// Exported by libsentencepiece.so but not declared in its public headers.
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

struct CemfracSpm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

// Copies `s` into a malloc'd buffer with a trailing NUL (so text can also be used as a C string).
char* copy_out(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

int report(char** error, const std::string& message) {
  if (error != nullptr) *error = copy_out(message);
  return 1;
}

// Runs `body`, turning any exception into an error return.
template <typename Body>
int guarded(char** error, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return report(error, std::string("sentencepiece: ") + e.what());
  } catch (...) {
    return report(error, "sentencepiece: unknown exception");
  }
}

// Feeds caller-owned byte strings to the trainer without copying them up front.
class ArrayIterator : public sentencepiece::SentenceIterator {
 public:
  ArrayIterator(const char* const* texts, const size_t* lengths, size_t count)
      : texts_(texts), lengths_(lengths), count_(count) {
    load();
  }
  bool done() const override { return index_ >= count_; }
  void Next() override {
    ++index_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (index_ < count_) value_.assign(texts_[index_], lengths_[index_]);
  }
  const char* const* texts_;
  const size_t* lengths_;
  size_t count_;
  size_t index_ = 0;
  std::string value_;
};

// SentencePiece's random seed is process-wide; training is serialised.
std::mutex& train_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

extern "C" {

int cemfrac_spm_abi_version(void) {
  return CEMFRAC_SPM_ABI_VERSION;
}

void cemfrac_spm_free(void* buffer) {
  std::free(buffer);
}

void cemfrac_spm_set_log_level(int level) {
  sentencepiece::logging::SetMinLogLevel(level);
}

int cemfrac_spm_train(const char* const* texts, const size_t* lengths, size_t count,
                      const char* const* option_names, const char* const* option_values,
                      size_t option_count, uint32_t seed, char** model, size_t* model_size,
                      char** error) {
  return guarded(error, [&]() -> int {
    std::unordered_map<std::string, std::string> kwargs;
    for (size_t i = 0; i < option_count; ++i) kwargs[option_names[i]] = option_values[i];
    std::lock_guard<std::mutex> lock(train_mutex());
    sentencepiece::SetRandomGeneratorSeed(seed);
    std::string serialized;
    std::unique_ptr<ArrayIterator> iterator;
    if (count > 0) iterator = std::make_unique<ArrayIterator>(texts, lengths, count);
    const auto status =
        sentencepiece::SentencePieceTrainer::Train(kwargs, iterator.get(), &serialized);
    if (!status.ok()) return report(error, "sentencepiece training failed: " + status.ToString());
    *model = copy_out(serialized);
    *model_size = serialized.size();
    return *model == nullptr ? report(error, "out of memory") : 0;
  });
}

int cemfrac_spm_load(const char* model, size_t model_size, CemfracSpm** out, char** error) {
  return guarded(error, [&]() -> int {
    auto spm = std::make_unique<CemfracSpm>();
    const auto status = spm->processor.LoadFromSerializedProto(std::string_view(model, model_size));
    if (!status.ok()) return report(error, "cannot load sentencepiece model: " + status.ToString());
    *out = spm.release();
    return 0;
  });
}

void cemfrac_spm_destroy(CemfracSpm* spm) {
  delete spm;
}

int cemfrac_spm_encode(const CemfracSpm* spm, const char* text, size_t size, int32_t** ids,
                       size_t* count, char** error) {
  return guarded(error, [&]() -> int {
    std::vector<int> out;
    const auto status = spm->processor.Encode(std::string_view(text, size), &out);
    if (!status.ok()) return report(error, "sentencepiece encode failed: " + status.ToString());
    *count = out.size();
    *ids = nullptr;
    if (out.empty()) return 0;
    *ids = static_cast<int32_t*>(std::malloc(out.size() * sizeof(int32_t)));
    if (*ids == nullptr) return report(error, "out of memory");
    for (size_t i = 0; i < out.size(); ++i) (*ids)[i] = out[i];
    return 0;
  });
}

int cemfrac_spm_decode(const CemfracSpm* spm, const int32_t* ids, size_t count, char** text,
                       size_t* size, char** error) {
  return guarded(error, [&]() -> int {
    const int n = spm->processor.GetPieceSize();
    std::vector<int> in(ids, ids + count);
    for (int id : in)
      if (id < 0 || id >= n)
        return report(error, "sentencepiece decode: id " + std::to_string(id) +
                                 " is outside the vocabulary [0, " + std::to_string(n) + ")");
    std::string out;
    const auto status = spm->processor.Decode(in, &out);
    if (!status.ok()) return report(error, "sentencepiece decode failed: " + status.ToString());
    *text = copy_out(out);
    *size = out.size();
    return *text == nullptr ? report(error, "out of memory") : 0;
  });
}

int32_t cemfrac_spm_vocab_size(const CemfracSpm* spm) {
  return spm->processor.GetPieceSize();
}

int32_t cemfrac_spm_piece_to_id(const CemfracSpm* spm, const char* piece, size_t size) {
  try {
    const std::string_view p(piece, size);
    const int id = spm->processor.PieceToId(p);
    // PieceToId answers unk_id for unknown pieces; tell that apart from the real unk piece.
    if (id == spm->processor.unk_id() && spm->processor.IdToPiece(id) != p) return -1;
    return id;
  } catch (...) {
    return -1;
  }
}

int cemfrac_spm_id_to_piece(const CemfracSpm* spm, int32_t id, const char** piece, size_t* size) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return 1;
  const std::string& p = spm->processor.IdToPiece(id);
  *piece = p.data();
  *size = p.size();
  return 0;
}

int32_t cemfrac_spm_special_id(const CemfracSpm* spm, int which) {
  switch (which) {
    case CEMFRAC_SPM_UNK: return spm->processor.unk_id();
    case CEMFRAC_SPM_BOS: return spm->processor.bos_id();
    case CEMFRAC_SPM_EOS: return spm->processor.eos_id();
    case CEMFRAC_SPM_PAD: return spm->processor.pad_id();
    default: return -1;
  }
}

int cemfrac_spm_piece_kind(const CemfracSpm* spm, int32_t id) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return CEMFRAC_SPM_PIECE_INVALID;
  if (spm->processor.IsUnknown(id)) return CEMFRAC_SPM_PIECE_UNKNOWN;
  if (spm->processor.IsControl(id)) return CEMFRAC_SPM_PIECE_CONTROL;
  if (spm->processor.IsByte(id)) return CEMFRAC_SPM_PIECE_BYTE;
  if (spm->processor.IsUnused(id)) return CEMFRAC_SPM_PIECE_UNUSED;
  return CEMFRAC_SPM_PIECE_NORMAL;
}

int cemfrac_spm_serialize(const CemfracSpm* spm, char** model, size_t* model_size, char** error) {
  return guarded(error, [&]() -> int {
    const std::string bytes = spm->processor.serialized_model_proto();
    if (bytes.empty()) return report(error, "sentencepiece: no model loaded");
    *model = copy_out(bytes);
    *model_size = bytes.size();
    return *model == nullptr ? report(error, "out of memory") : 0;
  });
}

}  // extern "C"

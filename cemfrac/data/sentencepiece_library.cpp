// Loader of the SentencePiece shim module and the C++ wrapper around its C interface. Kept free of
// torch headers (this file skips the precompiled header; CEMFRAC_SPM_SHIM_PATH is defined for it
// alone in cemfrac/data/spm_shim/CMakeLists.txt).
#include "cemfrac/data/sentencepiece_library.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>

#include "cemfrac/core/check.h"
#include "cemfrac/data/spm_shim/spm_shim.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

constexpr const char* kShimFile = "libcemfrac_spm.so";

// The shim's entry points, resolved once.
struct ShimApi {
  std::string path;
  std::string mode;  // "namespace" or "deepbind"
  decltype(&cemfrac_spm_free) free = nullptr;
  decltype(&cemfrac_spm_train) train = nullptr;
  decltype(&cemfrac_spm_load) load = nullptr;
  decltype(&cemfrac_spm_destroy) destroy = nullptr;
  decltype(&cemfrac_spm_encode) encode = nullptr;
  decltype(&cemfrac_spm_decode) decode = nullptr;
  decltype(&cemfrac_spm_vocab_size) vocab_size = nullptr;
  decltype(&cemfrac_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&cemfrac_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&cemfrac_spm_special_id) special_id = nullptr;
  decltype(&cemfrac_spm_piece_kind) piece_kind = nullptr;
  decltype(&cemfrac_spm_serialize) serialize = nullptr;
};

std::string executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// The candidate paths in search order, and whether the first one is mandatory ($CEMFRAC_SPM_SHIM).
std::vector<std::string> candidate_paths(bool& from_env) {
  from_env = false;
  if (const char* env = std::getenv("CEMFRAC_SPM_SHIM"); env && *env) {
    from_env = true;
    return {env};
  }
  std::vector<std::string> paths;
#ifdef CEMFRAC_SPM_SHIM_PATH
  paths.push_back(CEMFRAC_SPM_SHIM_PATH);
#endif
  const std::string dir = executable_dir();
  if (!dir.empty()) {
    paths.push_back(dir + "/" + kShimFile);
    paths.push_back(dir + "/../lib/" + kShimFile);
  }
  return paths;
}

template <typename Fn>
void resolve(void* handle, const std::string& path, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  CEMFRAC_CHECK(fn != nullptr, "SentencePiece shim {} lacks {}: rebuild the cemfrac_spm target",
                path, name);
}

// How the module is loaded. kNamespace: dlmopen(LM_ID_NEWLM) gives the shim, libsentencepiece and
// their own copies of libstdc++ and libc a link-map namespace of their own, so nothing in them can
// bind to LibTorch's libprotobuf or to this program's copies of libstdc++'s data. kDeepBind: dlopen
// with RTLD_LOCAL | RTLD_DEEPBIND in the main namespace; protobuf is kept apart too, but
// libsentencepiece then binds std::cerr to libstdc++'s own, never-constructed instance (programs
// hold a copy-relocated one), so any message SentencePiece writes would crash: its logging is
// switched off in that mode.
ShimApi load_shim() {
  bool from_env = false;
  const std::vector<std::string> paths = candidate_paths(from_env);
  std::string path;
  for (const auto& p : paths) {
    if (fs::exists(p)) {
      path = p;
      break;
    }
  }
  if (path.empty()) {
    if (from_env)
      fail("CEMFRAC_SPM_SHIM={} does not exist: point it at libcemfrac_spm.so or unset it",
           paths[0]);
    std::string looked;
    for (const auto& p : paths) looked += (looked.empty() ? "" : ", ") + p;
    fail(
        "SentencePiece shim {} not found (looked in: {}): build the cemfrac_spm target or set "
        "CEMFRAC_SPM_SHIM to its path",
        kShimFile, looked);
  }
  const char* mode_env = std::getenv("CEMFRAC_SPM_LOAD");
  const std::string mode = mode_env && *mode_env ? mode_env : "auto";
  CEMFRAC_CHECK(mode == "auto" || mode == "namespace" || mode == "deepbind",
                "CEMFRAC_SPM_LOAD={} is not one of auto, namespace, deepbind", mode);
  ShimApi api;
  api.path = path;
  void* handle = nullptr;
  std::string why;
  if (mode != "deepbind") {
    ::dlerror();
    handle = ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    api.mode = "namespace";
    if (handle == nullptr) {
      const char* e = ::dlerror();
      why = e ? e : "unknown dlmopen error";
      if (mode == "namespace") fail("cannot load the SentencePiece shim {}: {}", path, why);
    }
  }
  if (handle == nullptr) {
    ::dlerror();
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    api.mode = "deepbind";
    if (handle == nullptr) {
      const char* e = ::dlerror();
      fail("cannot load the SentencePiece shim {}: {}{}", path, e ? e : "unknown dlopen error",
           why.empty() ? "" : " (dlmopen failed first: " + why + ")");
    }
  }
  decltype(&cemfrac_spm_abi_version) abi_version = nullptr;
  resolve(handle, path, "cemfrac_spm_abi_version", abi_version);
  CEMFRAC_CHECK(
      abi_version() == CEMFRAC_SPM_ABI_VERSION,
      "SentencePiece shim {} has interface version {}, this program needs {}: rebuild the "
      "cemfrac_spm target",
      path, abi_version(), CEMFRAC_SPM_ABI_VERSION);
  decltype(&cemfrac_spm_set_log_level) set_log_level = nullptr;
  resolve(handle, path, "cemfrac_spm_set_log_level", set_log_level);
  resolve(handle, path, "cemfrac_spm_free", api.free);
  resolve(handle, path, "cemfrac_spm_train", api.train);
  resolve(handle, path, "cemfrac_spm_load", api.load);
  resolve(handle, path, "cemfrac_spm_destroy", api.destroy);
  resolve(handle, path, "cemfrac_spm_encode", api.encode);
  resolve(handle, path, "cemfrac_spm_decode", api.decode);
  resolve(handle, path, "cemfrac_spm_vocab_size", api.vocab_size);
  resolve(handle, path, "cemfrac_spm_piece_to_id", api.piece_to_id);
  resolve(handle, path, "cemfrac_spm_id_to_piece", api.id_to_piece);
  resolve(handle, path, "cemfrac_spm_special_id", api.special_id);
  resolve(handle, path, "cemfrac_spm_piece_kind", api.piece_kind);
  resolve(handle, path, "cemfrac_spm_serialize", api.serialize);
  // Warnings and errors only (info while training is hundreds of lines) unless CEMFRAC_SPM_VERBOSE;
  // nothing at all with DEEPBIND (see above).
  const char* verbose = std::getenv("CEMFRAC_SPM_VERBOSE");
  const bool chatty = verbose && *verbose && std::string(verbose) != "0";
  set_log_level(api.mode == "deepbind" ? 4 : chatty ? 0 : 1);
  // The handle is never closed: models may live until exit, and libsentencepiece is not built to be
  // unloaded.
  return api;
}

// Loads the shim on first use. A failed load is retried on the next call (and fails the same way).
const ShimApi& shim() {
  static std::atomic<const ShimApi*> loaded{nullptr};
  if (const ShimApi* api = loaded.load(std::memory_order_acquire)) return *api;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (const ShimApi* api = loaded.load(std::memory_order_relaxed)) return *api;
  const ShimApi* api = new ShimApi(load_shim());  // lives until exit, like the module
  loaded.store(api, std::memory_order_release);
  return *api;
}

// Takes ownership of a message the shim malloc'd and returns it as a string.
std::string take_error(char* error) {
  std::string message = error ? error : "unknown SentencePiece error";
  if (error) shim().free(error);
  const size_t newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  return message;
}

// Owns one malloc'd buffer returned by the shim.
template <typename T>
struct ShimBuffer {
  T* data = nullptr;
  ~ShimBuffer() {
    if (data) shim().free(data);
  }
};

}  // namespace

std::string sentencepiece_shim_path() {
  return shim().path;
}

std::string sentencepiece_shim_mode() {
  return shim().mode;
}

std::string train_sentencepiece_model(const std::vector<std::string_view>& sentences,
                                      const std::vector<std::pair<std::string, std::string>>& flags,
                                      uint32_t seed) {
  const ShimApi& api = shim();
  std::vector<const char*> texts;
  std::vector<size_t> lengths;
  texts.reserve(sentences.size());
  lengths.reserve(sentences.size());
  for (const auto& s : sentences) {
    texts.push_back(s.data());
    lengths.push_back(s.size());
  }
  std::vector<const char*> names, values;
  for (const auto& [name, value] : flags) {
    names.push_back(name.c_str());
    values.push_back(value.c_str());
  }
  ShimBuffer<char> model;
  size_t model_size = 0;
  char* error = nullptr;
  if (api.train(texts.data(), lengths.data(), texts.size(), names.data(), values.data(),
                names.size(), seed, &model.data, &model_size, &error) != 0)
    fail("{}", take_error(error));
  return std::string(model.data, model_size);
}

SentencePieceModel::SentencePieceModel(std::string_view serialized, const std::string& what) {
  char* error = nullptr;
  if (shim().load(serialized.data(), serialized.size(), &handle_, &error) != 0)
    fail("{}: {} (is it a SentencePiece .model file?)", what, take_error(error));
}

SentencePieceModel::~SentencePieceModel() {
  if (handle_) shim().destroy(handle_);
}

SentencePieceModel::SentencePieceModel(SentencePieceModel&& other) noexcept
    : handle_(other.handle_) {
  other.handle_ = nullptr;
}

SentencePieceModel& SentencePieceModel::operator=(SentencePieceModel&& other) noexcept {
  if (this != &other) {
    if (handle_) shim().destroy(handle_);
    handle_ = other.handle_;
    other.handle_ = nullptr;
  }
  return *this;
}

void SentencePieceModel::encode(std::string_view text, std::vector<TokenId>& out) const {
  ShimBuffer<int32_t> ids;
  size_t count = 0;
  char* error = nullptr;
  if (shim().encode(handle_, text.data(), text.size(), &ids.data, &count, &error) != 0)
    fail("{}", take_error(error));
  out.insert(out.end(), ids.data, ids.data + count);
}

std::string SentencePieceModel::decode(const TokenId* ids, size_t count) const {
  ShimBuffer<char> text;
  size_t size = 0;
  char* error = nullptr;
  if (shim().decode(handle_, ids, count, &text.data, &size, &error) != 0)
    fail("{}", take_error(error));
  return std::string(text.data, size);
}

int32_t SentencePieceModel::vocab_size() const {
  return shim().vocab_size(handle_);
}

int32_t SentencePieceModel::piece_to_id(std::string_view piece) const {
  return shim().piece_to_id(handle_, piece.data(), piece.size());
}

std::string SentencePieceModel::id_to_piece(TokenId id) const {
  const char* piece = nullptr;
  size_t size = 0;
  CEMFRAC_CHECK(shim().id_to_piece(handle_, id, &piece, &size) == 0,
                "sentencepiece: id {} is outside the vocabulary [0, {})", id, vocab_size());
  return std::string(piece, size);
}

SentencePieceModel::PieceKind SentencePieceModel::piece_kind(TokenId id) const {
  switch (shim().piece_kind(handle_, id)) {
    case CEMFRAC_SPM_PIECE_NORMAL: return PieceKind::kNormal;
    case CEMFRAC_SPM_PIECE_UNKNOWN: return PieceKind::kUnknown;
    case CEMFRAC_SPM_PIECE_CONTROL: return PieceKind::kControl;
    case CEMFRAC_SPM_PIECE_BYTE: return PieceKind::kByte;
    case CEMFRAC_SPM_PIECE_UNUSED: return PieceKind::kUnused;
    default: fail("sentencepiece: id {} is outside the vocabulary [0, {})", id, vocab_size());
  }
}

int32_t SentencePieceModel::unk_id() const {
  return shim().special_id(handle_, CEMFRAC_SPM_UNK);
}
int32_t SentencePieceModel::bos_id() const {
  return shim().special_id(handle_, CEMFRAC_SPM_BOS);
}
int32_t SentencePieceModel::eos_id() const {
  return shim().special_id(handle_, CEMFRAC_SPM_EOS);
}
int32_t SentencePieceModel::pad_id() const {
  return shim().special_id(handle_, CEMFRAC_SPM_PAD);
}

std::string SentencePieceModel::serialize() const {
  ShimBuffer<char> model;
  size_t size = 0;
  char* error = nullptr;
  if (shim().serialize(handle_, &model.data, &size, &error) != 0) fail("{}", take_error(error));
  return std::string(model.data, size);
}

}  // namespace cemfrac

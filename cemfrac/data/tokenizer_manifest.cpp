#include "cemfrac/data/tokenizer_manifest.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"

namespace cemfrac {
namespace fs = std::filesystem;

void write_tokenizer_manifest(const std::string& dir, const TokenizerManifest& manifest) {
  nlohmann::ordered_json j;
  j["format"] = kTokenizerFormat;
  j["format_version"] = kTokenizerFormatVersion;
  j["kind"] = manifest.kind;
  j["id"] = manifest.id;
  j["vocab_size"] = manifest.vocab_size;
  j["eot_id"] = manifest.eot_id;
  j["files"] = nlohmann::ordered_json::object();
  for (const auto& [role, name] : manifest.files) j["files"][role] = name;
  write_file_atomic((fs::path(dir) / kTokenizerManifest).string(), j.dump(2) + "\n");
}

namespace {

// The value of `key` in `j` as T, or a one-line error naming the file and the field.
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  CEMFRAC_CHECK(it != j.end(), "{}: field \"{}\" is missing: re-save the tokenizer", path, key);
  if constexpr (std::is_same_v<T, std::string>) {
    CEMFRAC_CHECK(it->is_string(), "{}: field \"{}\" must be a string, not {}", path, key,
                  it->dump());
  } else {
    CEMFRAC_CHECK(it->is_number_integer(), "{}: field \"{}\" must be an integer, not {}", path, key,
                  it->dump());
  }
  return it->get<T>();
}

}  // namespace

TokenizerManifest read_tokenizer_manifest(const std::string& dir) {
  std::error_code ec;
  CEMFRAC_CHECK(fs::exists(dir, ec),
                "tokenizer directory {} does not exist: pass a directory written by a tokenizer's "
                "save (e.g. data/brown/tokenizer from cemfrac prepare)",
                dir);
  CEMFRAC_CHECK(fs::is_directory(dir, ec),
                "{} is not a directory: a saved tokenizer is a directory holding tokenizer.json",
                dir);
  const std::string path = (fs::path(dir) / kTokenizerManifest).string();
  CEMFRAC_CHECK(fs::exists(path, ec),
                "{} has no {}: it does not hold a saved tokenizer (save one there, e.g. with "
                "cemfrac prepare)",
                dir, kTokenizerManifest);
  const std::string text = read_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON (parse error at byte {}): re-save the tokenizer", path, e.byte);
  }
  CEMFRAC_CHECK(j.is_object(), "{} must hold a JSON object, not {}: re-save the tokenizer", path,
                j.type_name());
  const auto format = field<std::string>(j, "format", path);
  CEMFRAC_CHECK(format == kTokenizerFormat, "{}: format is \"{}\", expected \"{}\"", path, format,
                kTokenizerFormat);
  const auto version = field<int64_t>(j, "format_version", path);
  CEMFRAC_CHECK(version == kTokenizerFormatVersion,
                "{}: format_version {} is not supported (this cemfrac reads version {}): use the "
                "cemfrac that wrote it or re-save the tokenizer",
                path, version, kTokenizerFormatVersion);
  TokenizerManifest m;
  m.kind = field<std::string>(j, "kind", path);
  m.id = field<std::string>(j, "id", path);
  m.vocab_size = field<int64_t>(j, "vocab_size", path);
  const auto eot = field<int64_t>(j, "eot_id", path);
  CEMFRAC_CHECK(m.vocab_size > 0 && eot >= 0 && eot < m.vocab_size,
                "{}: eot_id {} is outside the vocabulary [0, {})", path, eot, m.vocab_size);
  m.eot_id = static_cast<TokenId>(eot);
  if (const auto files = j.find("files"); files != j.end()) {
    CEMFRAC_CHECK(files->is_object(), "{}: field \"files\" must be an object, not {}", path,
                  files->dump());
    for (const auto& [role, name] : files->items()) {
      CEMFRAC_CHECK(name.is_string(), "{}: files.{} must be a file name, not {}", path, role,
                    name.dump());
      const std::string file = name.get<std::string>();
      CEMFRAC_CHECK(
          !file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
          "{}: files.{} = \"{}\" must be a plain file name inside the directory", path, role, file);
      m.files[role] = file;
    }
  }
  return m;
}

std::string tokenizer_file(const std::string& dir, const TokenizerManifest& manifest,
                           const std::string& role) {
  const auto it = manifest.files.find(role);
  CEMFRAC_CHECK(it != manifest.files.end(),
                "{}/{}: the {} tokenizer needs files.{}, which is missing: re-save the tokenizer",
                dir, kTokenizerManifest, manifest.kind, role);
  const std::string path = (fs::path(dir) / it->second).string();
  std::error_code ec;
  CEMFRAC_CHECK(fs::is_regular_file(path, ec),
                "{} is missing (the {} tokenizer's {} file, listed in {}): the tokenizer directory "
                "is incomplete, re-save the tokenizer",
                path, manifest.kind, role, kTokenizerManifest);
  return path;
}

}  // namespace cemfrac

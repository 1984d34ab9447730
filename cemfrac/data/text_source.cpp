#include "cemfrac/data/text_source.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

Document read_one(const fs::path& file, std::string name) {
  std::string text = read_file(file.string());
  if (text.compare(0, kUtf8Bom.size(), kUtf8Bom) == 0) text.erase(0, kUtf8Bom.size());
  CEMFRAC_CHECK(!text.empty(), "{} is empty: add text to it or remove it from the input",
                file.string());
  if (const auto bad = find_invalid_utf8(text)) {
    fail(
        "{} is not valid UTF-8 (first invalid byte 0x{:02x} at byte offset {}): convert it to "
        "UTF-8, e.g. iconv -f latin1 -t utf-8",
        file.string(), static_cast<unsigned char>(text[*bad]), *bad);
  }
  return Document{std::move(name), std::move(text)};
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if ((c & 0xE0) == 0xC0) {
      length = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return i;  // a continuation byte without a lead, or 0xF8..0xFF
    }
    if (i + length > n) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += length;
  }
  return std::nullopt;
}

void check_text_source(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(fs::status(path, ec))) return;
  CEMFRAC_CHECK(fs::exists(fs::symlink_status(path, ec)),
                "--text {} does not exist: pass a UTF-8 file or a directory of "
                "*.txt files",
                path);
  const std::string problem = input_file_problem(path);
  CEMFRAC_CHECK(problem.empty(), "--text {}: {}; pass a UTF-8 file or a directory of *.txt files",
                path, problem);
}

std::vector<Document> read_text_source(const std::string& path) {
  check_text_source(path);
  std::error_code ec;
  if (!fs::is_directory(fs::status(path, ec))) {
    return {read_one(fs::path(path), fs::path(path).filename().string())};
  }
  std::vector<std::pair<std::string, fs::path>> files;  // (relative name, path)
  // Nothing is skipped silently: an unreadable subdirectory fails the listing, and a *.txt entry
  // that is not a readable regular file (a dangling link, a FIFO, a link loop) is named.
  fs::recursive_directory_iterator it(path, ec);
  CEMFRAC_CHECK(!ec, "cannot list directory {}: {}", path, ec.message());
  std::string last = path;  // the entry the listing stood at, for an error in the next step
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    CEMFRAC_CHECK(!ec, "cannot list directory {} (after {}): {}", path, last, ec.message());
    const fs::directory_entry& entry = *it;
    last = entry.path().string();
    if (entry.path().extension() != ".txt") continue;
    if (fs::is_directory(entry.path(), ec)) continue;  // a directory named *.txt: listed in turn
    const std::string problem = input_file_problem(entry.path().string());
    CEMFRAC_CHECK(problem.empty(),
                  "--text {}: {} {}; make it a readable UTF-8 file or remove it from the "
                  "directory",
                  path, entry.path().string(), problem);
    files.emplace_back(fs::relative(entry.path(), path).generic_string(), entry.path());
  }
  CEMFRAC_CHECK(!ec, "cannot list directory {} (after {}): {}", path, last, ec.message());
  CEMFRAC_CHECK(!files.empty(),
                "directory {} holds no .txt files: put one UTF-8 .txt file per "
                "document in it",
                path);
  std::sort(files.begin(), files.end());
  std::vector<Document> documents;
  documents.reserve(files.size());
  for (auto& [name, file] : files) documents.push_back(read_one(file, name));
  return documents;
}

}  // namespace cemfrac

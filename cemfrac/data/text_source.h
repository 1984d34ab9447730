// Documents for `cemfrac prepare`: a named piece of UTF-8 text. They come from a built-in corpus
// (data/brown.h) or from the user's files (read_text_source below).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cemfrac {

struct Document {
  std::string name;  // corpus file name ("ca01") or path relative to the --text root ("a/b.txt")
  std::string text;  // UTF-8
};

// Byte offset of the first invalid UTF-8 sequence in `text` (overlong forms, surrogates, code
// points above U+10FFFF and truncated sequences are invalid), or nullopt when `text` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// `path` is either one UTF-8 file (one document named after the file) or a directory whose *.txt
// files, searched recursively and sorted by relative path (byte order), are one document each. A
// leading UTF-8 byte-order mark is dropped; nothing else in the text is changed. Throws
// cemfrac::Error, naming the file, when the path does not exist, a file cannot be read, a file is
// empty, a file is not valid UTF-8 (with the byte offset), or a directory holds no .txt file.
// Nothing is skipped silently: a *.txt entry that is not a readable regular file (a dangling link,
// a FIFO, a link loop) and an unreadable subdirectory are errors too.
std::vector<Document> read_text_source(const std::string& path);

// The cheap part of read_text_source's checks, before any file is opened: `path` is a directory
// or a regular file (a FIFO would block a read; core/input_file.h).
void check_text_source(const std::string& path);

}  // namespace cemfrac

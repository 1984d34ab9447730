// Files and directories that appear complete or not at all: written under a temporary name in the
// same directory, flushed (fsync), then renamed over the destination. A killed run leaves at most a
// stray "*.tmp-*" entry, never a file that looks finished.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace cemfrac {

// Writes `content` to `path` atomically. Throws cemfrac::Error naming the path on failure.
void write_file_atomic(const std::string& path, std::string_view content);

// Calls write(tmp_path) to produce a file at a temporary path, fsyncs it and renames it to `path`.
// For writers that stream (token shards). The temporary is removed if write throws.
void write_file_atomic_with(const std::string& path,
                            const std::function<void(const std::string& tmp_path)>& write);

// Same for a directory: write(tmp_dir) fills a fresh temporary directory beside `dir`, which then
// replaces `dir` (an existing `dir` is renamed aside first and removed after the swap).
void write_dir_atomic(const std::string& dir,
                      const std::function<void(const std::string& tmp_dir)>& write);

// For a file another process writes (a child's captured stdout): a temporary name beside `path`,
// unique per process and call ("<path>.tmp-<pid>-<random>"), and, once the writer is done, the
// fsync and rename that make it `path`. Throws cemfrac::Error naming both paths when the rename
// fails.
std::string unique_temp_path(const std::string& path);
void commit_temp_file(const std::string& tmp_path, const std::string& path);

// Reads a whole file; throws cemfrac::Error naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace cemfrac

#include "cemfrac/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

std::string temp_name(const std::string& path) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}.tmp-{}-{:x}", path, getpid(), rng() & 0xffffffu);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;  // best effort for directories on filesystems that refuse it
  ::fsync(fd);
  ::close(fd);
}

std::string parent_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

void write_file_atomic_with(const std::string& path,
                            const std::function<void(const std::string&)>& write) {
  const std::string parent = parent_of(path);
  std::error_code ec;
  fs::create_directories(parent, ec);
  CEMFRAC_CHECK(fs::is_directory(parent), "cannot create directory {} for {}", parent, path);
  const std::string tmp = temp_name(path);
  try {
    write(tmp);
    fsync_path(tmp, false);
    CEMFRAC_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}", tmp, path,
                  std::strerror(errno));
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  fsync_path(parent, true);
}

std::string unique_temp_path(const std::string& path) {
  return temp_name(path);
}

void commit_temp_file(const std::string& tmp_path, const std::string& path) {
  fsync_path(tmp_path, false);
  CEMFRAC_CHECK(::rename(tmp_path.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}",
                tmp_path, path, std::strerror(errno));
  fsync_path(parent_of(path), true);
}

void write_file_atomic(const std::string& path, std::string_view content) {
  write_file_atomic_with(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    CEMFRAC_CHECK(out.good(), "cannot open {} for writing: {}", tmp, std::strerror(errno));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    CEMFRAC_CHECK(out.good(), "cannot write {} (disk full?)", tmp);
  });
}

void write_dir_atomic(const std::string& dir,
                      const std::function<void(const std::string&)>& write) {
  const std::string parent = parent_of(dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  CEMFRAC_CHECK(fs::is_directory(parent), "cannot create directory {}", parent);
  const std::string tmp = temp_name(dir);
  try {
    CEMFRAC_CHECK(fs::create_directory(tmp, ec), "cannot create directory {}: {}", tmp,
                  ec.message());
    write(tmp);
    for (const auto& entry : fs::directory_iterator(tmp))
      if (entry.is_regular_file()) fsync_path(entry.path().string(), false);
    fsync_path(tmp, true);
    std::string aside;
    if (fs::exists(dir)) {
      aside = temp_name(dir) + ".old";
      fs::rename(dir, aside, ec);
      CEMFRAC_CHECK(!ec, "cannot move the old {} aside: {}", dir, ec.message());
    }
    fs::rename(tmp, dir, ec);
    CEMFRAC_CHECK(!ec, "cannot rename {} to {}: {}", tmp, dir, ec.message());
    if (!aside.empty()) fs::remove_all(aside, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fsync_path(parent, true);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CEMFRAC_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace cemfrac

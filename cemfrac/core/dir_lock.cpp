#include "cemfrac/core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

std::string lock_path(const std::string& dir) {
  return (fs::path(dir) / kDirLockFile).string();
}

// "pid command\n" as acquire() writes it; a missing or garbled file gives pid 0.
DirLockHolder read_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  DirLockHolder h;
  if (n <= 0) return h;
  std::istringstream in(std::string(buf, static_cast<size_t>(n)));
  if (!(in >> h.pid) || h.pid < 0) return DirLockHolder{};
  in >> h.command;
  return h;
}

}  // namespace

DirLock DirLock::acquire(const std::string& dir, const std::string& command) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  CEMFRAC_CHECK(fs::is_directory(dir), "cannot create the directory {}{}", dir,
                ec ? ": " + ec.message() : "");
  const std::string path = lock_path(dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  CEMFRAC_CHECK(fd >= 0, "cannot open the lock file {}: {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const DirLockHolder h = read_holder(fd);
    ::close(fd);
    CEMFRAC_CHECK(err == EWOULDBLOCK, "cannot lock {}: {}", path, std::strerror(err));
    fail("{} is being written by another cemfrac process ({}{}); wait for it to finish or stop it",
         dir, h.pid > 0 ? fmt::format("pid {}", h.pid) : std::string("pid unknown"),
         h.command.empty() ? "" : ", " + h.command);
  }
  const std::string me = fmt::format("{} {}\n", static_cast<long>(::getpid()), command);
  // Best effort: the lock is the flock, the text only names the holder.
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd, me.data(), me.size(), 0);
  }
  DirLock lock;
  lock.fd_ = fd;
  lock.dir_ = dir;
  return lock;
}

DirLock::DirLock(DirLock&& other) noexcept : fd_(other.fd_), dir_(std::move(other.dir_)) {
  other.fd_ = -1;
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    dir_ = std::move(other.dir_);
    other.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  release();
}

void DirLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
  fd_ = -1;
}

std::optional<DirLockHolder> dir_lock_holder(const std::string& dir) {
  const std::string path = lock_path(dir);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  std::optional<DirLockHolder> holder;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) holder = read_holder(fd);
  ::close(fd);  // also drops the shared lock when it was taken
  return holder;
}

}  // namespace cemfrac

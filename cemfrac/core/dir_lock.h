// One writer per directory. A command that writes a run, suite or dataset directory holds an
// exclusive kernel lock (flock) on the file <dir>/.cemfrac.lock for as long as it writes. The kernel
// drops the lock when the process dies, however it dies, so a crash never leaves a stale lock; the
// file itself stays (it only names the last holder). The descriptor is close-on-exec: a child
// process never inherits its parent's lock.
//
//   DirLock lock = DirLock::acquire(run_dir, "train");   // throws when another process holds it
//   ... write into run_dir ...                              // released by ~DirLock (or at death)
//
// Readers take no lock; dir_lock_holder() tells them whether a writer is alive (better than a pid,
// which the system may have reused).
#pragma once
#include <optional>
#include <string>

namespace cemfrac {

// The lock file's name inside a locked directory (ignored where a directory must be "empty").
inline constexpr const char* kDirLockFile = ".cemfrac.lock";

struct DirLockHolder {
  long pid = 0;         // 0 when the file does not say
  std::string command;  // what the holder said it was doing ("train", "compare", ...)
};

class DirLock {
 public:
  DirLock() = default;
  // Locks `dir` (created, with its parents, when missing) for `command`, or throws cemfrac::Error
  // with one line: "<dir> is being written by another cemfrac process (pid N, <command>); wait for
  // it to finish or stop it". Never blocks.
  static DirLock acquire(const std::string& dir, const std::string& command);

  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();

  bool held() const { return fd_ >= 0; }
  const std::string& dir() const { return dir_; }
  void release();

 private:
  int fd_ = -1;
  std::string dir_;
};

// Who holds the lock on `dir` right now; nullopt when nobody does (or `dir` has no lock file).
std::optional<DirLockHolder> dir_lock_holder(const std::string& dir);

}  // namespace cemfrac

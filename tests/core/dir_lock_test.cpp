// One writer per directory (core/dir_lock.h): a second writer is refused naming the holder, a dead
// holder's lock is gone, and a child process never inherits its parent's lock.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "tests/test_util.h"

extern char** environ;

namespace cemfrac {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DirLock, SecondWriterIsRefusedNamingTheHolder) {
  const std::string dir = test::temp_dir("dir_lock_second") + "/run";  // created by acquire
  DirLock first = DirLock::acquire(dir, "train");
  ASSERT_TRUE(first.held());
  // flock conflicts between two open file descriptions, also within one process.
  const std::string msg = error_of([&] { DirLock::acquire(dir, "gp"); });
  EXPECT_NE(msg.find(dir + " is being written by another cemfrac process (pid " +
                     std::to_string(::getpid()) + ", train)"),
            std::string::npos)
      << msg;
  const auto holder = dir_lock_holder(dir);
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->pid, ::getpid());
  EXPECT_EQ(holder->command, "train");
  first.release();
  EXPECT_FALSE(dir_lock_holder(dir).has_value());
  DirLock again = DirLock::acquire(dir, "gp");
  EXPECT_TRUE(again.held());
}

TEST(DirLock, MovedLockIsHeldOnce) {
  const std::string dir = test::temp_dir("dir_lock_move");
  DirLock a = DirLock::acquire(dir, "compare");
  DirLock b = std::move(a);
  EXPECT_FALSE(a.held());
  EXPECT_TRUE(b.held());
  EXPECT_TRUE(dir_lock_holder(dir).has_value());
  b = DirLock();
  EXPECT_FALSE(dir_lock_holder(dir).has_value());
}

TEST(DirLock, DeadHolderLeavesNoLock) {
  const std::string dir = test::temp_dir("dir_lock_dead");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DirLock lock = DirLock::acquire(dir, "train");
    char c = 'x';
    (void)!::write(ready[1], &c, 1);
    ::pause();  // killed below, the lock never released by the program
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const auto holder = dir_lock_holder(dir);
  ASSERT_TRUE(holder.has_value());
  EXPECT_EQ(holder->pid, child);
  EXPECT_NE(error_of([&] { DirLock::acquire(dir, "train"); }), "");
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_FALSE(dir_lock_holder(dir).has_value());
  EXPECT_TRUE(DirLock::acquire(dir, "train").held());
}

TEST(DirLock, ChildProcessDoesNotInheritTheLock) {
  const std::string dir = test::temp_dir("dir_lock_exec");
  DirLock lock = DirLock::acquire(dir, "compare");
  pid_t child = 0;
  char sleep_arg[] = "5";
  char sleep_cmd[] = "/bin/sleep";
  char* argv[] = {sleep_cmd, sleep_arg, nullptr};
  ASSERT_EQ(::posix_spawn(&child, "/bin/sleep", nullptr, nullptr, argv, environ), 0);
  lock.release();
  // The child still runs; had it inherited the descriptor, the lock would still be held.
  EXPECT_FALSE(dir_lock_holder(dir).has_value());
  EXPECT_TRUE(DirLock::acquire(dir, "compare").held());
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
}

TEST(DirLock, NoLockFileMeansNoHolder) {
  EXPECT_FALSE(dir_lock_holder(test::temp_dir("dir_lock_none")).has_value());
}

}  // namespace
}  // namespace cemfrac

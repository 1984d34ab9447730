// Temporary names for files another process writes (core/atomic_file.h): unique per process and
// per call, so two writers never share one, and committed by a rename.
#include "cemfrac/core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cemfrac/core/check.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

TEST(AtomicFile, TempPathsAreUniquePerProcessAndCall) {
  const std::string dir = test::temp_dir("atomic-temp");
  const std::string path = dir + "/eval-test.json";
  const std::string a = unique_temp_path(path), b = unique_temp_path(path);
  EXPECT_NE(a, b);
  const std::string mine = path + ".tmp-" + std::to_string(::getpid()) + "-";
  EXPECT_EQ(a.rfind(mine, 0), 0u) << a;  // another process's names differ in the pid
  test::write_file(a, "{}\n");
  commit_temp_file(a, path);
  EXPECT_EQ(test::read_file(path), "{}\n");
  EXPECT_FALSE(std::filesystem::exists(a));
  EXPECT_THROW(commit_temp_file(b, path), Error);  // b was never written
}

}  // namespace
}  // namespace cemfrac

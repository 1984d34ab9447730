#include "cemfrac/core/input_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "cemfrac/core/check.h"

namespace cemfrac {

std::string input_file_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    struct stat link {};
    if (err == ELOOP) return "is a symbolic link loop";
    if (err == ENOENT && ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      std::vector<char> target(static_cast<size_t>(link.st_size > 0 ? link.st_size : 255) + 1, 0);
      const ssize_t n = ::readlink(path.c_str(), target.data(), target.size() - 1);
      return n > 0 ? fmt::format("is a dangling symbolic link (to {})",
                                 std::string(target.data(), static_cast<size_t>(n)))
                   : std::string("is a dangling symbolic link");
    }
    if (err == ENOENT) return "no such file";
    return std::strerror(err);
  }
  if (S_ISREG(st.st_mode)) return ::access(path.c_str(), R_OK) == 0 ? "" : "permission denied";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(st.st_mode)) return "is a socket, not a regular file";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "is a device, not a regular file";
  return "is not a regular file";
}

void check_input_file(const std::string& path, const std::string& what, const std::string& advice) {
  const std::string problem = input_file_problem(path);
  if (problem.empty()) return;
  fail("{}{}: {}{}", what.empty() ? "" : what + " ", path, problem,
       advice.empty() ? "" : "; " + advice);
}

}  // namespace cemfrac

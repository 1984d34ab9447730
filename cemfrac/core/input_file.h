// Every input path is treated alike: cemfrac reads only regular files (a symbolic link to one is
// fine). A directory, a FIFO, a socket, a device, a dangling link or a link loop is refused with
// one line saying which it is, before anything opens it (opening a FIFO would block until a writer
// comes). Streaming from stdin is spelled `-` where a command documents it (tokenize --text -).
//
//   check_input_file(path, "--prompts");  // "--prompts x: is a directory, not a file"
#pragma once
#include <string>

namespace cemfrac {

// Why `path` is not a readable regular file ("no such file", "is a directory, not a file", "is a
// FIFO (named pipe), not a regular file", "is a dangling symbolic link (to T)", "is a symbolic
// link loop", ...), or "" when it is one.
std::string input_file_problem(const std::string& path);

// Throws cemfrac::Error "<what> <path>: <problem>; <advice>" ("<path>: ..." when `what` is empty)
// unless `path` is a regular file.
void check_input_file(const std::string& path, const std::string& what,
                      const std::string& advice = "pass a regular file");

}  // namespace cemfrac

// User-facing errors. Library code throws cemfrac::Error with one line that names the problem and,
// where there is one, what to do; the CLI catches it at the boundary, prints "cemfrac: error: ..."
// and exits non-zero. Internal invariants use TORCH_INTERNAL_ASSERT instead.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cemfrac {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace cemfrac

// CEMFRAC_CHECK(cond, "format {}", args...): throws cemfrac::Error with the formatted message.
#define CEMFRAC_CHECK(cond, ...)    \
  do {                              \
    if (!(cond)) {                  \
      ::cemfrac::fail(__VA_ARGS__); \
    }                               \
  } while (0)

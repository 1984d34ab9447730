// Warnings: one line "cemfrac: warning: ..." on stderr; the command goes on (errors: core/check.h).
#pragma once
#include <fmt/format.h>

#include <cstdio>

namespace cemfrac {

template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  fmt::print(stderr, "cemfrac: warning: {}\n", fmt::format(format, std::forward<Args>(args)...));
  std::fflush(stderr);
}

}  // namespace cemfrac

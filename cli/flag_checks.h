// Checks of flag values shared by several commands, applied by CLI11 to the text as typed (before
// it is converted, so that "-1" never wraps to 2^64 - 1 in an unsigned option).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

namespace cemfrac::cli {

// A seed: a non-negative integer (every --seed is an unsigned 64-bit number).
inline CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& text) {
        return !text.empty() && text.front() == '-'
                   ? std::string("must be a non-negative integer (got ") + text + ")"
                   : std::string();
      },
      "SEED");
}

}  // namespace cemfrac::cli

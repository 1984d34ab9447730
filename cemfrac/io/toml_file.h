// Reading TOML files (run configs, comparison suites) with toml++, behind one guard.
//
// toml++ 3.3.0 (Debian 12's) has undefined behaviour on a non-ASCII character where its parser
// skips whitespace: it reaches TOML_UNREACHABLE in is_non_ascii_horizontal_whitespace() (upstream
// marzer/tomlplusplus issue 295, fixed after 3.3.0; found by our run_config fuzz target, input in
// fuzz/known/). TOML allows non-ASCII text only inside strings and comments, so a scan that refuses
// it everywhere else refuses only invalid TOML, and toml++ never sees the input that breaks it. The
// one valid input also refused: a multi-line basic string whose line-ending backslash is followed
// (after the whitespace it trims) by a non-ASCII character, which toml++ reads through the same
// function.
#pragma once
#include <toml++/toml.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cemfrac {

struct TomlTextProblem {
  size_t line = 0;    // 1-based
  size_t column = 0;  // 1-based, in bytes
  std::string what;
};

// The first non-ASCII byte outside TOML strings and comments (a leading UTF-8 byte-order mark is
// allowed), or nothing. Unterminated strings end the scan quietly: toml++ reports them.
std::optional<TomlTextProblem> find_non_ascii_outside_strings(std::string_view text);

// Reads and parses a TOML file. Errors are one line: "cannot read <what> <path>: <reason>" when the
// file cannot be read, "<path>:<line>:<column>: <description> (TOML syntax)" for bad TOML.
toml::table parse_toml_file(const std::string& path, const std::string& what);

// Parses TOML text that is not a file (e.g. a --set override); nothing when toml++ rejects it or
// the guard above would.
std::optional<toml::table> try_parse_toml_text(std::string_view text, std::string_view source_name);

}  // namespace cemfrac

#include "cemfrac/io/toml_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {

std::optional<TomlTextProblem> find_non_ascii_outside_strings(std::string_view text) {
  enum class State { kToml, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  State state = State::kToml;
  size_t line = 1, line_start = 0;
  size_t i = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // byte-order mark
  auto problem = [&](size_t at, std::string what) {
    return TomlTextProblem{line, at - line_start + 1, std::move(what)};
  };
  auto run_of = [&](size_t at, char c) {
    size_t n = 0;
    while (at + n < text.size() && text[at + n] == c) ++n;
    return n;
  };
  while (i < text.size()) {
    const char c = text[i];
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      // A newline ends a comment; inside a one-line string it is a syntax error toml++ reports.
      if (state == State::kComment || state == State::kBasic || state == State::kLiteral)
        state = State::kToml;
      ++i;
      continue;
    }
    switch (state) {
      case State::kToml:
        if (byte >= 0x80)
          return problem(i,
                         "a non-ASCII character outside a string or comment (TOML allows them only "
                         "inside quotes or after #)");
        if (c == '#') {
          state = State::kComment;
        } else if (c == '"') {
          if (run_of(i, '"') >= 3) {
            state = State::kMultiBasic;
            i += 3;
            continue;
          }
          state = State::kBasic;
        } else if (c == '\'') {
          if (run_of(i, '\'') >= 3) {
            state = State::kMultiLiteral;
            i += 3;
            continue;
          }
          state = State::kLiteral;
        }
        ++i;
        break;
      case State::kComment: ++i; break;
      case State::kBasic:
        if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\n') {
          i += 2;  // an escape: the escaped byte cannot close the string
          continue;
        }
        if (c == '"') state = State::kToml;
        ++i;
        break;
      case State::kLiteral:
        if (c == '\'') state = State::kToml;
        ++i;
        break;
      case State::kMultiBasic: {
        if (c == '\\') {
          // A line-ending backslash trims all whitespace and newlines after it.
          size_t j = i + 1;
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r')) ++j;
          if (j < text.size() && text[j] == '\n') {
            i += 1;
            while (i < text.size() &&
                   (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n')) {
              if (text[i] == '\n') {
                ++line;
                line_start = i + 1;
              }
              ++i;
            }
            if (i < text.size() && static_cast<unsigned char>(text[i]) >= 0x80)
              return problem(i,
                             "a non-ASCII character right after a line-ending backslash in a "
                             "multi-line string (toml++ 3.3.0 misreads it; start the line with an "
                             "ASCII character)");
            continue;
          }
          i += 2;  // an ordinary escape
          continue;
        }
        if (c == '"') {
          const size_t n = run_of(i, '"');
          if (n >= 3) {
            state = State::kToml;  // up to two more quotes before the closing three are content
            i += n;
            continue;
          }
          i += n;
          continue;
        }
        ++i;
        break;
      }
      case State::kMultiLiteral: {
        if (c == '\'') {
          const size_t n = run_of(i, '\'');
          if (n >= 3) state = State::kToml;
          i += n;
          continue;
        }
        ++i;
        break;
      }
    }
  }
  return std::nullopt;
}

namespace {

[[noreturn]] void syntax_error(const std::string& path, const toml::parse_error& e,
                               const std::string& what) {
  const auto& begin = e.source().begin;
  if (begin.line == 0) fail("cannot read {} {}: {}", what, path, e.description());
  fail("{}:{}:{}: {} (TOML syntax)", path, begin.line, begin.column, e.description());
}

}  // namespace

toml::table parse_toml_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {} {}: {}", what, path, std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  CEMFRAC_CHECK(!in.bad(), "cannot read {} {}: a read error", what, path);
  const std::string text = buffer.str();
  if (const auto p = find_non_ascii_outside_strings(text))
    fail("{}:{}:{}: {} (TOML syntax)", path, p->line, p->column, p->what);
  try {
    return toml::parse(std::string_view(text), std::string_view(path));
  } catch (const toml::parse_error& e) {
    syntax_error(path, e, what);
  }
}

std::optional<toml::table> try_parse_toml_text(std::string_view text,
                                               std::string_view source_name) {
  if (find_non_ascii_outside_strings(text)) return std::nullopt;
  try {
    return toml::parse(text, source_name);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

}  // namespace cemfrac

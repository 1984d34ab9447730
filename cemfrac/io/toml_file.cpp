#include "cemfrac/io/toml_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {

namespace {

// The scan of find_non_ascii_outside_strings: where the text is (TOML, a comment, one of the four
// string kinds), one method per state, each consuming at least one byte.
class TomlScanner {
 public:
  explicit TomlScanner(std::string_view text) : text_(text) {
    if (text.substr(0, 3) == "\xEF\xBB\xBF") i_ = 3;  // byte-order mark
  }

  std::optional<TomlTextProblem> run() {
    while (i_ < text_.size()) {
      if (text_[i_] == '\n') {
        newline();
        continue;
      }
      std::optional<TomlTextProblem> p;
      switch (state_) {
        case State::kToml: p = toml(); break;
        case State::kComment: ++i_; break;
        case State::kBasic: basic(); break;
        case State::kLiteral: literal(); break;
        case State::kMultiBasic: p = multi_basic(); break;
        case State::kMultiLiteral: multi_literal(); break;
      }
      if (p) return p;
    }
    return std::nullopt;
  }

 private:
  enum class State { kToml, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };

  TomlTextProblem problem(size_t at, std::string what) const {
    return TomlTextProblem{line_, at - line_start_ + 1, std::move(what)};
  }
  size_t run_of(size_t at, char c) const {
    size_t n = 0;
    while (at + n < text_.size() && text_[at + n] == c) ++n;
    return n;
  }

  void newline() {
    ++line_;
    line_start_ = i_ + 1;
    // A newline ends a comment; inside a one-line string it is a syntax error toml++ reports.
    if (state_ == State::kComment || state_ == State::kBasic || state_ == State::kLiteral)
      state_ = State::kToml;
    ++i_;
  }

  std::optional<TomlTextProblem> toml() {
    const char c = text_[i_];
    if (static_cast<unsigned char>(c) >= 0x80)
      return problem(i_,
                     "a non-ASCII character outside a string or comment (TOML allows them only "
                     "inside quotes or after #)");
    if (c == '#') {
      state_ = State::kComment;
    } else if (c == '"' || c == '\'') {
      const bool basic = c == '"';
      if (run_of(i_, c) >= 3) {
        state_ = basic ? State::kMultiBasic : State::kMultiLiteral;
        i_ += 3;
        return std::nullopt;
      }
      state_ = basic ? State::kBasic : State::kLiteral;
    }
    ++i_;
    return std::nullopt;
  }

  void basic() {
    const char c = text_[i_];
    if (c == '\\' && i_ + 1 < text_.size() && text_[i_ + 1] != '\n') {
      i_ += 2;  // an escape: the escaped byte cannot close the string
      return;
    }
    if (c == '"') state_ = State::kToml;
    ++i_;
  }

  void literal() {
    if (text_[i_] == '\'') state_ = State::kToml;
    ++i_;
  }

  std::optional<TomlTextProblem> multi_basic() {
    const char c = text_[i_];
    if (c == '\\') return backslash_in_multi_basic();
    if (c == '"') {
      const size_t n = run_of(i_, '"');
      if (n >= 3) state_ = State::kToml;  // up to two more quotes before the closing three
      i_ += n;
      return std::nullopt;
    }
    ++i_;
    return std::nullopt;
  }

  // A line-ending backslash trims all whitespace and newlines after it; any other is an escape.
  std::optional<TomlTextProblem> backslash_in_multi_basic() {
    size_t j = i_ + 1;
    while (j < text_.size() && (text_[j] == ' ' || text_[j] == '\t' || text_[j] == '\r')) ++j;
    if (j >= text_.size() || text_[j] != '\n') {
      i_ += 2;  // an ordinary escape
      return std::nullopt;
    }
    i_ += 1;
    while (i_ < text_.size() &&
           (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\r' || text_[i_] == '\n')) {
      if (text_[i_] == '\n') {
        ++line_;
        line_start_ = i_ + 1;
      }
      ++i_;
    }
    if (i_ < text_.size() && static_cast<unsigned char>(text_[i_]) >= 0x80)
      return problem(i_,
                     "a non-ASCII character right after a line-ending backslash in a multi-line "
                     "string (toml++ 3.3.0 misreads it; start the line with an ASCII character)");
    return std::nullopt;
  }

  void multi_literal() {
    if (text_[i_] == '\'') {
      const size_t n = run_of(i_, '\'');
      if (n >= 3) state_ = State::kToml;
      i_ += n;
      return;
    }
    ++i_;
  }

  std::string_view text_;
  State state_ = State::kToml;
  size_t line_ = 1, line_start_ = 0, i_ = 0;
};

}  // namespace

std::optional<TomlTextProblem> find_non_ascii_outside_strings(std::string_view text) {
  return TomlScanner(text).run();
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

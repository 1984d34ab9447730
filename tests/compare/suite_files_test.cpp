// Every suite the repository ships (configs/suites/*.toml) loads: its runs' configs exist and every
// `set` override is valid (load_suite checks them as the run config would). The paper-scale suites
// are never trained here, so this is what keeps them from rotting.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "cemfrac/compare/suite.h"
#include "tests/test_util.h"

namespace cemfrac::test {
namespace {

namespace fs = std::filesystem;

TEST(SuiteFiles, EveryCommittedSuiteLoads) {
  const fs::path dir = test::source_path("configs/suites");
  std::set<std::string> names;
  // Suites name their run configs relative to the repository root (the working directory of ctest).
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    Suite suite;
    ASSERT_NO_THROW(suite = load_suite(entry.path().string()));
    EXPECT_FALSE(suite.runs.empty());
    EXPECT_TRUE(names.insert(suite.name).second) << "two suites named " << suite.name;
  }
  for (const char* expected : {"quick", "cem", "cofrgenet", "gp", "cem-paper", "cofrgenet-paper"})
    EXPECT_TRUE(names.count(expected)) << expected;
}

}  // namespace
}  // namespace cemfrac::test

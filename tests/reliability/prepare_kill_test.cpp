// `prepare` killed outright while it writes (SIGKILL at a random moment of its write phase), then
// run again as it was: the dataset it makes is byte for byte the one an uninterrupted prepare
// makes, and the half-written copy the killed one left beside --out is gone. (The dataset itself is
// never half-written: write_dir_atomic fills a sibling folder and renames it into place.)
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

// Folders named "<out>.tmp-..." beside `out`.
std::vector<std::string> temp_siblings(const std::string& out) {
  std::vector<std::string> found;
  const std::string prefix = fs::path(out).filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path(), ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().string());
  return found;
}

TEST(PrepareKill, AKilledPrepareRunAgainGivesTheSameDatasetAndLeavesNoLeftovers) {
  // sp:1024 on Brown: a few seconds of tokenizer training, then a write phase of seconds.
  auto args = [](const std::string& out) {
    return std::vector<std::string>{"prepare", "--corpus", "brown", "--tokenizer",
                                    "sp:1024", "--out",    out};
  };
  const std::string ref = test::temp_dir("prep_kill_ref") + "/data";
  const auto r = test::run_cemfrac(args(ref));
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const std::string root = test::temp_dir("prep_kill");
  const std::string out = root + "/data";
  std::mt19937 rng{std::random_device{}()};
  const int delay_ms = std::uniform_int_distribution<int>(0, 300)(rng);
  {
    test::Background p(args(out), root);
    ASSERT_TRUE(p.wait_for([&] { return !temp_siblings(out).empty(); }))
        << "the write phase never started: " << p.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    // The write phase lasts seconds, the delay at most 0.3 s: prepare is still writing.
    ASSERT_EQ(p.stop(SIGKILL), 128 + SIGKILL) << "prepare ended before the kill";
  }
  SCOPED_TRACE(::testing::Message() << "killed " << delay_ms << " ms into the write phase");
  ASSERT_FALSE(temp_siblings(out).empty()) << "the kill left nothing to clean up";
  EXPECT_FALSE(fs::exists(out + "/meta.json")) << "a killed prepare left a dataset behind";

  const auto again = test::run_cemfrac(args(out));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(temp_siblings(out).empty());
  for (const char* f : {"train.bin", "val.bin", "test.bin", "tokenizer/sentencepiece.model",
                        "tokenizer/tokenizer.json"})
    EXPECT_EQ(test::read_file(out + "/" + f), test::read_file(ref + "/" + f)) << f;
}

}  // namespace
}  // namespace cemfrac

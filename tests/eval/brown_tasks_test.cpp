// Built-in Brown tasks (eval/brown_tasks.h): the stated filters hold, the multiple-choice gold is
// the true next sentence, and `cemfrac eval --task` runs files and built-ins end to end.
#include "cemfrac/eval/brown_tasks.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/model_test_util.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

TEST(BrownTasks, ClozeKeepsOnlySentencesWhoseLastWordIsInTheHistory) {
  const std::vector<std::vector<std::string>> docs = {{
      "The old harbor was quiet in the early morning.",
      "Nobody walked along the road by the old harbor.",                     // 9 words, in history
      "Short one about the harbor.",                                         // too short
      "Everyone in the town knew the fishermen would return to the harbor.",  // in history
      "They would all sit and wait for news of the storm.",                  // "storm" is new
      "Boats came home slowly in the rain from the harbor, 1961.",           // last word a number
  }};
  const TaskSet t = brown_cloze_task(docs);
  ASSERT_EQ(t.cloze.size(), 2u);
  EXPECT_EQ(t.cloze[0].target, " harbor");
  EXPECT_EQ(t.cloze[0].context,
            "The old harbor was quiet in the early morning. Nobody walked along the road by the "
            "old");
  EXPECT_EQ(t.cloze[1].target, " harbor");
}

TEST(BrownTasks, MultipleChoiceGoldIsTheTrueNextSentence) {
  std::vector<std::string> s;
  for (int i = 0; i < 20; ++i) s.push_back("Sentence number " + std::to_string(i) + " of this document.");
  const TaskSet t = brown_mc_task({s}, /*seed=*/0);
  ASSERT_FALSE(t.choice.empty());
  std::set<int64_t> golds;
  for (size_t e = 0; e < t.choice.size(); ++e) {
    const ChoiceExample& ex = t.choice[e];
    const size_t i = 2 + 3 * e;
    EXPECT_EQ(ex.context, s[i - 2] + " " + s[i - 1]);
    ASSERT_EQ(ex.choices.size(), 4u);
    EXPECT_EQ(ex.choices[ex.gold], " " + s[i]);
    golds.insert(ex.gold);
    for (size_t c = 0; c < 4; ++c) {
      if (static_cast<int64_t>(c) == ex.gold) continue;
      const int j = std::stoi(ex.choices[c].substr(17));
      EXPECT_GE(std::abs(j - static_cast<int>(i)), 3) << "a distractor next to the gold";
    }
  }
  EXPECT_GT(golds.size(), 1u) << "the gold position varies";
  const TaskSet again = brown_mc_task({s}, 0);
  EXPECT_EQ(again.choice[3].choices, t.choice[3].choices) << "seeded";
}

TEST(BrownTasks, BuiltInsComeFromTheTestSplit) {
  const TaskSet mc = builtin_task("brown-mc");
  const TaskSet cloze = builtin_task("brown-cloze");
  const TaskSet rolling = builtin_task("brown-rolling");
  EXPECT_GT(mc.choice.size(), 200u);
  EXPECT_GT(cloze.cloze.size(), 100u);
  EXPECT_EQ(rolling.rolling.size(), 25u);
}

TEST(EvalTaskCli, FilesAndBuiltInsScoreEndToEnd) {
  torch::manual_seed(2);
  LmModel model(test::tiny_model(257, 24, 64));
  const std::string ckpt = test::save_byte_checkpoint(model, "eval_task_cli");
  const std::string dir = test::temp_dir("eval_task_files");
  test::write_file(dir + "/mc.jsonl",
                   "{\"context\": \"The sky is\", \"choices\": [\" blue\", \" a fish\"], \"gold\": 0}\n"
                   "{\"context\": \"One, two,\", \"choices\": [\" three\", \" green\", \" x\"], "
                   "\"gold\": 0}\n");
  auto r = test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", dir + "/mc.jsonl", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["request"], "multiple_choice");
  EXPECT_EQ(j["requests"].get<int64_t>(), 5);
  EXPECT_NEAR(j["metrics"]["chance"].get<double>(), (0.5 + 1.0 / 3) / 2, 1e-12);

  test::write_file(dir + "/wiki.jsonl", "{\"page\": \" = Title = \\n The text .\"}\n");
  r = test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", dir + "/wiki.jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("word ppl"), std::string::npos);
  EXPECT_NE(r.out.find("bits/byte"), std::string::npos);

  r = test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", "brown-cloze", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["request"], "cloze");
  EXPECT_GE(j["metrics"]["acc"].get<double>(), 0.0);

  test::write_file(dir + "/bad.jsonl",
                   "{\"context\": \"a\", \"target\": \" b\"}\n{\"context\": \"a\", \"target\": 4}\n");
  test::expect_one_line_error(
      test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", dir + "/bad.jsonl"}),
      "bad.jsonl:2: \"target\" must be a string");
  test::expect_one_line_error(
      test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", "no-such-task"}),
      "no such file and no built-in task");
  // A task path that is a directory or a FIFO is named as such (the FIFO is never opened).
  std::filesystem::create_directories(dir + "/a-dir");
  test::expect_one_line_error(
      test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", dir + "/a-dir"}),
      "a-dir: is a directory, not a file");
  ASSERT_EQ(mkfifo((dir + "/a-fifo").c_str(), 0600), 0);
  test::expect_one_line_error(
      test::run_cemfrac({"eval", "--checkpoint", ckpt, "--task", dir + "/a-fifo"}),
      "a-fifo: is a FIFO (named pipe), not a regular file");
}

}  // namespace
}  // namespace cemfrac

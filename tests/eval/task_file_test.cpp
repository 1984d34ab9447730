// Task files (eval/task_file.h): each request type's lines, LAMBADA's and WikiText's own fields,
// and one error naming FILE:LINE for every bad line.
#include "cemfrac/eval/task_file.h"

#include <gtest/gtest.h>

#include <string>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

std::string error_of(const std::string& content, RequestType type = RequestType::kAuto) {
  try {
    parse_task_lines(content, "t.jsonl", type);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TaskFile, ReadsEachRequestType) {
  TaskSet mc = parse_task_lines(
      "{\"context\": \"Q\", \"choices\": [\" a\", \" b\"], \"gold\": 1, \"id\": 7}\n"
      "{\"context\": \"R\", \"choices\": [\" c\", \" d\", \" e\"], \"gold\": 0}\n",
      "t.jsonl", RequestType::kAuto);
  EXPECT_EQ(mc.type, RequestType::kMultipleChoice);
  ASSERT_EQ(mc.choice.size(), 2u);
  EXPECT_EQ(mc.choice[0].choices[1], " b");
  EXPECT_EQ(mc.choice[0].gold, 1);
  EXPECT_EQ(mc.choice[1].choices.size(), 3u);

  TaskSet cloze =
      parse_task_lines("{\"context\": \"It was the\", \"target\": \" end\"}", "t", RequestType::kAuto);
  EXPECT_EQ(cloze.type, RequestType::kCloze);
  EXPECT_EQ(cloze.cloze[0].target, " end");

  // LAMBADA's own line: the last space-separated word is the target, with its space.
  TaskSet lambada = parse_task_lines("{\"text\": \"he said to her hello\"}\n", "t",
                                     RequestType::kCloze);
  EXPECT_EQ(lambada.cloze[0].context, "he said to her");
  EXPECT_EQ(lambada.cloze[0].target, " hello");

  TaskSet rolling = parse_task_lines("{\"page\": \" = Title = \\n text\"}\r\n{\"text\": \"b\"}",
                                     "t", RequestType::kAuto);
  EXPECT_EQ(rolling.type, RequestType::kRolling);
  ASSERT_EQ(rolling.rolling.size(), 2u);
  EXPECT_EQ(rolling.rolling[0].text, " = Title = \n text");
}

TEST(TaskFile, EveryBadLineIsOneErrorNamingFileAndLine) {
  const std::string good = "{\"context\": \"Q\", \"choices\": [\" a\", \" b\"], \"gold\": 0}\n";
  EXPECT_NE(error_of(good + "{not json\n").find("t.jsonl:2: not JSON"), std::string::npos);
  EXPECT_NE(error_of(good + "\n" + good).find("t.jsonl:2: blank line"), std::string::npos);
  EXPECT_NE(error_of(good + "{\"context\": \"Q\", \"choices\": [\" a\", \" b\"], \"gold\": 2}\n")
                .find("t.jsonl:2: gold 2 is not an index"),
            std::string::npos);
  EXPECT_NE(error_of("{\"context\": \"Q\", \"choices\": [\" a\"], \"gold\": 0}")
                .find("t.jsonl:1: 1 choice(s)"),
            std::string::npos);
  EXPECT_NE(error_of(good + good + "{\"context\": \"Q\", \"target\": \" x\"}")
                .find("t.jsonl:3: \"choices\" must be an array"),
            std::string::npos);  // a cloze line in a multiple-choice file
  EXPECT_NE(error_of("{\"context\": 3, \"target\": \" x\"}").find("t.jsonl:1: \"context\" must be a string"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("t.jsonl:1: expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"question\": \"?\"}").find("t.jsonl:1: cannot tell the request type"),
            std::string::npos);
  EXPECT_NE(error_of("{\"text\": \"oneword\"}", RequestType::kCloze).find("t.jsonl:1:"),
            std::string::npos);
  EXPECT_NE(error_of("").find("no examples"), std::string::npos);
  EXPECT_NE(error_of("{\"text\": \"a\"}\n{\"text\": \"\xff\"}").find("t.jsonl:2: invalid UTF-8"),
            std::string::npos);
}

}  // namespace
}  // namespace cemfrac

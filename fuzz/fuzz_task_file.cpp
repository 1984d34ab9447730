// A zero-shot task file (JSON Lines, cemfrac/eval/task_file.h): the input is the file. It is read
// with every request type (and auto), from memory and through the file reader, which must agree.
// An accepted set holds what the format promises: at least one example, all of the type asked
// (auto: of one type), two or more non-empty choices with gold among them, non-empty continuations
// and documents.
#include "cemfrac/eval/task_file.h"
#include "fuzz/fuzz_util.h"

namespace {

void check_set(const cemfrac::TaskSet& s, cemfrac::RequestType asked) {
  using cemfrac::RequestType;
  FUZZ_REQUIRE(s.size() >= 1);
  FUZZ_REQUIRE(asked == RequestType::kAuto || s.type == asked);
  FUZZ_REQUIRE(s.type != RequestType::kAuto);
  FUZZ_REQUIRE(s.size() == s.choice.size() + s.cloze.size() + s.rolling.size());
  for (const cemfrac::ChoiceExample& e : s.choice) {
    FUZZ_REQUIRE(e.choices.size() >= 2);
    FUZZ_REQUIRE(e.gold >= 0 && e.gold < static_cast<int64_t>(e.choices.size()));
    for (const std::string& c : e.choices) FUZZ_REQUIRE(!c.empty());
  }
  for (const cemfrac::ClozeExample& e : s.cloze) FUZZ_REQUIRE(!e.target.empty());
  for (const cemfrac::RollingDocument& d : s.rolling) FUZZ_REQUIRE(!d.text.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  const std::string text(fuzz::as_text(data, size));
  const std::string path = fuzz::scratch_dir() + "/task.jsonl";
  fuzz::write_bytes(path, text);
  for (RequestType type : {RequestType::kAuto, RequestType::kMultipleChoice, RequestType::kCloze,
                           RequestType::kRolling}) {
    bool parsed = false;
    size_t n = 0;
    fuzz::expect_clean([&] {
      const TaskSet s = parse_task_lines(text, path, type);
      check_set(s, type);
      parsed = true;
      n = s.size();
    });
    bool read = false;
    fuzz::expect_clean([&] {
      const TaskSet s = read_task_file(path, type);
      FUZZ_REQUIRE(s.size() == n);
      read = true;
    });
    FUZZ_REQUIRE(parsed == read);
  }
  return 0;
}

// Zero-shot task files (docs/formats.md, "Task files"): JSON Lines, one example per line, all of one
// request type (lm-evaluation-harness's request types):
//   multiple_choice  {"context": "...", "choices": [" a", " b", ...], "gold": 1}
//   cloze            {"context": "...", "target": " word"}   or LAMBADA's own {"text": "..."},
//                    whose target is the last space-separated word (with its space) as in the
//                    harness's lambada task
//   rolling          {"text": "..."}   or WikiText's {"page": "..."} (the harness's field name)
// Continuations are scored exactly as written: a choice or target carries its own leading space.
// Other keys on a line ("id", "domain") are allowed and ignored. Every problem (not JSON, a missing
// or mistyped key, gold out of range, fewer than two choices, an empty continuation, a blank line,
// mixed request types) is one cemfrac::Error naming FILE:LINE; nothing is skipped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cemfrac {

enum class RequestType { kAuto, kMultipleChoice, kCloze, kRolling };
const char* to_string(RequestType type);
// "multiple_choice" | "mc" | "cloze" | "rolling" | "auto"; throws otherwise.
RequestType parse_request_type(const std::string& text);

struct ChoiceExample {
  std::string context;
  std::vector<std::string> choices;
  int64_t gold = 0;
};
struct ClozeExample {
  std::string context;
  std::string target;
};
struct RollingDocument {
  std::string text;
};

struct TaskSet {
  std::string name;  // file path or built-in name
  RequestType type = RequestType::kAuto;
  std::vector<ChoiceExample> choice;  // type kMultipleChoice
  std::vector<ClozeExample> cloze;    // type kCloze
  std::vector<RollingDocument> rolling;  // type kRolling
  size_t size() const;
};

// Reads a task file. kAuto infers the type from the first line: "choices" -> multiple_choice,
// "target" -> cloze, "text" or "page" -> rolling (a LAMBADA {"text"} file needs kCloze).
TaskSet read_task_file(const std::string& path, RequestType type = RequestType::kAuto);
// The same from text already in memory (`name` is used in the errors, as the path).
TaskSet parse_task_lines(const std::string& content, const std::string& name, RequestType type);

}  // namespace cemfrac

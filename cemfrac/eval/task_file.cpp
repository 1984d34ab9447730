#include "cemfrac/eval/task_file.h"

#include <nlohmann/json.hpp>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/text_source.h"  // find_invalid_utf8

namespace cemfrac {

const char* to_string(RequestType type) {
  switch (type) {
    case RequestType::kAuto: return "auto";
    case RequestType::kMultipleChoice: return "multiple_choice";
    case RequestType::kCloze: return "cloze";
    case RequestType::kRolling: return "rolling";
  }
  return "?";
}

RequestType parse_request_type(const std::string& text) {
  if (text == "auto" || text.empty()) return RequestType::kAuto;
  if (text == "multiple_choice" || text == "mc") return RequestType::kMultipleChoice;
  if (text == "cloze") return RequestType::kCloze;
  if (text == "rolling") return RequestType::kRolling;
  fail("--request {}: unknown; valid: multiple_choice (mc), cloze, rolling, auto", text);
}

size_t TaskSet::size() const {
  return choice.size() + cloze.size() + rolling.size();
}

namespace {

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  CEMFRAC_CHECK(it != j.end(), "{}: missing key \"{}\"", where, key);
  CEMFRAC_CHECK(it->is_string(), "{}: \"{}\" must be a string, got {}", where, key,
                it->type_name());
  return it->get<std::string>();
}

RequestType infer(const nlohmann::json& j, const std::string& where) {
  if (j.contains("choices")) return RequestType::kMultipleChoice;
  if (j.contains("target")) return RequestType::kCloze;
  if (j.contains("text") || j.contains("page")) return RequestType::kRolling;
  fail(
      "{}: cannot tell the request type: expected \"choices\" (multiple_choice), \"target\" "
      "(cloze) or \"text\"/\"page\" (rolling); or pass --request",
      where);
}

}  // namespace

namespace {

// A multiple-choice line: context, at least 2 non-empty choices, gold an index of them.
ChoiceExample choice_example(const nlohmann::json& j, const std::string& where) {
  ChoiceExample ex;
  ex.context = get_string(j, "context", where);
  auto it = j.find("choices");
  CEMFRAC_CHECK(it != j.end() && it->is_array(), "{}: \"choices\" must be an array of strings",
                where);
  for (const auto& c : *it) {
    CEMFRAC_CHECK(c.is_string(), "{}: \"choices\" must be an array of strings, got a {}", where,
                  c.type_name());
    CEMFRAC_CHECK(!c.get<std::string>().empty(), "{}: choice {} is empty", where,
                  ex.choices.size());
    ex.choices.push_back(c.get<std::string>());
  }
  CEMFRAC_CHECK(ex.choices.size() >= 2, "{}: {} choice(s); at least 2 are needed", where,
                ex.choices.size());
  auto g = j.find("gold");
  CEMFRAC_CHECK(g != j.end() && g->is_number_integer(),
                "{}: \"gold\" must be the integer index of the right choice", where);
  ex.gold = g->get<int64_t>();
  CEMFRAC_CHECK(ex.gold >= 0 && ex.gold < static_cast<int64_t>(ex.choices.size()),
                "{}: gold {} is not an index of the {} choices", where, ex.gold, ex.choices.size());
  return ex;
}

// A cloze line: context and target, or LAMBADA's "text" (the harness's lambada_openai: context =
// all but the last " "-separated word, target = " " + that word).
ClozeExample cloze_example(const nlohmann::json& j, const std::string& where) {
  ClozeExample ex;
  if (j.contains("target")) {
    ex.context = get_string(j, "context", where);
    ex.target = get_string(j, "target", where);
  } else {
    const std::string text = get_string(j, "text", where);
    const size_t space = text.rfind(' ');
    CEMFRAC_CHECK(space != std::string::npos && space + 1 < text.size(),
                  "{}: \"text\" has no last word after a space to predict", where);
    ex.context = text.substr(0, space);
    ex.target = text.substr(space);
  }
  CEMFRAC_CHECK(!ex.target.empty(), "{}: \"target\" is empty", where);
  return ex;
}

// One line's JSON object (a blank line or other JSON is an error naming `where`).
nlohmann::json line_object(const std::string& line, const std::string& where) {
  CEMFRAC_CHECK(line.find_first_not_of(" \t") != std::string::npos,
                "{}: blank line (one JSON object per line, no blank lines)", where);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON: {}", where, e.what());
  }
  CEMFRAC_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
  return j;
}

}  // namespace

TaskSet parse_task_lines(const std::string& content, const std::string& name, RequestType type) {
  TaskSet set;
  set.name = name;
  set.type = type;
  if (auto bad = find_invalid_utf8(content)) {
    size_t line = 1;
    for (size_t i = 0; i < *bad; ++i) line += content[i] == '\n';
    fail("{}:{}: invalid UTF-8 (byte offset {})", name, line, *bad);
  }
  size_t start = 0;
  int64_t line_no = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    std::string line = content.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = fmt::format("{}:{}", name, line_no);
    const nlohmann::json j = line_object(line, where);
    if (set.type == RequestType::kAuto) set.type = infer(j, where);
    switch (set.type) {
      case RequestType::kMultipleChoice: set.choice.push_back(choice_example(j, where)); break;
      case RequestType::kCloze: set.cloze.push_back(cloze_example(j, where)); break;
      case RequestType::kRolling: {
        RollingDocument doc;
        doc.text = get_string(j, j.contains("page") ? "page" : "text", where);
        CEMFRAC_CHECK(!doc.text.empty(), "{}: the document is empty", where);
        set.rolling.push_back(std::move(doc));
        break;
      }
      case RequestType::kAuto: break;
    }
  }
  CEMFRAC_CHECK(set.size() > 0, "{}: no examples (an empty task file)", name);
  return set;
}

TaskSet read_task_file(const std::string& path, RequestType type) {
  return parse_task_lines(read_file(path), path, type);
}

}  // namespace cemfrac

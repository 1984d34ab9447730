#include "cemfrac/tasks/glue.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"
#include "cemfrac/data/brown.h"
#include "cemfrac/data/split.h"
#include "cemfrac/data/text_source.h"  // find_invalid_utf8
#include "cemfrac/eval/metrics.h"

namespace cemfrac {
namespace {

// How one GLUE task's files are laid out.
struct GlueLayout {
  std::string name;
  bool header = true;
  // Header names of the columns (no header: their positions as text, e.g. "3").
  std::string text_a, text_b, label;
  bool regression = false;
  std::vector<std::string> labels;
  std::vector<std::string> eval_files;
};

const std::vector<GlueLayout>& glue_layouts() {
  static const std::vector<GlueLayout> layouts = {
      {"cola", false, "3", "", "1", false, {"0", "1"}, {"dev"}},
      {"sst2", true, "sentence", "", "label", false, {"0", "1"}, {"dev"}},
      {"mrpc", true, "#1 String", "#2 String", "Quality", false, {"0", "1"}, {"dev"}},
      {"qqp", true, "question1", "question2", "is_duplicate", false, {"0", "1"}, {"dev"}},
      {"stsb", true, "sentence1", "sentence2", "score", true, {}, {"dev"}},
      {"mnli", true, "sentence1", "sentence2", "gold_label", false,
       {"contradiction", "entailment", "neutral"}, {"dev_matched", "dev_mismatched"}},
      {"qnli", true, "question", "sentence", "label", false, {"entailment", "not_entailment"},
       {"dev"}},
      {"rte", true, "sentence1", "sentence2", "label", false, {"entailment", "not_entailment"},
       {"dev"}},
      {"wnli", true, "sentence1", "sentence2", "label", false, {"0", "1"}, {"dev"}},
  };
  return layouts;
}

const GlueLayout* find_layout(const std::string& name) {
  for (const GlueLayout& l : glue_layouts())
    if (l.name == name) return &l;
  return nullptr;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return out;
}

// The file's lines without their line ends (a final newline ends the last line; \r\n accepted).
std::vector<std::string> file_lines(const std::string& path) {
  check_input_file(path, "");  // as every reader: "is a directory", "is a FIFO", "no such file"
  std::string content = read_file(path);
  if (content.rfind("\xEF\xBB\xBF", 0) == 0) content.erase(0, 3);  // MRPC's files start with a BOM
  if (auto bad = find_invalid_utf8(content)) {
    const int64_t line = 1 + std::count(content.begin(), content.begin() + *bad, '\n');
    fail("{}:{}: invalid UTF-8 (byte offset {})", path, line, *bad);
  }
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < content.size()) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    std::string line = content.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

int64_t label_index(const std::vector<std::string>& labels, const std::string& value,
                    const std::string& where) {
  const auto it = std::find(labels.begin(), labels.end(), value);
  CEMFRAC_CHECK(it != labels.end(), "{}: label '{}' is not one of {}", where, value,
                fmt::join(labels, ", "));
  return it - labels.begin();
}

ClassificationTask read_plain_tsv(const std::string& dir) {
  ClassificationTask task;
  task.name = "tsv";
  struct Row {
    std::string text, label, where;
  };
  auto read_rows = [](const std::string& path) {
    std::vector<Row> rows;
    const auto lines = file_lines(path);
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string where = fmt::format("{}:{}", path, i + 1);
      const auto f = split_tabs(lines[i]);
      CEMFRAC_CHECK(f.size() == 2, "{}: {} tab-separated field(s); expected text<TAB>label", where,
                    f.size());
      CEMFRAC_CHECK(!f[0].empty(), "{}: empty text", where);
      // A label is its text without surrounding blanks: "pos " and "pos" are one class.
      const size_t first = f[1].find_first_not_of(" \t\r\v\f");
      const std::string label =
          first == std::string::npos
              ? ""
              : f[1].substr(first, f[1].find_last_not_of(" \t\r\v\f") - first + 1);
      CEMFRAC_CHECK(!label.empty(), "{}: empty label", where);
      rows.push_back({f[0], label, where});
    }
    CEMFRAC_CHECK(!rows.empty(), "{}: no examples", path);
    return rows;
  };
  const auto train = read_rows(dir + "/train.tsv");
  const auto dev = read_rows(dir + "/dev.tsv");
  std::set<std::string> labels;
  for (const Row& r : train) labels.insert(r.label);
  CEMFRAC_CHECK(labels.size() >= 2, "{}/train.tsv: one label ('{}'); classification needs two",
                dir, *labels.begin());
  task.labels.assign(labels.begin(), labels.end());
  task.train.name = "train";
  for (const Row& r : train)
    task.train.examples.push_back({r.text, "", label_index(task.labels, r.label, r.where), 0});
  LabelledSet d;
  d.name = "dev";
  for (const Row& r : dev) {
    CEMFRAC_CHECK(labels.count(r.label), "{}: label '{}' does not occur in train.tsv", r.where,
                  r.label);
    d.examples.push_back({r.text, "", label_index(task.labels, r.label, r.where), 0});
  }
  task.evals.push_back(std::move(d));
  return task;
}

// Genre letters of the Brown corpus and their names (the corpus manual's categories).
const std::vector<std::pair<char, std::string>>& brown_genres() {
  static const std::vector<std::pair<char, std::string>> g = {
      {'a', "press_reportage"}, {'b', "press_editorial"}, {'c', "press_reviews"},
      {'d', "religion"},        {'e', "skill_and_hobbies"}, {'f', "popular_lore"},
      {'g', "belles_lettres"},  {'h', "government_misc"}, {'j', "learned"},
      {'k', "fiction_general"}, {'l', "mystery"},         {'m', "science_fiction"},
      {'n', "adventure"},       {'p', "romance"},         {'r', "humor"}};
  return g;
}

constexpr size_t kPassageWords = 64;
constexpr size_t kMinPassageWords = 32;

ClassificationTask read_brown_genre(const std::string& corpus_dir) {
  ClassificationTask task;
  task.name = "brown-genre";
  for (const auto& [letter, name] : brown_genres()) task.labels.push_back(name);
  const std::vector<Document> docs = read_brown_corpus(corpus_dir);
  const DocumentSplit split = split_documents(docs.size(), SplitFractions{}, /*seed=*/0);
  auto passages = [&](size_t d, LabelledSet& set) {
    const Document& doc = docs[d];
    int64_t label = -1;
    for (size_t g = 0; g < brown_genres().size(); ++g)
      if (brown_genres()[g].first == doc.name[1]) label = static_cast<int64_t>(g);
    CEMFRAC_CHECK(label >= 0, "Brown file {}: genre letter '{}' is not a Brown category",
                  doc.name, doc.name[1]);
    std::vector<std::string> words;
    size_t i = 0;
    const std::string& t = doc.text;
    while (i < t.size()) {
      while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      const size_t b = i;
      while (i < t.size() && !std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      if (i > b) words.push_back(t.substr(b, i - b));
    }
    for (size_t w = 0; w < words.size(); w += kPassageWords) {
      const size_t n = std::min(kPassageWords, words.size() - w);
      if (n < kMinPassageWords) break;
      std::string text;
      for (size_t k = w; k < w + n; ++k) text += (k > w ? " " : "") + words[k];
      set.examples.push_back({text, "", label, 0});
    }
  };
  task.train.name = "train";
  for (size_t d : split.indices[0]) passages(d, task.train);
  const char* names[] = {"val", "test"};
  for (int s = 1; s <= 2; ++s) {
    LabelledSet set;
    set.name = names[s - 1];
    for (size_t d : split.indices[s]) passages(d, set);
    task.evals.push_back(std::move(set));
  }
  return task;
}

}  // namespace

const std::vector<std::string>& finetune_task_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const GlueLayout& l : glue_layouts()) n.push_back(l.name);
    n.push_back("tsv");
    n.push_back("brown-genre");
    return n;
  }();
  return names;
}

LabelledSet read_glue_file(const std::string& task, const std::string& path) {
  const GlueLayout* layout = find_layout(task);
  CEMFRAC_CHECK(layout != nullptr, "--task {}: not a GLUE task ({})", task,
                fmt::join(finetune_task_names(), ", "));
  const auto lines = file_lines(path);
  LabelledSet set;
  set.name = std::filesystem::path(path).stem().string();
  size_t first = 0;
  int64_t col_a = -1, col_b = -1, col_label = -1;
  if (layout->header) {
    CEMFRAC_CHECK(!lines.empty(), "{}: empty file (GLUE's {} files start with a header line)",
                  path, task);
    const auto names = split_tabs(lines[0]);
    auto column = [&](const std::string& want) -> int64_t {
      if (want.empty()) return -1;
      const auto it = std::find(names.begin(), names.end(), want);
      CEMFRAC_CHECK(it != names.end(),
                    "{}:1: the header has no column '{}' (GLUE's {} layout; header: {})", path,
                    want, task, fmt::join(names, " | "));
      return it - names.begin();
    };
    col_a = column(layout->text_a);
    col_b = column(layout->text_b);
    col_label = column(layout->label);
    first = 1;
  } else {
    col_a = std::stoll(layout->text_a);
    col_label = std::stoll(layout->label);
  }
  const int64_t need = std::max({col_a, col_b, col_label}) + 1;
  for (size_t i = first; i < lines.size(); ++i) {
    const std::string where = fmt::format("{}:{}", path, i + 1);
    const auto f = split_tabs(lines[i]);
    CEMFRAC_CHECK(static_cast<int64_t>(f.size()) >= need,
                  "{}: {} tab-separated field(s), GLUE's {} layout needs {}", where, f.size(), task,
                  need);
    LabelledExample ex;
    ex.text_a = f[col_a];
    CEMFRAC_CHECK(!ex.text_a.empty(), "{}: empty text in column {}", where, col_a + 1);
    if (col_b >= 0) {
      ex.text_b = f[col_b];
      CEMFRAC_CHECK(!ex.text_b.empty(), "{}: empty text in column {}", where, col_b + 1);
    }
    const std::string& value = f[col_label];
    if (layout->regression) {
      errno = 0;
      char* end = nullptr;
      ex.score = std::strtod(value.c_str(), &end);
      CEMFRAC_CHECK(!value.empty() && end == value.c_str() + value.size() && errno == 0 &&
                        std::isfinite(ex.score),
                    "{}: score '{}' is not a number", where, value);
    } else {
      ex.label = label_index(layout->labels, value, where);
    }
    set.examples.push_back(std::move(ex));
  }
  CEMFRAC_CHECK(!set.examples.empty(), "{}: no examples", path);
  return set;
}

ClassificationTask read_finetune_task(const std::string& name, const std::string& dir) {
  if (name == "tsv") return read_plain_tsv(dir);
  if (name == "brown-genre") return read_brown_genre(dir);
  const GlueLayout* layout = find_layout(name);
  CEMFRAC_CHECK(layout != nullptr, "--task {}: unknown; valid: {}", name,
                fmt::join(finetune_task_names(), ", "));
  ClassificationTask task;
  task.name = name;
  task.regression = layout->regression;
  task.pairs = !layout->text_b.empty();
  task.labels = layout->labels;
  task.train = read_glue_file(name, dir + "/train.tsv");
  task.train.name = "train";
  if (!layout->regression) {
    // A training set of one class teaches nothing (every prediction is that class): refused, as
    // the plain TSV task refuses it.
    std::set<int64_t> classes;
    for (const auto& ex : task.train.examples) classes.insert(ex.label);
    CEMFRAC_CHECK(classes.size() >= 2,
                  "{}/train.tsv: every example has the label '{}'; classification needs two or "
                  "more classes",
                  dir, layout->labels[static_cast<size_t>(*classes.begin())]);
  }
  for (const std::string& f : layout->eval_files)
    task.evals.push_back(read_glue_file(name, dir + "/" + f + ".tsv"));
  return task;
}

nlohmann::json task_metrics(const ClassificationTask& task, const LabelledSet& set,
                            const std::vector<int64_t>& predicted,
                            const std::vector<double>& predicted_scores) {
  nlohmann::json m;
  m["examples"] = set.examples.size();
  if (task.regression) {
    std::vector<double> gold;
    for (const auto& ex : set.examples) gold.push_back(ex.score);
    m["pearson"] = pearson(predicted_scores, gold);
    m["spearman"] = spearman(predicted_scores, gold);
    return m;
  }
  std::vector<int64_t> gold;
  for (const auto& ex : set.examples) gold.push_back(ex.label);
  m["acc"] = accuracy(predicted, gold);
  // Not a GLUE metric: the accuracy of always predicting the set's most frequent class, the floor a
  // classifier must clear (brown-genre's sets are far from balanced).
  std::vector<int64_t> counts(std::max<size_t>(task.labels.size(), 2), 0);
  for (int64_t g : gold) counts.at(static_cast<size_t>(g)) += 1;
  m["majority"] = static_cast<double>(*std::max_element(counts.begin(), counts.end())) /
                  static_cast<double>(gold.size());
  if (task.name == "cola") m["mcc"] = matthews_corrcoef(confusion(predicted, gold));
  if (task.name == "mrpc" || task.name == "qqp") m["f1"] = f1_score(confusion(predicted, gold));
  return m;
}

}  // namespace cemfrac

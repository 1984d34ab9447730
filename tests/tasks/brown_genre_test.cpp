// The brown-genre fine-tuning task (tasks/glue.h): 15 labels in the corpus manual's order, passages
// of 32 to 64 whole words cut from whole documents, document-level splits. Checked against the
// corpus itself: the number of files per genre letter is the Brown manual's (500 files), and each
// split's passages per label equal what the split's documents of that genre yield, counted here
// from their words; so a label off by one genre, a passage cut at the wrong length or a document
// in two splits fails.
#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cemfrac/data/brown.h"
#include "cemfrac/data/split.h"
#include "cemfrac/tasks/glue.h"

namespace cemfrac {
namespace {

// Words of a text (runs of non-space), as the passages count them.
size_t word_count(const std::string& t) {
  size_t n = 0;
  bool in_word = false;
  for (unsigned char c : t) {
    const bool space = std::isspace(c) != 0;
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

TEST(BrownGenre, PassagesCarryTheirDocumentsGenreInEverySplit) {
  // The manual's categories: letter, files, and the name the task gives it.
  const std::vector<std::tuple<char, int, std::string>> genres = {
      {'a', 44, "press_reportage"}, {'b', 27, "press_editorial"},   {'c', 17, "press_reviews"},
      {'d', 17, "religion"},        {'e', 36, "skill_and_hobbies"}, {'f', 48, "popular_lore"},
      {'g', 75, "belles_lettres"},  {'h', 30, "government_misc"},   {'j', 80, "learned"},
      {'k', 29, "fiction_general"}, {'l', 24, "mystery"},           {'m', 6, "science_fiction"},
      {'n', 29, "adventure"},       {'p', 29, "romance"},           {'r', 9, "humor"}};
  const std::vector<Document> docs = read_brown_corpus();
  ASSERT_EQ(docs.size(), 500u);
  std::map<char, int> files;
  for (const Document& d : docs) ++files[d.name[1]];
  std::map<char, size_t> label_of;
  for (size_t g = 0; g < genres.size(); ++g) {
    const auto& [letter, n, name] = genres[g];
    EXPECT_EQ(files[letter], n) << letter;
    label_of[letter] = g;
  }

  const ClassificationTask task = read_finetune_task("brown-genre", "");
  ASSERT_EQ(task.labels.size(), genres.size());
  for (size_t g = 0; g < genres.size(); ++g) EXPECT_EQ(task.labels[g], std::get<2>(genres[g]));
  ASSERT_EQ(task.evals.size(), 2u);
  const LabelledSet* sets[] = {&task.train, &task.evals[0], &task.evals[1]};

  const DocumentSplit split = split_documents(docs.size(), SplitFractions{}, 0);
  std::set<std::string> seen;
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(sets[s]->name);
    std::vector<size_t> expected(genres.size(), 0), got(genres.size(), 0);
    for (size_t d : split.indices[s]) {
      const size_t words = word_count(docs[d].text);
      expected[label_of.at(docs[d].name[1])] += words / 64 + (words % 64 >= 32 ? 1 : 0);
    }
    for (const auto& e : sets[s]->examples) {
      ASSERT_GE(e.label, 0);
      ASSERT_LT(e.label, static_cast<int64_t>(genres.size()));
      ++got[static_cast<size_t>(e.label)];
      const size_t words = word_count(e.text_a);
      EXPECT_GE(words, 32u);
      EXPECT_LE(words, 64u);
      EXPECT_TRUE(seen.insert(e.text_a).second) << "a passage in two places: " << e.text_a;
    }
    EXPECT_EQ(got, expected);
  }
}

}  // namespace
}  // namespace cemfrac

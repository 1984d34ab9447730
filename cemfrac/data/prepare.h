// `cemfrac prepare`: text -> tokenizer + token shards, as a library call (the CLI in
// cli/prepare.cpp only parses flags and prints). The output directory (docs/formats.md, "Prepared
// dataset"):
//
//   DIR/train.bin  DIR/val.bin  DIR/test.bin   token shards (data/shard.h)
//   DIR/tokenizer/                             Tokenizer::save
//   DIR/meta.json                              source, tokenizer, seed, split, per-split statistics
//
// The directory is built under a temporary name and renamed into place when complete, so it is
// either the old one or the whole new one. An existing DIR is refused unless `force`, and even then
// only an empty directory or one that holds a meta.json written by prepare is replaced. meta.json
// holds no times or host names: the same inputs give a byte-identical directory whenever the
// tokenizer is deterministic (byte and gpt2 are; sp:4096 on Brown was, in two runs).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/data/split.h"
#include "cemfrac/data/text_source.h"
#include "cemfrac/data/tokenizer.h"

namespace cemfrac {

inline constexpr int kPreparedFormatVersion = 1;
inline constexpr const char* kPreparedFormat = "cemfrac-prepared";
inline constexpr const char* kDefaultTokenizerSpec = "sp:4096";

struct PrepareOptions {
  std::string corpus;  // built-in corpus name ("brown", "mix"); exactly one of corpus / text_path
  std::string text_path;  // a UTF-8 file or a directory of *.txt files (text_source.h)
  std::string tokenizer = kDefaultTokenizerSpec;  // "byte" | "gpt2" | "sp:N" | "sp:N:unigram"
  std::string out_dir;
  SplitFractions split;
  uint64_t seed = 0;  // split permutation and SentencePiece training
  bool force = false;
  // One line per slow step (reading, training the tokenizer, encoding); null: quiet.
  std::function<void(const std::string& line)> progress;
  // Builds the tokenizer from the training split's texts. Null: from `tokenizer` (make_tokenizer,
  // or train_sentencepiece for sp:N). Tests inject their own tokenizer here.
  std::function<std::unique_ptr<Tokenizer>(const std::vector<std::string>& train_texts)>
      make_tokenizer;
};

struct PreparedSplit {
  std::string name;  // "train" | "val" | "test"
  std::string file;  // "train.bin", relative to the output directory
  std::vector<std::string> document_names;
  uint64_t bytes = 0;   // UTF-8 bytes of the documents' text
  uint64_t tokens = 0;  // tokens in the shard, one end-of-text per document included
  // bytes / (tokens - documents): text bytes per text token, separators excluded; 0 when empty.
  double bytes_per_token = 0;
};

struct PrepareResult {
  std::string out_dir;
  std::string tokenizer_id;
  int64_t vocab_size = 0;
  PreparedSplit splits[kNumSplits];  // train, val, test
  nlohmann::json meta;               // exactly what meta.json holds
  double seconds_read = 0, seconds_tokenizer = 0, seconds_encode = 0, seconds_total = 0;
};

// Runs the whole preparation; throws cemfrac::Error (one line) for every user error.
PrepareResult prepare_dataset(const PrepareOptions& options);

// The documents of the source named in `options` (checks that exactly one is given).
std::vector<Document> read_prepare_source(const PrepareOptions& options);

}  // namespace cemfrac

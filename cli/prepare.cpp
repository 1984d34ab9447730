// cemfrac prepare: a corpus or the user's text -> tokenizer + train/val/test token shards +
// meta.json (library: cemfrac/data/prepare.h; formats: docs/formats.md). Progress goes to stderr,
// the summary table (or --json) to stdout.
#include "cemfrac/data/prepare.h"

#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"

namespace cemfrac::cli {
namespace {

// 1234567 -> "1,234,567"
std::string group_digits(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_summary(const PrepareResult& r, const PrepareOptions& options) {
  const nlohmann::json& meta = r.meta;
  const std::string source = options.text_path.empty() ? options.corpus : options.text_path;
  fmt::print("prepared {}\n", r.out_dir);
  fmt::print("  source     {}\n", source);
  fmt::print("  tokenizer  {} (vocabulary {}, end-of-text id {}, shards {})\n", r.tokenizer_id,
             r.vocab_size, meta["tokenizer"]["eot_id"].get<int64_t>(),
             meta["tokenizer"]["token_dtype"].get<std::string>());
  fmt::print("  split      {} by document, seed {}\n", to_string(options.split), options.seed);
  fmt::print("\n{:<7} {:>9} {:>13} {:>13} {:>12}\n", "split", "documents", "bytes", "tokens",
             "bytes/token");
  uint64_t documents = 0, bytes = 0, tokens = 0;
  for (const PreparedSplit& s : r.splits) {
    fmt::print("{:<7} {:>9} {:>13} {:>13} {:>12.3f}\n", s.name, s.document_names.size(),
               group_digits(s.bytes), group_digits(s.tokens), s.bytes_per_token);
    documents += s.document_names.size();
    bytes += s.bytes;
    tokens += s.tokens;
  }
  const uint64_t text_tokens = tokens - documents;
  fmt::print("{:<7} {:>9} {:>13} {:>13} {:>12.3f}\n", "total", documents, group_digits(bytes),
             group_digits(tokens),
             text_tokens > 0 ? static_cast<double>(bytes) / text_tokens : 0.0);
  fmt::print("\ntokens include one end-of-text per document; bytes/token excludes them\n");
  fmt::print("time: read {:.1f} s, tokenizer {:.1f} s, encode {:.1f} s, total {:.1f} s\n",
             r.seconds_read, r.seconds_tokenizer, r.seconds_encode, r.seconds_total);
}

}  // namespace

Command add_prepare(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    PrepareOptions options;
    std::string split = "90,5,5";
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "prepare",
      "Text -> tokenizer + train/val/test token shards (DIR/{train,val,test}.bin, "
      "DIR/tokenizer/, DIR/meta.json)");
  auto* corpus = app->add_option("--corpus", flags->options.corpus,
                                 "Built-in corpus: brown, or mix (Brown plus the pinned English "
                                 "packages of scripts/setup.sh --corpus mix)");
  auto* text = app->add_option("--text", flags->options.text_path,
                               "A UTF-8 file (one document) or a directory of *.txt files (one "
                               "document each, sorted by path)");
  corpus->excludes(text);
  text->excludes(corpus);
  app->add_option("--tokenizer", flags->options.tokenizer,
                  "byte | gpt2 | sp:N | sp:N:unigram (SentencePiece trained on the train split)")
      ->capture_default_str();
  app->add_option("--out", flags->options.out_dir, "Output directory")->required();
  app->add_option("--split", flags->split, "train,val,test proportions, by document")
      ->capture_default_str();
  app->add_option("--seed", flags->options.seed,
                  "Seed of the split (and of SentencePiece training)")
      ->check(seed_check())
      ->capture_default_str();
  app->add_flag(
      "--force", flags->options.force,
      "Replace DIR if it exists (only an empty directory or an earlier prepared dataset)");
  app->add_flag("--json", flags->json,
                "Print the result as one JSON object (meta.json plus timings)");

  auto run = [flags]() {
    PrepareOptions options = flags->options;
    options.split = parse_split_fractions(flags->split);
    options.progress = [](const std::string& line) {
      std::fprintf(stderr, "prepare: %s\n", line.c_str());
      std::fflush(stderr);
    };
    const PrepareResult result = prepare_dataset(options);
    if (flags->json) {
      nlohmann::json j = result.meta;
      j["out"] = result.out_dir;
      j["seconds"] = {{"read", result.seconds_read},
                      {"tokenizer", result.seconds_tokenizer},
                      {"encode", result.seconds_encode},
                      {"total", result.seconds_total}};
      fmt::print("{}\n", j.dump(2));
    } else {
      print_summary(result, options);
    }
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

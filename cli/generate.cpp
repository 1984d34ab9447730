// cemfrac generate: prompt in, text out, with incremental decoding through the model's decode
// state. --prompts FILE: one prompt per line, decoded in batches (generate_batch), one JSON line
// out per prompt.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"
#include "cemfrac/model/generate.h"
#include "cemfrac/train/model_loader.h"
#include "cli/commands.h"
#include "cli/device_util.h"
#include "cli/flag_checks.h"

namespace cemfrac::cli {
namespace {

// The lines of a --prompts file: one prompt per line ('\n'; a '\r' before it is dropped); a final
// newline does not start another prompt. An empty line is an error rather than an empty prompt, so
// a stray blank line cannot silently add a row.
std::vector<std::string> read_prompt_lines(const std::string& path) {
  check_input_file(path, "--prompts", "write one prompt per line into a regular file");
  std::ifstream in(path, std::ios::binary);
  CEMFRAC_CHECK(in.good(), "--prompts {}: cannot open the file", path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    CEMFRAC_CHECK(!line.empty(),
                  "--prompts {} line {}: empty line; every line is one prompt (remove it, or use "
                  "--prompt '' for the start of a document)",
                  path, lines.size() + 1);
    lines.push_back(line);
  }
  CEMFRAC_CHECK(in.eof(), "--prompts {}: read error after line {}", path, lines.size());
  CEMFRAC_CHECK(!lines.empty(), "--prompts {}: the file is empty; write one prompt per line", path);
  return lines;
}

}  // namespace

// The flags, one declaration each (which makes this function long), then the command they run.
Command add_generate(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string checkpoint;
    std::string prompt;
    std::string prompts_file;
    int64_t batch_size = 32;
    int64_t max_new_tokens = 200;
    double temperature = 0.8;
    int64_t top_k = 0;
    double top_p = 0.95;
    uint64_t seed = 0;
    bool no_stop = false;
    std::vector<std::string> sets;  // --set model.cem.steps=4
  };
  auto f = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand("generate", "Generate text from a checkpoint");
  app->add_option("--checkpoint", f->checkpoint,
                  "Checkpoint directory, or a run directory (newest)")
      ->required();
  CLI::Option* one =
      app->add_option("--prompt", f->prompt, "Text to continue (default: start of a document)");
  app->add_option(
         "--prompts", f->prompts_file,
         "File with one prompt per line, decoded together in batches of --batch-size; "
         "prints one JSON object per line and prompt, in file order: {\"line\": n, "
         "\"prompt\": text, \"completion\": text, \"new_tokens\": k, \"stop\": reason} "
         "(each prompt gets the tokens it would get alone: sampling draws from a generator "
         "per prompt seeded with --seed)")
      ->excludes(one);
  app->add_option("--batch-size", f->batch_size, "Prompts of --prompts decoded at once")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app->add_option("--max-new-tokens", f->max_new_tokens, "Tokens to generate at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  app->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = all)");
  app->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1] (1 = off)");
  app->add_option("--seed", f->seed, "Sampling seed")->check(seed_check());
  app->add_flag("--no-stop", f->no_stop, "Do not stop at end-of-text");
  app->add_option(
      "--set", f->sets,
      "Change a field no parameter shape depends on, e.g. model.cem.steps=4 (repeatable)");
  auto run = [f, &global]() {
    // Every sampling setting is checked before anything is loaded or printed (CLI11's range check
    // lets NaN through).
    CEMFRAC_CHECK(std::isfinite(f->temperature) && f->temperature >= 0 && f->temperature <= 100,
                  "--temperature {}: must be a number in [0, 100] (0 = greedy)", f->temperature);
    CEMFRAC_CHECK(f->top_k >= 0, "--top-k {}: must be >= 0 (0 = all tokens)", f->top_k);
    CEMFRAC_CHECK(f->top_p > 0 && f->top_p <= 1, "--top-p {}: must be in (0, 1] (1 = off)",
                  f->top_p);
    LoadedModel loaded = load_model(f->checkpoint, f->sets, command_device(global));
    CEMFRAC_CHECK(loaded.tokenizer != nullptr,
                  "{} has no tokenizer/ directory: cannot encode a prompt", loaded.checkpoint);
    const Tokenizer& tok = *loaded.tokenizer;
    CEMFRAC_CHECK(tok.vocab_size() <= loaded.model->config().vocab_size,
                  "{}: tokenizer '{}' has {} ids, more than the model's vocab_size {}",
                  loaded.checkpoint, tok.id(), tok.vocab_size(), loaded.model->config().vocab_size);
    const int64_t context = loaded.model->config().context;
    // Like every document in the shards, a prompt follows an end-of-text. `where` names the prompt
    // in the error ("" for --prompt).
    auto encode_prompt = [&](const std::string& text, const std::string& where) {
      std::vector<int64_t> ids = {tok.eot_id()};
      for (TokenId id : tok.encode(text)) ids.push_back(id);
      CEMFRAC_CHECK(static_cast<int64_t>(ids.size()) < context,
                    "{}the prompt is {} tokens with {} ({} of text + the end-of-text id every "
                    "document starts after); the model's context is {}, and one position must "
                    "stay free",
                    where, ids.size(), tok.id(), ids.size() - 1, context);
      return ids;
    };
    std::vector<std::string> lines;
    std::vector<std::vector<int64_t>> batch_prompts;
    if (!f->prompts_file.empty()) {
      lines = read_prompt_lines(f->prompts_file);
      for (size_t i = 0; i < lines.size(); ++i)
        batch_prompts.push_back(
            encode_prompt(lines[i], fmt::format("--prompts {} line {}: ", f->prompts_file, i + 1)));
    }
    const std::vector<int64_t> prompt =
        f->prompts_file.empty() ? encode_prompt(f->prompt, "") : std::vector<int64_t>{};
    GenerateOptions options;
    options.sampling.temperature = f->temperature;
    options.sampling.top_k = f->top_k;
    options.sampling.top_p = f->top_p;
    options.seed = f->seed;
    options.max_new_tokens = f->max_new_tokens;
    options.eos_id = f->no_stop ? -1 : tok.eot_id();
    options.vocab_limit = tok.vocab_size();  // padding ids of the model are never drawn
    if (!batch_prompts.empty()) {
      // In file order, batch by batch; each line is printed once its batch is done.
      int64_t total = 0;
      const size_t step = static_cast<size_t>(f->batch_size);
      for (size_t begin = 0; begin < batch_prompts.size(); begin += step) {
        const size_t end = std::min(batch_prompts.size(), begin + step);
        const std::vector<std::vector<int64_t>> part(batch_prompts.begin() + begin,
                                                     batch_prompts.begin() + end);
        const std::vector<GenerateResult> results = generate_batch(*loaded.model, part, options);
        for (size_t i = 0; i < results.size(); ++i) {
          const GenerateResult& r = results[i];
          const std::vector<TokenId> ids(r.tokens.begin(), r.tokens.end());
          // ordered_json: the keys in the order docs/formats.md gives.
          const nlohmann::ordered_json line = {{"line", begin + i + 1},
                                               {"prompt", lines[begin + i]},
                                               {"completion", tok.decode(ids)},
                                               {"new_tokens", r.tokens.size()},
                                               {"stop", to_string(r.stop)}};
          // A completion may end inside a multi-byte character: invalid UTF-8 becomes U+FFFD.
          fmt::print("{}\n",
                     line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
          total += static_cast<int64_t>(r.tokens.size());
        }
        std::fflush(stdout);
      }
      std::fprintf(stderr, "[%zu prompts in batches of at most %lld, %lld tokens]\n",
                   batch_prompts.size(), static_cast<long long>(f->batch_size),
                   static_cast<long long>(total));
      return 0;
    }
    // The prompt is echoed once the device has computed something: a meta dry run stops at the
    // first token (one line on stderr) and prints nothing on stdout.
    bool echoed = false;
    auto echo_prompt = [&] {
      if (echoed) return;
      echoed = true;
      fmt::print("{}", f->prompt);
      std::fflush(stdout);
    };
    if (!loaded.model->head_weight().is_meta()) echo_prompt();
    // Print as tokens arrive; decode the whole continuation each time so multi-byte characters
    // split across tokens print once complete.
    std::vector<TokenId> generated;
    std::string printed;
    GenerateResult r = generate(*loaded.model, prompt, options, [&](int64_t token) {
      echo_prompt();
      generated.push_back(static_cast<TokenId>(token));
      const std::string text = tok.decode(generated);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        fmt::print("{}", text.substr(printed.size()));
        std::fflush(stdout);
        printed = text;
      }
      return true;
    });
    echo_prompt();
    const std::string text = tok.decode(generated);
    if (text.size() > printed.size()) fmt::print("{}", text.substr(printed.size()));
    fmt::print("\n");
    std::fprintf(stderr, "[%zu tokens, stopped: %s]\n", r.tokens.size(), to_string(r.stop));
    return 0;
  };
  return {app, run};
}

}  // namespace cemfrac::cli

// cemfrac generate: prompt in, text out, with incremental decoding through the model's decode
// state.
#include <fmt/format.h>

#include <cstdio>

#include "cemfrac/core/check.h"
#include "cemfrac/model/generate.h"
#include "cemfrac/train/model_loader.h"
#include "cli/commands.h"

namespace cemfrac::cli {

Command add_generate(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string checkpoint;
    std::string prompt;
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
  app->add_option("--prompt", f->prompt, "Text to continue (default: start of a document)");
  app->add_option("--max-new-tokens", f->max_new_tokens, "Tokens to generate at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app->add_option("--temperature", f->temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  app->add_option("--top-k", f->top_k, "Keep the k most likely tokens (0 = all)");
  app->add_option("--top-p", f->top_p, "Nucleus sampling mass in (0, 1] (1 = off)");
  app->add_option("--seed", f->seed, "Sampling seed");
  app->add_flag("--no-stop", f->no_stop, "Do not stop at end-of-text");
  app->add_option(
      "--set", f->sets,
      "Change a field no parameter shape depends on, e.g. model.cem.steps=4 (repeatable)");
  auto run = [f]() {
    // Every sampling setting is checked before anything is loaded or printed.
    CEMFRAC_CHECK(f->top_k >= 0, "--top-k {}: must be >= 0 (0 = all tokens)", f->top_k);
    CEMFRAC_CHECK(f->top_p > 0 && f->top_p <= 1, "--top-p {}: must be in (0, 1] (1 = off)",
                  f->top_p);
    LoadedModel loaded = load_model(f->checkpoint, f->sets);
    CEMFRAC_CHECK(loaded.tokenizer != nullptr,
                  "{} has no tokenizer/ directory: cannot encode a prompt", loaded.checkpoint);
    const Tokenizer& tok = *loaded.tokenizer;
    // Like every document in the shards, the prompt follows an end-of-text.
    std::vector<int64_t> prompt = {tok.eot_id()};
    for (TokenId id : tok.encode(f->prompt)) prompt.push_back(id);
    CEMFRAC_CHECK(static_cast<int64_t>(prompt.size()) < loaded.model->config().context,
                  "the prompt is {} tokens with {} ({} of text + the end-of-text id every document "
                  "starts after); the model's context is {}, and one position must stay free",
                  prompt.size(), tok.id(), prompt.size() - 1, loaded.model->config().context);
    CEMFRAC_CHECK(tok.vocab_size() <= loaded.model->config().vocab_size,
                  "{}: tokenizer '{}' has {} ids, more than the model's vocab_size {}",
                  loaded.checkpoint, tok.id(), tok.vocab_size(), loaded.model->config().vocab_size);
    GenerateOptions options;
    options.sampling.temperature = f->temperature;
    options.sampling.top_k = f->top_k;
    options.sampling.top_p = f->top_p;
    options.seed = f->seed;
    options.max_new_tokens = f->max_new_tokens;
    options.eos_id = f->no_stop ? -1 : tok.eot_id();
    options.vocab_limit = tok.vocab_size();  // padding ids of the model are never drawn
    fmt::print("{}", f->prompt);
    std::fflush(stdout);
    // Print as tokens arrive; decode the whole continuation each time so multi-byte characters
    // split across tokens print once complete.
    std::vector<TokenId> generated;
    std::string printed;
    GenerateResult r = generate(*loaded.model, prompt, options, [&](int64_t token) {
      generated.push_back(static_cast<TokenId>(token));
      const std::string text = tok.decode(generated);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        fmt::print("{}", text.substr(printed.size()));
        std::fflush(stdout);
        printed = text;
      }
      return true;
    });
    const std::string text = tok.decode(generated);
    if (text.size() > printed.size()) fmt::print("{}", text.substr(printed.size()));
    fmt::print("\n");
    std::fprintf(stderr, "[%zu tokens, stopped: %s]\n", r.tokens.size(), to_string(r.stop));
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

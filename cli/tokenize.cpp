// cemfrac tokenize: text -> token ids (or ids -> text with --decode) with a named tokenizer (byte,
// gpt2) or a saved one (a directory holding tokenizer.json, e.g. data/brown/tokenizer). The input
// is taken exactly as given, a trailing newline included; --decode writes the text exactly, adding
// none.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/input_file.h"
#include "cemfrac/data/tokenizer.h"
#include "cli/commands.h"

namespace cemfrac::cli {
namespace {

std::string read_input(const std::string& path) {
  if (!path.empty() && path != "-") {
    check_input_file(path, "--text", "pass a UTF-8 text file, or - for stdin");
    return read_file(path);
  }
  std::ostringstream s;
  s << std::cin.rdbuf();
  return s.str();
}

// A name (byte, gpt2, sp:N) or a directory written by Tokenizer::save.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& name) {
  if (name == "byte" || name == "gpt2") return make_tokenizer(name);
  std::error_code ec;
  if (std::filesystem::is_directory(name, ec)) return load_tokenizer(name);
  if (name.rfind("sp:", 0) == 0) {
    parse_tokenizer_spec(name);  // a malformed spec gets the parser's message
    fail(
        "--tokenizer {}: sentencepiece tokenizers are trained on data; pass the directory that "
        "holds one (e.g. data/brown/tokenizer from cemfrac prepare)",
        name);
  }
  fail(
      "--tokenizer {}: not byte or gpt2, and no such directory (a saved tokenizer is a directory "
      "holding tokenizer.json)",
      name);
}

// Ids separated by whitespace and/or commas, optionally inside [ ] (so a JSON array works too).
std::vector<TokenId> parse_ids(const std::string& text) {
  std::vector<TokenId> ids;
  size_t i = 0;
  const size_t n = text.size();
  auto separator = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']';
  };
  while (i < n) {
    if (separator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < n && !separator(text[end])) ++end;
    const std::string token = text.substr(i, end - i);
    errno = 0;
    char* stop = nullptr;
    const long long value = std::strtoll(token.c_str(), &stop, 10);
    CEMFRAC_CHECK(*stop == '\0' && errno == 0 && value >= INT32_MIN && value <= INT32_MAX,
                  "--decode: '{}' at byte {} of the input is not a token id (give integers "
                  "separated by spaces, or a JSON array)",
                  token, i);
    ids.push_back(static_cast<TokenId>(value));
    i = end;
  }
  return ids;
}

}  // namespace

Command add_tokenize(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string tokenizer;
    std::string text;
    bool json = false;
    bool decode = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "tokenize", "Text to token ids (or ids to text with --decode) with a tokenizer");
  app->add_option("--tokenizer,-t", flags->tokenizer,
                  "byte, gpt2, or a saved tokenizer directory (e.g. data/brown/tokenizer)")
      ->required();
  app->add_option("--text", flags->text, "Input file (default or '-': standard input)");
  app->add_flag("--json", flags->json,
                "Print a JSON array of ids (with --decode: the text as a JSON string)");
  app->add_flag("--decode", flags->decode,
                "Read token ids (space- or comma-separated, or a JSON array) and print their text");
  auto run = [flags]() {
    const std::unique_ptr<Tokenizer> tokenizer = open_tokenizer(flags->tokenizer);
    const std::string input = read_input(flags->text);
    if (flags->decode) {
      const std::string text = tokenizer->decode(parse_ids(input));
      if (flags->json) {
        fmt::print("{}\n", nlohmann::json(text).dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace));
      } else {
        std::fwrite(text.data(), 1, text.size(), stdout);
      }
      return 0;
    }
    const std::vector<TokenId> ids = tokenizer->encode(input);
    if (flags->json) {
      fmt::print("[{}]\n", fmt::join(ids, ","));
    } else {
      fmt::print("{}\n", fmt::join(ids, " "));
    }
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli

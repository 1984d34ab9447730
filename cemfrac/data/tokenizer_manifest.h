// tokenizer.json, the manifest that Tokenizer::save writes into its directory beside the
// tokenizer's files, and that load_tokenizer reads first:
//   {"format": "cemfrac-tokenizer", "format_version": 1, "kind": "gpt2", "id": "gpt2",
//    "vocab_size": 50257, "eot_id": 50256,
//    "files": {"encoder": "encoder.json", "merges": "vocab.bpe"}}
// "files" maps a role to a file name inside the same directory. Readers reject other formats and
// versions; new fields are only ever added.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "cemfrac/data/tokenizer.h"

namespace cemfrac {

struct TokenizerManifest {
  std::string kind;  // "byte" | "gpt2" | "sp"
  std::string id;    // Tokenizer::id()
  int64_t vocab_size = 0;
  TokenId eot_id = -1;
  std::map<std::string, std::string> files;  // role -> file name in the directory
};

// Writes `dir`/tokenizer.json atomically (creating `dir`). Call it after the tokenizer's own files
// are written, so that tokenizer.json only exists beside complete files.
void write_tokenizer_manifest(const std::string& dir, const TokenizerManifest& manifest);

// Reads and checks `dir`/tokenizer.json: the directory and file exist, the JSON parses, format and
// version match, every field is present with the right type. Throws cemfrac::Error naming the path.
TokenizerManifest read_tokenizer_manifest(const std::string& dir);

// The path of the file that `manifest` lists for `role`; throws cemfrac::Error when tokenizer.json
// does not list it or the file is missing from `dir`.
std::string tokenizer_file(const std::string& dir, const TokenizerManifest& manifest,
                           const std::string& role);

}  // namespace cemfrac

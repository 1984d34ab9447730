// The tokenizer factory functions: spec parsing, make_tokenizer, load_tokenizer, the UTF-8 check.
// Each kind lives in its own file pair: byte_tokenizer, gpt2_tokenizer, sentencepiece_tokenizer.
#include "cemfrac/data/tokenizer.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/byte_tokenizer.h"
#include "cemfrac/data/gpt2_tokenizer.h"
#include "cemfrac/data/sentencepiece_tokenizer.h"
#include "cemfrac/data/text_source.h"  // find_invalid_utf8
#include "cemfrac/data/tokenizer_manifest.h"

namespace cemfrac {
namespace {

constexpr int kMinSentencePieceVocab = 260;  // <unk>, end-of-text, "\n", 256 bytes, one piece
constexpr int kMaxSentencePieceVocab = 1 << 20;

[[noreturn]] void bad_spec(const std::string& spec) {
  fail("unknown tokenizer '{}': use byte, gpt2, sp:N or sp:N:unigram (e.g. sp:4096)", spec);
}

}  // namespace

void check_utf8(std::string_view text, std::string_view who) {
  if (const auto bad = find_invalid_utf8(text)) {
    fail(
        "{}: invalid UTF-8 at byte offset {} (byte 0x{:02x}): the text must be UTF-8 (convert it, "
        "e.g. iconv -f latin1 -t utf-8)",
        who, *bad, static_cast<unsigned char>(text[*bad]));
  }
}

TokenizerSpec parse_tokenizer_spec(const std::string& spec) {
  TokenizerSpec out;
  if (spec == "byte" || spec == "gpt2") {
    out.kind = spec;
    return out;
  }
  if (spec.rfind("sp:", 0) != 0) bad_spec(spec);
  std::string rest = spec.substr(3);
  std::string type = "bpe";
  if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    type = rest.substr(colon + 1);
    rest.resize(colon);
    if (type != "bpe" && type != "unigram") bad_spec(spec);
  }
  const bool digits = !rest.empty() && rest.size() <= 9 &&
                      rest.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) bad_spec(spec);
  const long n = std::strtol(rest.c_str(), nullptr, 10);
  CEMFRAC_CHECK(n >= kMinSentencePieceVocab && n <= kMaxSentencePieceVocab,
                "tokenizer '{}': the vocabulary size must be in [{}, {}] (256 byte pieces, <unk>, "
                "end-of-text and \"\\n\" are always in it)",
                spec, kMinSentencePieceVocab, kMaxSentencePieceVocab);
  out.kind = "sp";
  out.sp.vocab_size = static_cast<int>(n);
  out.sp.model_type = type;
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  const TokenizerSpec parsed = parse_tokenizer_spec(spec);
  if (parsed.kind == "byte") return std::make_unique<ByteTokenizer>();
  if (parsed.kind == "gpt2") return Gpt2Tokenizer::from_cache();
  fail(
      "tokenizer '{}' is trained on data, not made from a name: prepare data with --tokenizer {} "
      "(cemfrac prepare) and use the tokenizer directory it writes",
      spec, spec);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const TokenizerManifest m = read_tokenizer_manifest(dir);
  const std::string manifest_path = dir + "/" + kTokenizerManifest;
  std::unique_ptr<Tokenizer> tokenizer;
  if (m.kind == "byte") {
    tokenizer = std::make_unique<ByteTokenizer>();
  } else if (m.kind == "gpt2") {
    const std::string encoder = tokenizer_file(dir, m, "encoder");
    const std::string merges = tokenizer_file(dir, m, "merges");
    tokenizer = std::make_unique<Gpt2Tokenizer>(read_file(encoder), read_file(merges), dir);
  } else if (m.kind == "sp") {
    const std::string model = tokenizer_file(dir, m, "model");
    tokenizer = std::make_unique<SentencePieceTokenizer>(read_file(model), model);
  } else {
    fail("{}: unknown tokenizer kind '{}' (expected byte, gpt2 or sp): written by another program?",
         manifest_path, m.kind);
  }
  CEMFRAC_CHECK(tokenizer->id() == m.id && tokenizer->vocab_size() == m.vocab_size &&
                    tokenizer->eot_id() == m.eot_id,
                "{} says id {}, vocab_size {}, eot_id {}, but its files give {}, {}, {}: the "
                "directory mixes files of different tokenizers, re-save it",
                manifest_path, m.id, m.vocab_size, m.eot_id, tokenizer->id(),
                tokenizer->vocab_size(), tokenizer->eot_id());
  return tokenizer;
}

}  // namespace cemfrac

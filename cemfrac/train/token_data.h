// LM training data: a prepared dataset's token shards (`cemfrac prepare`, docs/formats.md) as the
// trainer's TrainingData. Training batches come from train.bin through a TokenLoader (windows of
// seq_len + 1 tokens, a fresh permutation per epoch from train.seed); validation is the first
// eval_tokens of val.bin cut into consecutive windows of seq_len + 1 tokens at stride seq_len, in
// batches of micro_batch windows: the same tokens every time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cemfrac/data/loader.h"
#include "cemfrac/data/shard.h"
#include "cemfrac/train/training_data.h"

namespace cemfrac {

struct TokenDataOptions {
  std::string dir;  // prepared dataset: train.bin and val.bin
  // The shards' headers must name it (open_token_shard); saved into every checkpoint, and a resumed
  // checkpoint's tokenizer must equal it.
  const Tokenizer* tokenizer = nullptr;
  bool verify = true;            // full scan of train.bin and val.bin on open (CRC, every id)
  int64_t model_vocab_size = 0;  // ids must be below it (0 = unchecked)
};

class TokenData : public TrainingData {
 public:
  explicit TokenData(TokenDataOptions options);

  void open(const DataLayout& layout) override;
  TrainBatch next() override;
  void skip(int64_t rows) override;
  nlohmann::json state() const override;  // {"epoch": e, "index": i} (LoaderState)
  void restore(const nlohmann::json& state, const std::string& source) override;
  std::string describe(const nlohmann::json& state) const override;
  nlohmann::json settings() const override;
  int64_t validation_batches() const override;
  TrainBatch validation_batch(int64_t k) const override;
  const Tokenizer* tokenizer() const override { return options_.tokenizer; }
  void check_checkpoint(const std::string& checkpoint_dir) const override;

 private:
  TokenDataOptions options_;
  DataLayout layout_;
  std::shared_ptr<const ShardReader> train_;
  std::shared_ptr<const ShardReader> val_;
  std::unique_ptr<TokenLoader> loader_;
  int64_t val_windows_ = 0;
};

}  // namespace cemfrac

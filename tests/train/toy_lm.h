// A tiny language model for the trainer, checkpoint and eval tests: it stands in for LmModel
// through the same TrainModel interface. logits = head(embed(x_t) + mix * embed(x_{t-1})), with
// `gate` a parameter the tests freeze and unfreeze. Also a prepared-dataset writer with learnable
// structure.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/data/shard.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/trainer.h"

namespace cemfrac::test {

struct ToyLmImpl : torch::nn::Module {
  ToyLmImpl(int64_t vocab, int64_t width) : vocab_size(vocab), d_model(width) {
    embed = register_module("embed", torch::nn::Embedding(vocab, width));
    head = register_module("head", torch::nn::Linear(width, vocab));
    gate = register_parameter("gate", torch::full({width}, 0.5));
  }
  // tokens (B, N) int64 -> logits (B, N, V). Causal: position t sees tokens t and t - 1.
  torch::Tensor forward(const torch::Tensor& tokens) {
    torch::Tensor h = embed(tokens);  // (B, N, D)
    torch::Tensor prev = torch::constant_pad_nd(h, {0, 0, 1, 0}).narrow(1, 0, h.size(1));
    return head(h + gate * prev);  // (B, N, V)
  }
  std::vector<ParamInfo> table(bool freeze_gate = false) const {
    auto info = [](const std::string& name, const torch::Tensor& t, ParamKind kind,
                   ParamGroup group) {
      ParamInfo p;
      p.name = name;
      p.shape = t.sizes().vec();
      p.numel = t.numel();
      p.kind = kind;
      p.group = group;
      return p;
    };
    return {info("embed.weight", embed->weight, ParamKind::kEmbedding, ParamGroup::kNoDecay),
            info("gate", gate, ParamKind::kAttention,
                 freeze_gate ? ParamGroup::kFrozen : ParamGroup::kNoDecay),
            info("head.weight", head->weight, ParamKind::kHead, ParamGroup::kDecay),
            info("head.bias", head->bias, ParamKind::kHead, ParamGroup::kNoDecay)};
  }
  int64_t vocab_size, d_model;
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor gate;
};
TORCH_MODULE(ToyLm);

// The "loss" of every line of a run's metrics.jsonl, in order.
inline std::vector<double> metrics_losses(const std::string& run) {
  std::vector<double> out;
  std::istringstream in(read_file(run + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line)["loss"]);
  return out;
}

inline nlohmann::json toy_config(int64_t vocab, int64_t width) {
  return {{"kind", "toy"}, {"vocab_size", vocab}, {"d_model", width}, {"context", 64}};
}

// A TrainModel around a fresh ToyLm initialised from `init_seed`.
inline TrainModel make_toy_model(int64_t vocab, int64_t width, uint64_t init_seed,
                                 bool freeze_gate = false) {
  torch::manual_seed(init_seed);
  ToyLm model(vocab, width);
  TrainModel tm;
  tm.module = model.ptr();
  tm.forward = [model](const torch::Tensor& t) mutable { return model->forward(t); };
  tm.params = model->table(freeze_gate);
  tm.config = toy_config(vocab, width);
  tm.context = 64;
  tm.vocab_size = vocab;
  return tm;
}

// Writes train.bin and val.bin into `dir`: documents of tokens in [0, vocab - 1) that mostly follow
// t -> (3t + 1) mod (vocab - 1), with end-of-text id vocab - 1 after each document.
inline void write_toy_dataset(const std::string& dir, int64_t vocab, int64_t train_docs,
                              int64_t val_docs) {
  std::filesystem::create_directories(dir);
  uint64_t rng = 12345;
  auto next = [&rng] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
  };
  auto docs = [&](int64_t count) {
    std::vector<std::vector<TokenId>> out;
    const int64_t m = vocab - 1;
    for (int64_t d = 0; d < count; ++d) {
      std::vector<TokenId> doc;
      TokenId t = static_cast<TokenId>(next() % m);
      const int64_t len = 20 + static_cast<int64_t>(next() % 30);
      for (int64_t i = 0; i < len; ++i) {
        doc.push_back(t);
        t = (next() % 5 == 0) ? static_cast<TokenId>(next() % m)
                              : static_cast<TokenId>((3 * t + 1) % m);
      }
      out.push_back(doc);
    }
    return out;
  };
  ShardInfo info;
  info.vocab_size = vocab;
  info.eot_id = static_cast<TokenId>(vocab - 1);
  info.tokenizer_id = "toy";
  write_shard(dir + "/train.bin", info, docs(train_docs));
  write_shard(dir + "/val.bin", info, docs(val_docs));
}

}  // namespace cemfrac::test

// Sampling and generation: greedy = argmax, top-k = 1 = greedy, top-k / top-p masks, seeds, stops,
// and generation through the decode state equals recomputing the whole sequence every step.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/model/generate.h"
#include "cemfrac/train/run_config.h"
#include "tests/test_util.h"

namespace cemfrac {
namespace {

ModelConfig preset(const std::string& name) {
  return load_run_config(test::source_path("configs/" + name + ".toml")).model;
}

SamplingOptions sampling(double temperature, int64_t top_k = 0, double top_p = 1.0) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  return o;
}

TEST(Sampling, GreedyPicksArgmax) {
  torch::manual_seed(1);
  torch::Tensor logits = torch::randn({5, 100});
  torch::Generator gen = make_sampling_generator(0);
  torch::Tensor picked = sample_next(logits, sampling(0.0), gen);
  EXPECT_TRUE(torch::equal(picked, logits.argmax(-1)));
}

TEST(Sampling, TopKOneEqualsGreedy) {
  torch::manual_seed(2);
  torch::Tensor logits = torch::randn({8, 300});
  for (uint64_t seed : {0, 1, 2, 3}) {
    torch::Generator gen = make_sampling_generator(seed);
    EXPECT_TRUE(torch::equal(sample_next(logits, sampling(1.0, 1), gen), logits.argmax(-1)));
  }
}

TEST(Sampling, TopKMasksAllButTheKLargest) {
  torch::Tensor logits = torch::tensor({{1.0, 4.0, 3.0, 2.0, 0.0}});
  torch::Tensor kept = torch::isfinite(filter_logits(logits, sampling(1.0, 2)));
  EXPECT_TRUE(torch::equal(kept, torch::tensor({{false, true, true, false, false}})));
}

TEST(Sampling, TopPMasksTheTail) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (shuffled): top_p = 0.7 keeps 0.5 and 0.3 (0.5 < 0.7, then
  // 0.8 >= 0.7 stops).
  torch::Tensor logits = torch::log(torch::tensor({{0.15, 0.5, 0.05, 0.3}}, torch::kFloat64));
  torch::Tensor filtered = filter_logits(logits, sampling(1.0, 0, 0.7));
  EXPECT_TRUE(torch::equal(torch::isfinite(filtered), torch::tensor({{false, true, false, true}})));
  // The kept logits are unchanged; a tiny top_p keeps only the most likely token.
  EXPECT_DOUBLE_EQ(filtered[0][1].item<double>(), std::log(0.5));
  torch::Tensor one = torch::isfinite(filter_logits(logits, sampling(1.0, 0, 0.01)));
  EXPECT_EQ(one.sum().item<int64_t>(), 1);
  // Draws never leave the nucleus.
  torch::Generator gen = make_sampling_generator(7);
  for (int i = 0; i < 200; ++i) {
    const int64_t t = sample_next(logits, sampling(1.0, 0, 0.7), gen).item<int64_t>();
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampling, TemperatureScales) {
  torch::Tensor logits = torch::tensor({{1.0, 2.0}});
  EXPECT_TRUE(torch::allclose(filter_logits(logits, sampling(0.5)), torch::tensor({{2.0, 4.0}})));
}

TEST(Sampling, BadOptionsAreErrors) {
  torch::Generator gen = make_sampling_generator(0);
  torch::Tensor logits = torch::zeros({1, 4});
  EXPECT_THROW(sample_next(logits, sampling(-1.0), gen), Error);
  EXPECT_THROW(sample_next(logits, sampling(1.0, -2), gen), Error);
  EXPECT_THROW(sample_next(logits, sampling(1.0, 0, 0.0), gen), Error);
  EXPECT_THROW(sample_next(logits, sampling(1.0, 0, 1.5), gen), Error);
}

class Generate : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    torch::manual_seed(3);
    model_ = LmModel(preset(GetParam()));
  }
  LmModel model_{nullptr};
};

TEST_P(Generate, SameSeedSameTokensOtherSeedOthers) {
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.seed = 99;
  const std::vector<int64_t> prompt = {1, 2, 3};
  GenerateResult a = generate(*model_, prompt, o);
  GenerateResult b = generate(*model_, prompt, o);
  EXPECT_EQ(a.tokens.size(), 24u);
  EXPECT_EQ(a.stop, StopReason::kMaxNewTokens);
  EXPECT_EQ(a.tokens, b.tokens);
  o.seed = 100;
  EXPECT_NE(generate(*model_, prompt, o).tokens, a.tokens);
}

// With vocab_limit (the tokenizer's vocabulary inside a padded model), no id at
// or above it is ever drawn, greedy or sampled; an untrained model would draw one within a few
// steps.
TEST_P(Generate, NeverDrawsPaddingIds) {
  const int64_t vocab = model_->config().vocab_size, limit = vocab / 3;
  for (double temperature : {1.0, 0.0}) {
    GenerateOptions o;
    o.sampling.temperature = temperature;
    o.max_new_tokens = 40;
    o.vocab_limit = limit;
    const GenerateResult r = generate(*model_, {1, 2, 3}, o);
    ASSERT_EQ(r.tokens.size(), 40u);
    for (int64_t t : r.tokens) EXPECT_LT(t, limit) << "temperature " << temperature;
  }
  GenerateOptions o;
  o.vocab_limit = limit;
  EXPECT_THROW(generate(*model_, {limit}, o), Error) << "a prompt id beyond the limit";
}

// Greedy generation through the decode state equals recomputing the full sequence at every step.
TEST_P(Generate, CachedGreedyEqualsFullRecompute) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 20;
  std::vector<int64_t> sequence = {5, 17, 42, 8};
  const GenerateResult cached = generate(*model_, sequence, o);
  torch::NoGradGuard no_grad;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    torch::Tensor input = torch::tensor(sequence, torch::kInt64).view({1, -1});
    sequence.push_back(model_->forward(input).select(1, -1).argmax(-1).item<int64_t>());
  }
  EXPECT_EQ(cached.tokens, std::vector<int64_t>(sequence.begin() + 4, sequence.end()));
}

TEST_P(Generate, StopsAtEndOfTextAndAtTheContext) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 10;
  const std::vector<int64_t> prompt = {1, 2, 3};
  const int64_t first = generate(*model_, prompt, o).tokens.at(0);
  o.eos_id = first;
  GenerateResult stopped = generate(*model_, prompt, o);
  EXPECT_TRUE(stopped.tokens.empty());
  EXPECT_EQ(stopped.stop, StopReason::kEndOfText);

  o.eos_id = -1;
  const int64_t context = model_->config().context;
  std::vector<int64_t> long_prompt(context - 2, 7);
  GenerateResult full = generate(*model_, long_prompt, o);
  EXPECT_EQ(full.stop, StopReason::kContext);
  EXPECT_EQ(full.tokens.size(), 3u);  // two positions left, plus the token drawn from the last one

  // A callback can stop early and sees every token.
  std::vector<int64_t> seen;
  o.eos_id = -1;
  GenerateResult early = generate(*model_, prompt, o, [&](int64_t t) {
    seen.push_back(t);
    return seen.size() < 4;
  });
  EXPECT_EQ(early.tokens, seen);
  EXPECT_EQ(early.tokens.size(), 4u);
  EXPECT_EQ(early.stop, StopReason::kCallback);
}

TEST_P(Generate, BadPromptsAreErrors) {
  GenerateOptions o;
  EXPECT_THROW(generate(*model_, {}, o), Error);
  EXPECT_THROW(generate(*model_, {model_->config().vocab_size}, o), Error);
  EXPECT_THROW(generate(*model_, std::vector<int64_t>(model_->config().context + 1, 1), o), Error);
}

INSTANTIATE_TEST_SUITE_P(Flavours, Generate, ::testing::Values("tiny-llama", "tiny-gpt2"));

// generate_batch: prompts of different lengths decoded together give each prompt what generate()
// gives it alone (greedy and sampled), for every mixer kind; the ragged prefill is the part that
// could go wrong (a row reading its prompt while others generate, positions, per-row stops).
class GenerateBatch : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    torch::manual_seed(5);
    model_ = LmModel(preset(GetParam()));
  }
  // Lengths 1 .. context - 3 (the last stops at the context), two of them equal.
  std::vector<std::vector<int64_t>> prompts() const {
    const int64_t context = model_->config().context;
    std::vector<std::vector<int64_t>> out;
    for (int64_t len : {int64_t{7}, int64_t{1}, int64_t{12}, int64_t{7}, context - 3}) {
      std::vector<int64_t> p;
      for (int64_t i = 0; i < len; ++i) p.push_back((31 * i + 17 * len + 5) % 200);
      out.push_back(p);
    }
    return out;
  }
  LmModel model_{nullptr};
};

TEST_P(GenerateBatch, EachPromptGetsItsSoloTokens) {
  const auto ps = prompts();
  for (double temperature : {0.0, 1.0}) {
    for (bool with_eos : {false, true}) {
      GenerateOptions o;
      o.sampling.temperature = temperature;
      o.sampling.top_p = temperature > 0 ? 0.9 : 1.0;
      o.seed = 11;
      o.max_new_tokens = 16;
      // With an end-of-text id: the one prompt 2 draws third when alone, so that row stops there.
      if (with_eos) o.eos_id = generate(*model_, ps[2], o).tokens.at(2);
      GenerateTimings timings;
      const std::vector<GenerateResult> batch = generate_batch(*model_, ps, o, &timings);
      ASSERT_EQ(batch.size(), ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        const GenerateResult solo = generate(*model_, ps[i], o);
        EXPECT_EQ(batch[i].tokens, solo.tokens)
            << "prompt " << i << ", temperature " << temperature << ", eos " << o.eos_id;
        EXPECT_EQ(batch[i].stop, solo.stop) << "prompt " << i << ", eos " << o.eos_id;
      }
      // The stops the prompts were chosen for did happen: without an end-of-text id, 16 tokens
      // for the short prompts and 4 for the long one (context - 3 positions: 3 free, + the last
      // draw); with it, prompt 2 stops after 2.
      if (with_eos) {
        EXPECT_EQ(batch[2].stop, StopReason::kEndOfText);
        EXPECT_LE(batch[2].tokens.size(), 2u);
      } else {
        EXPECT_EQ(batch[0].stop, StopReason::kMaxNewTokens);
        EXPECT_EQ(batch[0].tokens.size(), 16u);
        EXPECT_EQ(batch[4].stop, StopReason::kContext);
        EXPECT_EQ(batch[4].tokens.size(), 4u);
      }
      EXPECT_EQ(timings.prefill_positions, 1);  // the shortest prompt
      EXPECT_GT(timings.decode_steps, 0);
      EXPECT_EQ(
          timings.cache_bytes, decode_state_bytes([&] {
            torch::NoGradGuard no_grad;
            DecodeState s = model_->new_decode_state();
            model_->forward(torch::tensor(ps[0], torch::kInt64).view({1, -1}).repeat({5, 1}), &s);
            return s;
          }()));
      EXPECT_GT(timings.cache_bytes, 0);
    }
  }
}

TEST_P(GenerateBatch, OnePromptEqualsGenerateAndZeroNewTokensIsEmpty) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 9;
  const auto ps = prompts();
  EXPECT_EQ(generate_batch(*model_, {ps[2]}, o).at(0).tokens, generate(*model_, ps[2], o).tokens);
  o.max_new_tokens = 0;
  for (const GenerateResult& r : generate_batch(*model_, ps, o)) {
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_EQ(r.stop, StopReason::kMaxNewTokens);
  }
}

TEST_P(GenerateBatch, BadPromptsAreErrors) {
  GenerateOptions o;
  EXPECT_THROW(generate_batch(*model_, {}, o), Error);
  EXPECT_THROW(generate_batch(*model_, {{1, 2}, {}}, o), Error);
  EXPECT_THROW(generate_batch(*model_, {{1}, {model_->config().vocab_size}}, o), Error);
  EXPECT_THROW(
      generate_batch(*model_, {{1}, std::vector<int64_t>(model_->config().context + 1, 1)}, o),
      Error);
}

INSTANTIATE_TEST_SUITE_P(EveryMixerKind, GenerateBatch,
                         ::testing::Values("tiny-llama", "tiny-gpt2", "tiny-cem-both",
                                           "tiny-cem-full", "tiny-cofrgenet", "tiny-cofrgenet-au",
                                           "tiny-synthesizer-d", "tiny-sparse-attention"));

// The decode state's bytes: MHA keeps K and V for the whole context, CEM attention only K (its
// values are its keys), so at equal shape (n_kv_heads = n_heads) CEM holds exactly half.
TEST(DecodeStateBytes, CemKeyOnlyCacheIsHalfOfMha) {
  ModelConfig c = preset("tiny-llama");
  c.n_kv_heads = c.n_heads;
  const int64_t B = 3;
  auto bytes_of = [&](const std::string& mixer) {
    ModelConfig m = c;
    m.mixer = mixer;
    torch::manual_seed(0);
    LmModel model(m);
    torch::NoGradGuard no_grad;
    DecodeState state = model->new_decode_state();
    EXPECT_EQ(decode_state_bytes(state), 0);
    model->forward(torch::ones({B, 5}, torch::kInt64), &state);
    return decode_state_bytes(state);
  };
  const int64_t mha = bytes_of("mha"), cem = bytes_of("cem_attention");
  // K and V: layers x batch x heads x context x head_dim floats each, preallocated to the context.
  EXPECT_EQ(mha, 2 * c.n_layers * B * c.n_heads * c.context * c.head_dim() * 4);
  EXPECT_EQ(2 * cem, mha);
}

}  // namespace
}  // namespace cemfrac

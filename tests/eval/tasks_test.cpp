// Zero-shot task scoring (eval/tasks.h): log-likelihoods, spans and metrics checked by hand on a
// bigram "model" whose probabilities are known exactly, and batching checked on every model kind.
#include "cemfrac/eval/tasks.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/eval/metrics.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

// Letters a..g are ids 1..7, the end-of-text is 0; a space is merged into the letter after it
// (" b" is one token), so a text has fewer tokens than bytes and the two lengths differ by the
// number of spaces: what acc_norm's length normalisation must see. Bytes of non-ASCII characters
// (UTF-8 continuation or lead bytes) are skipped like spaces: a text's characters, bytes and
// tokens all differ.
class LetterTokenizer : public Tokenizer {
 public:
  std::string id() const override { return "letters"; }
  int64_t vocab_size() const override { return 8; }
  TokenId eot_id() const override { return 0; }
  std::vector<TokenId> encode(std::string_view text) const override {
    std::vector<TokenId> ids;
    for (char c : text) {
      if (c == ' ' || static_cast<unsigned char>(c) >= 0x80) continue;  // no token of its own
      CEMFRAC_CHECK(c >= 'a' && c <= 'g', "letters: '{}' is not a..g", c);
      ids.push_back(c - 'a' + 1);
    }
    return ids;
  }
  std::string decode(const std::vector<TokenId>& ids) const override {
    std::string s;
    for (TokenId i : ids) s += static_cast<char>('a' + i - 1);
    return s;
  }
  void save(const std::string&) const override {}
};

// After token x the next token is x + 1 (mod 8) with probability 3/10, any other with 1/10: logit
// ln 3 on the successor, 0 on the other seven. So a target that follows its predecessor adds
// ln 0.3, any other target ln 0.1.
torch::Tensor successor_logits(const torch::Tensor& x) {
  auto out = torch::zeros({x.size(0), x.size(1), 8});
  out.scatter_(2, ((x + 1) % 8).unsqueeze(2), std::log(3.0));
  return out;
}
const double kHit = std::log(0.3), kMiss = std::log(0.1);

TaskOptions options(int64_t context, int64_t batch) {
  TaskOptions o;
  o.context = context;
  o.batch = batch;
  return o;
}

TEST(Tasks, ContinuationSpanIsExactlyTheTargetTokens) {
  LetterTokenizer tok;
  // "a b" + " c": tokens eot a b c; only c is scored, predicted from b (a successor: a hit).
  ScoreRequest q = loglikelihood_request(tok, "a b", " c");
  EXPECT_EQ(q.tokens, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(q.score_from, 3);
  // The context's trailing space moves to the continuation: the same request.
  ScoreRequest moved = loglikelihood_request(tok, "a b ", "c");
  EXPECT_EQ(moved.tokens, q.tokens);
  EXPECT_EQ(moved.score_from, q.score_from);

  ScoreOptions so;
  so.context = 8;
  auto r = score_requests(successor_logits,
                          {q, loglikelihood_request(tok, "a b", " e d"),
                           loglikelihood_request(tok, "a b", " c d e")},
                          so);
  // One position too early would add b | a (another ln 0.3); one too late would score c | c.
  EXPECT_NEAR(r[0].loglik, kHit, 1e-6);
  EXPECT_EQ(r[0].tokens, 1);
  EXPECT_TRUE(r[0].greedy);
  EXPECT_NEAR(r[1].loglik, kMiss + kMiss, 1e-6);  // e | b, d | e
  EXPECT_FALSE(r[1].greedy);
  EXPECT_NEAR(r[2].loglik, 3 * kHit, 1e-6);
  EXPECT_TRUE(r[2].greedy);
}

ScoreRequest q_short(const Tokenizer& tok) {
  return loglikelihood_request(tok, "c", " d");
}

TEST(Tasks, LongContextsAreCutFromTheLeft) {
  LetterTokenizer tok;
  ScoreOptions so;
  so.context = 2;  // two inputs: "... f" predicting g is all that fits
  auto r = score_requests(successor_logits, {loglikelihood_request(tok, "a b c d e f", " g")}, so);
  EXPECT_NEAR(r[0].loglik, kHit, 1e-6);
  // Targets beyond the context are scored in pieces, each target once with the history that fits:
  // context 1 sees only the previous token, exactly what the successor model needs.
  for (int64_t context : {1, 2, 3}) {
    so.context = context;
    auto long_cont = score_requests(
        successor_logits, {loglikelihood_request(tok, "a", " b c e f g"), q_short(tok)}, so);
    EXPECT_NEAR(long_cont[0].loglik, 2 * kHit + kMiss + 2 * kHit, 1e-6) << context;
    EXPECT_EQ(long_cont[0].tokens, 5);
    EXPECT_FALSE(long_cont[0].greedy);
    EXPECT_NEAR(long_cont[1].loglik, kHit, 1e-6);
  }
}

// acc_norm divides by characters (the harness's len(choice)), acc_bytes by UTF-8 bytes: after "a",
// P = " eçç" (one miss: ln .1 = -2.303; 4 characters -> -0.576, 6 bytes -> -0.384) and Q = " b "
// (one hit: ln .3 = -1.204; 3 characters = 3 bytes -> -0.401). acc picks Q, acc_norm Q, acc_bytes
// P.
TEST(Tasks, MultipleChoiceAccNormDividesByCharactersAccBytesByBytes) {
  LetterTokenizer tok;
  TaskSet set;
  set.name = "planted";
  set.type = RequestType::kMultipleChoice;
  set.choice.push_back({"a", {" e\u00e7\u00e7", " b "}, 1});
  ASSERT_EQ(set.choice[0].choices[0].size(), 6u);
  ASSERT_LT(kMiss / 4, kHit / 3);
  ASSERT_GT(kMiss / 6, kHit / 3);
  auto r = evaluate_task(set, tok, successor_logits, options(8, 2));
  EXPECT_DOUBLE_EQ(r["metrics"]["acc"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["metrics"]["acc_norm"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["metrics"]["acc_bytes"].get<double>(), 0.0);
  EXPECT_EQ(utf8_characters("\u00f1and\u00fa z\u00f6\u00eb \U0001F642"), 11);
}

TEST(Tasks, MultipleChoiceAccNormDividesByLengthNotTokens) {
  LetterTokenizer tok;
  TaskSet set;
  set.name = "planted";
  set.type = RequestType::kMultipleChoice;
  // After "a": P = " b c d e g" (four hits, a miss: ll 4 ln .3 + ln .1 = -7.119; 10 bytes -> -0.712
  // per byte, 5 tokens -> -1.424 per token); Q = " bc" (two hits: -2.408; 3 bytes -> -0.803,
  // 2 tokens -> -1.204). acc picks Q, acc_norm by bytes picks P, by tokens it would pick Q.
  set.choice.push_back({"a", {" b c d e g", " bc"}, 0});
  // A second example where every rule picks the gold choice: acc 1/2, acc_norm 2/2.
  set.choice.push_back({"a", {" e", " b"}, 1});
  const double p = 4 * kHit + kMiss, q = 2 * kHit;
  ASSERT_LT(p, q);
  ASSERT_GT(p / 10, q / 3);
  ASSERT_LT(p / 5, q / 2);
  auto r = evaluate_task(set, tok, successor_logits, options(8, 3));
  EXPECT_DOUBLE_EQ(r["metrics"]["acc"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(r["metrics"]["acc_norm"].get<double>(), 1.0);
  // stderr of a 0/1 sample {0, 1}: sample sd sqrt(1/2) over sqrt(2) = 1/2.
  EXPECT_DOUBLE_EQ(r["metrics"]["acc_stderr"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(r["metrics"]["acc_norm_stderr"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(r["metrics"]["chance"].get<double>(), 0.5);
  EXPECT_EQ(r["requests"].get<int64_t>(), 4);
}

TEST(Tasks, ClozeAccuracyAndPerplexity) {
  LetterTokenizer tok;
  TaskSet set;
  set.type = RequestType::kCloze;
  set.cloze = {{"a b", " c"}, {"a b", " e"}, {"c", " d e"}};
  auto r = evaluate_task(set, tok, successor_logits, options(8, 2));
  const auto& m = r["metrics"];
  EXPECT_NEAR(m["acc"].get<double>(), 2.0 / 3, 1e-12);
  const double sum = kHit + kMiss + 2 * kHit;
  EXPECT_NEAR(m["mean_loglik"].get<double>(), sum / 3, 1e-6);
  EXPECT_NEAR(m["perplexity"].get<double>(), std::exp(-sum / 3), 1e-5);
  EXPECT_NEAR(m["token_perplexity"].get<double>(), std::exp(-sum / 4), 1e-5);
  EXPECT_EQ(m["target_tokens"].get<int64_t>(), 4);
}

TEST(Tasks, RollingScoresEveryTokenOnceInHarnessUnits) {
  LetterTokenizer tok;
  TaskSet set;
  set.type = RequestType::kRolling;
  // "ab cd": eot a b c d, four targets, all successors: ll = 4 ln 0.3; 2 words, 5 bytes.
  // "ag": a | eot is a hit, g | a a miss; 1 word, 2 bytes.
  set.rolling = {{"ab cd"}, {"ag"}};
  const double ll = 5 * kHit + kMiss;
  for (int64_t context : {1, 2, 3, 8}) {
    SCOPED_TRACE(context);
    auto r = evaluate_task(set, tok, successor_logits, options(context, 2));
    const auto& m = r["metrics"];
    EXPECT_EQ(m["tokens"].get<int64_t>(), 6);
    EXPECT_EQ(m["words"].get<int64_t>(), 3);
    EXPECT_EQ(m["bytes"].get<int64_t>(), 7);
    EXPECT_NEAR(m["word_perplexity"].get<double>(), std::exp(-ll / 3), 1e-5);
    EXPECT_NEAR(m["byte_perplexity"].get<double>(), std::exp(-ll / 7), 1e-6);
    EXPECT_NEAR(m["bits_per_byte"].get<double>(), -ll / 7 / std::log(2.0), 1e-6);
    EXPECT_NEAR(m["token_perplexity"].get<double>(), std::exp(-ll / 6), 1e-5);
  }
}

TEST(Tasks, HarnessWordCount) {
  EXPECT_EQ(harness_word_count("a b  c"), 3);
  EXPECT_EQ(harness_word_count(" a b\n"), 4);  // re.split gives '' at both ends
  EXPECT_EQ(harness_word_count("word"), 1);
}

// Scores must not depend on how requests are batched and padded: padding sits after every scored
// position, which a causal model never lets an earlier position see. Checked on every model kind
// the suites train.
TEST(Tasks, BatchingDoesNotChangeScoresOnEveryModelKind) {
  struct Kind {
    const char* name;
    std::string mixer, ffn;
    bool gpt2;
  };
  const std::vector<Kind> kinds = {{"gpt2", "mha", "gelu_mlp", true},
                                   {"llama", "mha", "swiglu", false},
                                   {"cofrgenet_f", "mha", "cffn", true},
                                   {"cofrgenet", "cattn_m", "cffn", true},
                                   {"cem_both", "cem_attention", "cem_mlp", false}};
  auto tok = make_tokenizer("byte");
  std::vector<ScoreRequest> requests = {
      loglikelihood_request(*tok, "The cat sat on the", " mat"),
      loglikelihood_request(*tok, "A", " longer continuation here"),
      loglikelihood_request(*tok, "Some much longer context than the others", "!"),
      loglikelihood_request(*tok, "x", " y")};
  for (const Kind& k : kinds) {
    SCOPED_TRACE(k.name);
    ModelConfig c = test::tiny_model(tok->vocab_size(), 24, 64);
    if (k.gpt2) c = test::gpt2_flavour(c);
    c.mixer = k.mixer;
    c.ffn = k.ffn;
    torch::manual_seed(1);
    LmModel model(c);
    model->eval();
    LogitsFn fn = [model](const torch::Tensor& x) mutable { return model->forward(x); };
    ScoreOptions one, all;
    one.context = all.context = c.context;
    one.batch = 1;
    all.batch = 4;
    const auto a = score_requests(fn, requests, one);
    const auto b = score_requests(fn, requests, all);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_NEAR(a[i].loglik, b[i].loglik, 1e-4 * std::abs(a[i].loglik)) << "request " << i;
      EXPECT_EQ(a[i].tokens, b[i].tokens);
      EXPECT_LT(a[i].loglik, 0);
    }
  }
}

}  // namespace
}  // namespace cemfrac

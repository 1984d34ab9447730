// The fast mixer/FFN/norm layers against straightforward references written from the formulas:
// loops over batch, heads and positions, an explicit softmax, RoPE from cos/sin of p *
// theta^(-2i/d_h), all in float64.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <vector>

#include "cemfrac/layers/base/gelu_mlp.h"
#include "cemfrac/layers/base/layer_norm.h"
#include "cemfrac/layers/base/mha.h"
#include "cemfrac/layers/base/rms_norm.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/base/swiglu.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// Rotate one head vector (d_h) at position p, half-split layout.
std::vector<double> rope_reference(const std::vector<double>& x, int64_t p, double theta) {
  const size_t d = x.size(), half = d / 2;
  std::vector<double> y(d);
  for (size_t i = 0; i < half; ++i) {
    const double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(d));
    y[i] = x[i] * std::cos(angle) - x[i + half] * std::sin(angle);
    y[i + half] = x[i + half] * std::cos(angle) + x[i] * std::sin(angle);
  }
  return y;
}

// Causal attention of the module's parameters, element by element. x (B, N, D) float64.
torch::Tensor attention_reference(MhaImpl& mha, const torch::Tensor& x, double theta) {
  const auto& o = mha.options();
  const int64_t B = x.size(0), N = x.size(1), D = o.d_model(), H = o.n_heads();
  const int64_t H_kv = o.n_kv_heads() > 0 ? o.n_kv_heads() : H, d_h = D / H;
  auto w_qkv = mha.w_qkv.accessor<double, 2>();
  auto w_o = mha.w_o.accessor<double, 2>();
  auto xa = x.accessor<double, 3>();
  // Row r of the projection applied to x[b, n].
  auto project = [&](int64_t b, int64_t n, int64_t row) {
    double s = o.bias() ? mha.b_qkv[row].item<double>() : 0.0;
    for (int64_t c = 0; c < D; ++c) s += w_qkv[row][c] * xa[b][n][c];
    return s;
  };
  auto head_vector = [&](int64_t b, int64_t n, int64_t first_row) {
    std::vector<double> v(d_h);
    for (int64_t i = 0; i < d_h; ++i) v[i] = project(b, n, first_row + i);
    return v;
  };
  torch::Tensor out = torch::zeros({B, N, D}, kF64);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> concat(H * d_h, 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kv = h / (H / H_kv);  // the key/value head serving query head h
        std::vector<double> q = head_vector(b, n, h * d_h);
        if (o.rope()) q = rope_reference(q, n, theta);
        std::vector<double> scores;
        for (int64_t t = 0; t <= n; ++t) {
          std::vector<double> k = head_vector(b, t, H * d_h + kv * d_h);
          if (o.rope()) k = rope_reference(k, t, theta);
          double s = 0;
          for (int64_t i = 0; i < d_h; ++i) s += q[i] * k[i];
          scores.push_back(s / std::sqrt(double(d_h)));
        }
        double max_score = scores[0], total = 0;
        for (double s : scores) max_score = std::max(max_score, s);
        for (double& s : scores) total += (s = std::exp(s - max_score));
        for (int64_t t = 0; t <= n; ++t) {
          std::vector<double> v = head_vector(b, t, (H + H_kv) * d_h + kv * d_h);
          for (int64_t i = 0; i < d_h; ++i) concat[h * d_h + i] += scores[t] / total * v[i];
        }
      }
      for (int64_t r = 0; r < D; ++r) {
        double s = o.bias() ? mha.b_o[r].item<double>() : 0.0;
        for (int64_t c = 0; c < H * d_h; ++c) s += w_o[r][c] * concat[c];
        out[b][n][r] = s;
      }
    }
  }
  return out;
}

struct Flavour {
  const char* name;
  bool bias;
  bool rope;
  int64_t n_kv_heads;
};

void check_attention(const Flavour& f) {
  SCOPED_TRACE(f.name);
  torch::manual_seed(7);
  const double theta = 10000.0;
  const int64_t B = 2, N = 7, D = 24, H = 4, context = 16;
  MhaImpl mha(MhaOptions(D, H)
                  .n_kv_heads(f.n_kv_heads)
                  .bias(f.bias)
                  .rope(f.rope)
                  .init_std(0.3)
                  .out_init_std(0.3));
  mha.to(torch::kFloat64);
  if (f.bias) {  // non-zero biases so that they are checked too
    torch::NoGradGuard no_grad;
    mha.b_qkv.normal_(0, 0.3);
    mha.b_o.normal_(0, 0.3);
  }
  torch::Tensor x = torch::randn({B, N, D}, kF64);
  MixerContext ctx;
  RotaryEmbedding rope(D / H, context, theta);
  if (f.rope) std::tie(ctx.rope_cos, ctx.rope_sin) = rope.tables(0, N, kF64);
  torch::Tensor fast = mha.forward(x, ctx);
  torch::Tensor slow = attention_reference(mha, x, theta);
  ASSERT_EQ(fast.sizes(), slow.sizes());
  EXPECT_TRUE(torch::allclose(fast, slow, 1e-12, 1e-12))
      << "max abs error " << (fast - slow).abs().max().item<double>();
}

TEST(Attention, Gpt2FlavourEqualsReference) {
  check_attention({"gpt2", true, false, 0});
}
TEST(Attention, LlamaFlavourEqualsReference) {
  check_attention({"llama", false, true, 0});
}
TEST(Attention, GroupedQueryEqualsReference) {
  check_attention({"gqa", false, true, 2});
}
TEST(Attention, MultiQueryEqualsReference) {
  check_attention({"mqa", false, true, 1});
}

// The reference itself must notice a wrong answer: perturb one output weight and the results
// differ.
TEST(Attention, ReferenceDetectsAChange) {
  torch::manual_seed(3);
  MhaImpl mha(MhaOptions(8, 2).rope(true).init_std(0.3));
  mha.to(torch::kFloat64);
  torch::Tensor x = torch::randn({1, 4, 8}, kF64);
  MixerContext ctx;
  RotaryEmbedding rope(4, 8, 10000.0);
  std::tie(ctx.rope_cos, ctx.rope_sin) = rope.tables(0, 4, kF64);
  torch::Tensor fast = mha.forward(x, ctx);
  {
    torch::NoGradGuard no_grad;
    mha.w_o[0][0] += 0.5;
  }
  EXPECT_FALSE(torch::allclose(fast, attention_reference(mha, x, 10000.0), 1e-9, 1e-9));
}

// Decoding in pieces through the state equals one pass over the whole sequence.
TEST(Attention, StateContinuesTheSequence) {
  torch::manual_seed(11);
  const int64_t D = 16, H = 4, N = 9;
  MhaImpl mha(MhaOptions(D, H).n_kv_heads(2).rope(true).init_std(0.3));
  mha.to(torch::kFloat64);
  RotaryEmbedding rope(D / H, 32, 10000.0);
  torch::Tensor x = torch::randn({3, N, D}, kF64);
  MixerContext full;
  std::tie(full.rope_cos, full.rope_sin) = rope.tables(0, N, kF64);
  torch::Tensor expected = mha.forward(x, full);
  auto state = mha.new_state();
  std::vector<torch::Tensor> pieces;
  for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 4}, {4, 1}, {5, 3}, {8, 1}}) {
    MixerContext ctx;
    ctx.offset = start;
    ctx.state = state.get();
    std::tie(ctx.rope_cos, ctx.rope_sin) = rope.tables(start, len, kF64);
    pieces.push_back(mha.forward(x.narrow(1, start, len), ctx));
  }
  EXPECT_TRUE(torch::allclose(torch::cat(pieces, 1), expected, 1e-12, 1e-12));
  EXPECT_EQ(static_cast<MhaState*>(state.get())->k.size(), N);
}

TEST(Norms, RmsNormEqualsFormula) {
  RmsNormImpl norm(6, 1e-5, torch::kCPU);
  norm.to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    norm.weight.normal_();
  }
  torch::Tensor x = torch::randn({2, 3, 6}, kF64);
  torch::Tensor expected = torch::zeros_like(x);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t n = 0; n < 3; ++n) {
      double ms = 0;
      for (int64_t i = 0; i < 6; ++i) ms += std::pow(x[b][n][i].item<double>(), 2) / 6;
      for (int64_t i = 0; i < 6; ++i) {
        expected[b][n][i] =
            x[b][n][i].item<double>() / std::sqrt(ms + 1e-5) * norm.weight[i].item<double>();
      }
    }
  }
  EXPECT_TRUE(torch::allclose(norm.forward(x), expected, 1e-12, 1e-12));
}

TEST(Norms, LayerNormEqualsFormulaWithAndWithoutBias) {
  for (bool bias : {true, false}) {
    LayerNormImpl norm(5, 1e-5, bias, torch::kCPU);
    norm.to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      norm.weight.normal_();
      if (bias) norm.bias.normal_();
    }
    EXPECT_EQ(norm.bias.defined(), bias);
    torch::Tensor x = torch::randn({4, 5}, kF64);
    torch::Tensor mean = x.mean(-1, true), var = (x - mean).square().mean(-1, true);
    torch::Tensor expected = (x - mean) / torch::sqrt(var + 1e-5) * norm.weight;
    if (bias) expected = expected + norm.bias;
    EXPECT_TRUE(torch::allclose(norm.forward(x), expected, 1e-12, 1e-12));
  }
}

// Llama 3.2's published scaling (factor 32, low/high 1/4, original context 8192) at d_h = 128,
// theta = 500000: frequency 0 (wavelength 2 pi) is kept, frequency 63 (wavelength ~2.6e6) is
// divided by 32, and frequency 33 (wavelength ~5.45e3, between 8192 / 4 and 8192 / 1) is
// interpolated.
TEST(Rope, Llama3ScalingKeepsShortStretchesLongAndBlendsBetween) {
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = 32;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_context = 8192;
  const std::vector<double> plain = rope_frequencies(128, 500000.0);
  const std::vector<double> scaled = rope_frequencies(128, 500000.0, s);
  ASSERT_EQ(plain.size(), 64u);
  ASSERT_EQ(scaled.size(), 64u);
  EXPECT_DOUBLE_EQ(plain[0], 1.0);
  EXPECT_DOUBLE_EQ(plain[33], std::pow(500000.0, -66.0 / 128.0));
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_DOUBLE_EQ(scaled[63], plain[63] / 32);
  const double wavelength = 2 * M_PI / plain[33];
  ASSERT_GT(wavelength, 2048.0);
  ASSERT_LT(wavelength, 8192.0);
  const double blend = (8192.0 / wavelength - 1.0) / 3.0;
  EXPECT_DOUBLE_EQ(scaled[33], (1 - blend) * plain[33] / 32 + blend * plain[33]);
  int kept = 0, divided = 0;
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_LE(scaled[i], plain[i]);
    EXPECT_GE(scaled[i], plain[i] / 32 * (1 - 1e-15));
    kept += scaled[i] == plain[i];
    divided += scaled[i] == plain[i] / 32;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_LT(kept + divided, 64) << "some frequencies lie in the blended band";
  // The tables of a RotaryEmbedding use the scaled frequencies: angle(p, i) = p * w_i.
  RotaryEmbedding rope(128, 16, 500000.0, s);
  auto [cos, sin] = rope.tables(0, 16, kF64);
  EXPECT_NEAR(cos[10][63].item<double>(), std::cos(10 * scaled[63]), 1e-15);
  EXPECT_NEAR(sin[10][33].item<double>(), std::sin(10 * scaled[33]), 1e-15);
}

TEST(Ffn, SwiGluEqualsFormula) {
  SwiGluImpl ffn(FfnOptions(6, 10));
  ffn.to(torch::kFloat64);
  torch::Tensor x = torch::randn({2, 3, 6}, kF64);
  torch::Tensor a = torch::matmul(x, ffn.w_gate.t()), u = torch::matmul(x, ffn.w_up.t());
  torch::Tensor expected = torch::matmul(a / (1 + torch::exp(-a)) * u, ffn.w_down.t());
  EXPECT_TRUE(torch::allclose(ffn.forward(x), expected, 1e-12, 1e-12));
  EXPECT_EQ(ffn.named_parameters().size(), 3u);  // no biases
}

TEST(Ffn, SwiGluWithBiasesEqualsFormula) {
  SwiGluImpl ffn(FfnOptions(6, 10).bias(true));
  ffn.to(torch::kFloat64);
  ASSERT_EQ(ffn.named_parameters().size(), 6u);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : ffn.parameters()) p.normal_();  // biases start at 0: make them matter
  }
  torch::Tensor x = torch::randn({2, 3, 6}, kF64);
  torch::Tensor a = torch::matmul(x, ffn.w_gate.t()) + ffn.b_gate;
  torch::Tensor u = torch::matmul(x, ffn.w_up.t()) + ffn.b_up;
  torch::Tensor expected = torch::matmul(a / (1 + torch::exp(-a)) * u, ffn.w_down.t()) + ffn.b_down;
  EXPECT_TRUE(torch::allclose(ffn.forward(x), expected, 1e-12, 1e-12));
}

TEST(Ffn, GeluMlpEqualsFormula) {
  GeluMlpImpl ffn(FfnOptions(6, 10).bias(true));
  ffn.to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    ffn.b_fc.normal_();
    ffn.b_proj.normal_();
  }
  torch::Tensor x = torch::randn({2, 3, 6}, kF64);
  torch::Tensor h = torch::matmul(x, ffn.w_fc.t()) + ffn.b_fc;
  // GELU, tanh approximation: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))).
  torch::Tensor g = 0.5 * h * (1 + torch::tanh(std::sqrt(2.0 / M_PI) * (h + 0.044715 * h.pow(3))));
  torch::Tensor expected = torch::matmul(g, ffn.w_proj.t()) + ffn.b_proj;
  EXPECT_TRUE(torch::allclose(ffn.forward(x), expected, 1e-12, 1e-12));
}

}  // namespace
}  // namespace cemfrac

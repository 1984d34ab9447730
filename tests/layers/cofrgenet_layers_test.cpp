// The CoFrGeNet layers (cffn, cattn_u, cattn_m) and the paper's baselines (synthesizer_dense,
// sparse_attention) against slow references written from the formulas of CoFrGeNet spec §3
// (loops, literal nested fractions, float64), plus spec §8 properties 11-17: parameter counts,
// shapes, causality (bitwise), CAttnM attention rows, the CAttnU mask after optimizer steps, Cffn
// degenerations, pole hits at initialisation, and decoding through the state.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/cofrgenet/cattn_m.h"
#include "cemfrac/layers/cofrgenet/cattn_u.h"
#include "cemfrac/layers/cofrgenet/cffn.h"
#include "cemfrac/layers/cofrgenet/sparse_attention.h"
#include "cemfrac/layers/cofrgenet/synthesizer_dense.h"
#include "cemfrac/ops/continuant.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// 1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)), unguarded.
double literal_fraction(const std::vector<double>& a) {
  double t = 1.0 / a.back();
  for (int64_t k = static_cast<int64_t>(a.size()) - 2; k >= 0; --k) t = 1.0 / (a[k] + t);
  return t;
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

int64_t numel_of(const torch::nn::Module& m, const std::function<bool(const std::string&)>& pick) {
  int64_t n = 0;
  for (const auto& item : m.named_parameters())
    if (pick(item.key())) n += item.value().numel();
  return n;
}

bool is_bias(const std::string& name) {
  return name.rfind("b_", 0) == 0;
}

// Layer-normalised Gaussian rows (B, N, p): what a block feeds its sub-layers.
torch::Tensor normalised_input(int64_t B, int64_t N, int64_t p,
                               torch::Dtype dtype = torch::kFloat32) {
  torch::Tensor x = torch::randn({B, N, p}, torch::TensorOptions().dtype(dtype));
  return torch::layer_norm(x, {p});
}

// Fraction of ladders of a (.., d, L) whose |K_d| is inside the pole guard.
double pole_hit_fraction(const torch::Tensor& a, double eps) {
  const torch::Tensor tails = continuant_tails_reference(a.detach());
  const torch::Tensor k_d = tails.select(-2, a.size(-2));
  return k_d.abs().lt(eps).to(torch::kFloat64).mean().item<double>();
}

// ---------------------------------------------------------------- cffn

CffnOptions cffn_options(int64_t p, int64_t L, int64_t d) {
  return CffnOptions(p, L, d).init_std(0.3).out_init_std(0.3);
}

TEST(Cffn, ParameterCountIsExact) {
  for (int64_t p : {8, 12}) {
    for (int64_t L : {1, 3}) {
      for (int64_t d : {1, 2, 5}) {
        for (int variant = 0; variant < 4; ++variant) {
          CffnOptions o = cffn_options(p, L, d);
          if (variant == 1) o.glu(true);
          if (variant == 2) o.univariate(true);
          if (variant == 3) o.direct_raw(true).gate(CffnGate::kSilu);
          CffnImpl f(o);
          EXPECT_EQ(numel_of(f, [](const std::string& n) { return !is_bias(n); }),
                    L * p * (d + 1) + 2 * p * p)
              << "p " << p << " L " << L << " d " << d << " variant " << variant;
          EXPECT_EQ(numel_of(f, is_bias), variant == 2 ? L * d * p : L * d);
          EXPECT_EQ(f.w_ladder.size(), static_cast<size_t>(d)) << "one tensor per depth";
        }
      }
    }
  }
  CffnImpl no_bias(cffn_options(8, 3, 5).bias(false));
  EXPECT_EQ(numel_of(no_bias, is_bias), 0);
}

// y = U x̂ + V z from the formulas, element by element (float64 module and input).
torch::Tensor cffn_reference(const CffnImpl& f, const torch::Tensor& x) {
  const auto& o = f.options();
  const int64_t p = o.d_model(), L = o.ladders(), d = o.depth();
  const torch::Tensor rows = x.reshape({-1, p});
  const int64_t R = rows.size(0);
  auto xa = rows.accessor<double, 2>();
  auto G = f.w_gate.accessor<double, 2>();
  auto V = f.w_out.accessor<double, 2>();
  torch::Tensor out = torch::zeros({R, p}, kF64);
  auto ya = out.accessor<double, 2>();
  for (int64_t r = 0; r < R; ++r) {
    std::vector<double> xh(p);
    for (int64_t i = 0; i < p; ++i) {
      double g = 0;
      for (int64_t c = 0; c < p; ++c) g += G[i][c] * xa[r][c];
      const double act = o.gate() == CffnGate::kSilu ? g * sigmoid(g) : sigmoid(g);
      if (o.glu()) {
        double up = 0;
        for (int64_t c = 0; c < p; ++c) up += f.w_up[i][c].item<double>() * xa[r][c];
        xh[i] = act * up;
      } else {
        xh[i] = xa[r][i] * act;
      }
    }
    if (!o.univariate()) {
      for (int64_t j = 0; j < L; ++j) {
        std::vector<double> a(d);
        for (int64_t k = 0; k < d; ++k) {
          auto W = f.w_ladder[k].accessor<double, 2>();
          a[k] = o.bias() ? f.b_ladder[k][j].item<double>() : 0.0;
          for (int64_t i = 0; i < p; ++i) a[k] += W[j][i] * xh[i];
        }
        const double z = literal_fraction(a);
        for (int64_t q = 0; q < p; ++q) ya[r][q] += V[q][j] * z;
      }
    } else {
      for (int64_t j = 0; j < L; ++j) {
        for (int64_t i = 0; i < p; ++i) {
          std::vector<double> a(d);
          for (int64_t k = 0; k < d; ++k)
            a[k] = f.w_ladder[k][j][i].item<double>() * xh[i] +
                   (o.bias() ? f.b_ladder[k][j][i].item<double>() : 0.0);
          ya[r][i] += V[i][j] * literal_fraction(a);
        }
      }
    }
    if (!o.glu()) {
      auto U = f.w_direct.accessor<double, 2>();
      for (int64_t q = 0; q < p; ++q)
        for (int64_t i = 0; i < p; ++i) ya[r][q] += U[q][i] * (o.direct_raw() ? xa[r][i] : xh[i]);
    }
  }
  return out.view(x.sizes());
}

TEST(Cffn, MatchesFormulaReferenceFloat64) {
  for (int variant = 0; variant < 6; ++variant) {
    torch::manual_seed(10 + variant);
    CffnOptions o = cffn_options(6, 3, variant % 2 ? 4 : 5);
    if (variant == 1) o.gate(CffnGate::kSilu);
    if (variant == 2) o.glu(true);
    if (variant == 3) o.direct_raw(true);
    if (variant == 4) o.univariate(true);
    if (variant == 5)
      o.ladder(LadderOptions().continuant(ContinuantOptions().impl(ContinuantImpl::kLiteral)));
    CffnImpl f(o);
    f.to(torch::kFloat64);
    const torch::Tensor x = normalised_input(2, 5, 6, torch::kFloat64);
    const torch::Tensor y = f.forward(x);
    ASSERT_EQ(y.sizes(), x.sizes());
    EXPECT_TRUE(torch::allclose(y, cffn_reference(f, x), 1e-12, 1e-12)) << "variant " << variant;
  }
}

TEST(Cffn, GradientsMatchCentralDifferencesFloat64) {
  torch::manual_seed(3);
  CffnImpl f(cffn_options(5, 2, 3));
  f.to(torch::kFloat64);
  const torch::Tensor x = normalised_input(1, 4, 5, torch::kFloat64).requires_grad_(true);
  const torch::Tensor probe = torch::randn({1, 4, 5}, kF64);
  auto loss = [&] { return (f.forward(x) * probe).sum(); };
  loss().backward();
  std::vector<torch::Tensor> checked = {
      x, f.w_gate, f.w_direct, f.w_out, f.w_ladder[0], f.w_ladder[2], f.b_ladder[1]};
  const double h = 1e-6;
  for (torch::Tensor& t : checked) {
    const torch::Tensor g = t.grad().clone();
    auto flat = t.detach().view({-1});
    for (int64_t i = 0; i < std::min<int64_t>(flat.numel(), 6); ++i) {
      const double old = flat[i].item<double>();
      double plus, minus;
      {
        torch::NoGradGuard ng;
        flat[i] = old + h;
        plus = loss().item<double>();
        flat[i] = old - h;
        minus = loss().item<double>();
        flat[i] = old;
      }
      const double fd = (plus - minus) / (2 * h);
      EXPECT_NEAR(g.view({-1})[i].item<double>(), fd, 1e-6 * std::max(1.0, std::abs(fd)));
    }
  }
}

// Property 16: with V = 0 the layer is U x̂; with the gate saturated open (σ ≡ 1 exactly) x̂ = x.
TEST(Cffn, Degenerations) {
  torch::manual_seed(4);
  const int64_t p = 8;
  CffnImpl f(cffn_options(p, 3, 5));
  const torch::Tensor x = normalised_input(2, 6, p);
  {
    torch::NoGradGuard ng;
    f.w_out.zero_();
    const torch::Tensor x_hat = f.gated(x);
    EXPECT_TRUE(torch::equal(f.forward(x), torch::linear(x_hat, f.w_direct)));
  }
  {
    torch::NoGradGuard ng;
    f.w_gate.copy_(torch::eye(p) * 1000.0);
    const torch::Tensor positive = x.abs() + 0.1;  // G x = 1000 x >= 100: sigmoid rounds to 1
    EXPECT_TRUE(torch::equal(f.gated(positive), positive));
    f.w_out.normal_(0, 0.3);
    const torch::Tensor a = f.ladder_inputs(positive);
    const torch::Tensor expected =
        torch::linear(positive, f.w_direct) + torch::linear(continuant(a), f.w_out);
    EXPECT_TRUE(torch::allclose(f.forward(positive), expected, 1e-6, 1e-6));
  }
}

// Property 17: fewer than 0.1 % of the p-variate ladder evaluations start inside the pole guard,
// for odd and even depths (and the hazard of spec §2.8 is real: no biases, odd d).
TEST(Cffn, PoleHitsAtInitialisationBelowOneInAThousand) {
  const int64_t p = 64;
  const torch::Tensor x = normalised_input(8, 64, p);
  for (int64_t d = 1; d <= 7; ++d) {
    torch::manual_seed(d);
    CffnImpl f(CffnOptions(p, 16, d));
    torch::NoGradGuard ng;
    const double hits = pole_hit_fraction(f.ladder_inputs(f.gated(x)), 0.01);
    EXPECT_LT(hits, 1e-3) << "d = " << d;
  }
  torch::manual_seed(1);
  CffnImpl hazard(CffnOptions(p, 16, 5).bias(false));
  torch::NoGradGuard ng;
  EXPECT_GT(pole_hit_fraction(hazard.ladder_inputs(hazard.gated(x)), 0.01), 0.05)
      << "odd depth without biases starts on the pole (spec §2.8)";
}

TEST(Cffn, LiteralAndFusedAgreeWhenNoGuardIsActive) {
  torch::manual_seed(5);
  CffnImpl fused(CffnOptions(16, 3, 5));
  torch::manual_seed(5);
  CffnImpl literal(CffnOptions(16, 3, 5).ladder(
      LadderOptions().continuant(ContinuantOptions().impl(ContinuantImpl::kLiteral))));
  const torch::Tensor x = normalised_input(2, 8, 16);
  EXPECT_TRUE(torch::allclose(fused.forward(x), literal.forward(x), 1e-5, 1e-6));
}

// Dyadic stages with `truncate`: stage m evaluates a_1..a_m (stage 0: no fraction); without it
// every stage evaluates all depths. Recording starts with the trainer's first call.
TEST(LadderRuntime, TruncateEvaluatesTheActiveDepthsOnly) {
  torch::manual_seed(13);
  const torch::Tensor a = torch::rand({5, 3, 4}) + 0.5;  // (rows, d = 3, L = 4)
  torch::Tensor lo = initial_range_min({4}, torch::kCPU), hi = initial_range_max({4}, torch::kCPU);
  LadderRuntime truncating(LadderOptions().truncate(true), 3);
  LadderRuntime keeping(LadderOptions(), 3);
  const int64_t t = 16;  // starts 8, 12, 14
  const std::vector<std::pair<int64_t, int64_t>> stages = {
      {0, 0}, {7, 0}, {8, 1}, {12, 2}, {15, 3}};
  for (const auto& [step, m] : stages) {
    TrainProgress progress;
    progress.step = step;
    progress.total_steps = t;
    truncating.on_train_step(progress, lo, hi);
    keeping.on_train_step(progress, lo, hi);
    EXPECT_EQ(truncating.active_depth(), m) << "step " << step;
    const torch::Tensor z = truncating.evaluate(a);
    const torch::Tensor expected = m == 0 ? torch::zeros({5, 4}) : continuant(a.narrow(1, 0, m));
    EXPECT_TRUE(torch::equal(z, expected)) << "step " << step;
    EXPECT_TRUE(torch::equal(keeping.evaluate(a), continuant(a))) << "step " << step;
    progress.dyadic = false;  // train.dyadic = false: all depths from the start
    truncating.on_train_step(progress, lo, hi);
    EXPECT_EQ(truncating.active_depth(), 3);
  }
  EXPECT_TRUE(keeping.recording());
  EXPECT_FALSE(LadderRuntime(LadderOptions(), 3).recording()) << "off outside a training run";
}

// ---------------------------------------------------------------- cattn_u

TEST(CAttnU, ParameterCountIsExact) {
  for (int64_t l : {1, 7, 16}) {
    for (int64_t d : {1, 2, 5}) {
      CAttnUImpl u(CAttnUOptions(8, l, d).bias(false));
      EXPECT_EQ(numel_of(u, [](const std::string&) { return true; }), l * (2 * d + l + 1));
      CAttnUImpl b(CAttnUOptions(8, l, d));
      EXPECT_EQ(numel_of(b, [](const std::string& n) { return !is_bias(n); }), l * (2 * d + l + 1));
      EXPECT_EQ(numel_of(b, is_bias), 2 * (d - 1) * l);
    }
  }
}

// O[b,j,c] = Z1 Z2, Z_e[b,j,c] = sum_{i<=j} T_e[j,i] Y_e[b,i,c], Y_e = w0 x + f(w_k x + b_k).
torch::Tensor cattn_u_reference(CAttnUImpl& u, const torch::Tensor& x) {
  const auto& o = u.options();
  const int64_t B = x.size(0), N = x.size(1), p = x.size(2), d = o.depth();
  auto xa = x.accessor<double, 3>();
  // Unpack the triangles by their documented layout: row j at offset j (j + 1) / 2.
  auto T = [&](int64_t e, int64_t j, int64_t i) {
    return u.t_mix[e][j * (j + 1) / 2 + i].item<double>();
  };
  std::vector<double> y(static_cast<size_t>(2 * B * N * p));
  auto Y = [&](int64_t e, int64_t b, int64_t i, int64_t c) -> double& {
    return y[static_cast<size_t>(((e * B + b) * N + i) * p + c)];
  };
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t c = 0; c < p; ++c) {
          const double v = xa[b][i][c];
          double out = u.w_pos_0[e][i].item<double>() * v;
          if (d >= 2) {
            std::vector<double> a(d - 1);
            for (int64_t k = 1; k < d; ++k)
              a[k - 1] = u.w_pos[k - 1][e][i].item<double>() * v +
                         (o.bias() ? u.b_pos[k - 1][e][i].item<double>() : 0.0);
            out += literal_fraction(a);
          }
          Y(e, b, i, c) = out;
        }
  torch::Tensor result = torch::zeros({B, N, p}, kF64);
  auto ra = result.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t c = 0; c < p; ++c) {
        double z[2] = {0, 0};
        for (int64_t e = 0; e < 2; ++e)
          for (int64_t i = 0; i <= j; ++i) z[e] += T(e, j, i) * Y(e, b, i, c);
        ra[b][j][c] = z[0] * z[1];
      }
  return result;
}

TEST(CAttnU, MatchesFormulaReferenceFloat64) {
  for (bool bias : {true, false}) {
    for (int64_t d : {1, 3, 4}) {
      torch::manual_seed(20 + d);
      CAttnUImpl u(CAttnUOptions(4, 9, d).bias(bias));
      u.to(torch::kFloat64);
      {
        torch::NoGradGuard ng;
        u.t_mix.normal_(0, 0.5);  // not just the mean
      }
      const torch::Tensor x = normalised_input(2, 7, 4, torch::kFloat64);  // n < l: leading blocks
      EXPECT_TRUE(torch::allclose(u.forward(x, {}), cattn_u_reference(u, x), 1e-10, 1e-12))
          << "bias " << bias << " d " << d;
    }
  }
}

// Property 13 for one layer: outputs at positions <= i unchanged (bitwise) when tokens > i change;
// a prefix's outputs equal the first outputs of the full-length run.
void expect_causal(MixerImpl& m, int64_t N, int64_t p) {
  torch::NoGradGuard ng;
  const torch::Tensor x = normalised_input(2, N, p);
  const torch::Tensor y = m.forward(x, {});
  ASSERT_EQ(y.sizes(), x.sizes());
  for (int64_t i = 0; i + 1 < N; i += 3) {
    torch::Tensor x2 = x.clone();
    x2.narrow(1, i + 1, N - i - 1).normal_();
    const torch::Tensor y2 = m.forward(x2, {});
    EXPECT_TRUE(torch::equal(y.narrow(1, 0, i + 1), y2.narrow(1, 0, i + 1))) << "position " << i;
    EXPECT_FALSE(torch::equal(y.narrow(1, i + 1, N - i - 1), y2.narrow(1, i + 1, N - i - 1)));
  }
  for (int64_t n : {int64_t{1}, N / 2, N - 1}) {
    const torch::Tensor yp = m.forward(x.narrow(1, 0, n), {});
    EXPECT_TRUE(torch::allclose(yp, y.narrow(1, 0, n), 1e-5, 1e-6)) << "prefix " << n;
  }
}

// Incremental decoding through the state equals the full forward.
void expect_decode_matches(MixerImpl& m, int64_t N, int64_t p) {
  torch::NoGradGuard ng;
  const torch::Tensor x = normalised_input(2, N, p);
  const torch::Tensor full = m.forward(x, {});
  std::unique_ptr<MixerState> state = m.new_state();
  std::vector<torch::Tensor> parts;
  int64_t offset = 0;
  for (int64_t len : {int64_t{3}, int64_t{1}, int64_t{1}, N - 5}) {
    MixerContext ctx;
    ctx.offset = offset;
    ctx.state = state.get();
    parts.push_back(m.forward(x.narrow(1, offset, len), ctx));
    offset += len;
  }
  EXPECT_TRUE(torch::allclose(torch::cat(parts, 1), full, 1e-5, 1e-6));
}

TEST(CAttnU, CausalAndDecodes) {
  torch::manual_seed(6);
  CAttnUImpl u(CAttnUOptions(8, 16, 5));
  expect_causal(u, 16, 8);
  expect_decode_matches(u, 16, 8);
}

TEST(CAttnU, LongerSequenceIsAClearError) {
  CAttnUImpl u(CAttnUOptions(4, 6, 3));
  const torch::Tensor x = torch::randn({1, 7, 4});
  try {
    u.forward(x, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the layer's length l = 6"), std::string::npos)
        << e.what();
  }
}

// Property 15: the coefficient from input position i to output position j is exactly 0 for i > j
// after optimizer steps (the mask is structural: only the triangle is a parameter), and no gradient
// reaches it.
TEST(CAttnU, MaskHoldsAfterOptimizerSteps) {
  torch::manual_seed(7);
  const int64_t l = 10, p = 4;
  CAttnUImpl u(CAttnUOptions(p, l, 3));
  const torch::Tensor t0 = u.t_mix.detach().clone();
  torch::optim::AdamW opt(u.parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    const torch::Tensor x = normalised_input(2, l, p);
    u.forward(x, {}).pow(2).mean().backward();
    opt.step();
  }
  const torch::Tensor t = u.mixing(l);
  EXPECT_TRUE(torch::equal(t.triu(1), torch::zeros_like(t)));
  EXPECT_FALSE(torch::equal(u.t_mix, t0)) << "the triangle itself trained";
  // Jacobian: output position j does not depend on input position i > j.
  const torch::Tensor x = normalised_input(1, l, p).requires_grad_(true);
  const torch::Tensor y = u.forward(x, {});
  for (int64_t j = 0; j < l; ++j) {
    const torch::Tensor g = torch::autograd::grad({y.select(1, j).sum()}, {x}, {}, true)[0];
    if (j + 1 < l) {
      EXPECT_TRUE(torch::equal(g.narrow(1, j + 1, l - j - 1), torch::zeros({1, l - j - 1, p})));
    }
  }
}

TEST(CAttnU, PoleHitsAtInitialisation) {
  const torch::Tensor x = normalised_input(4, 32, 16);
  for (int64_t d = 2; d <= 7; ++d) {
    torch::manual_seed(d);
    CAttnUImpl with_bias(CAttnUOptions(16, 32, d));
    torch::NoGradGuard ng;
    EXPECT_LT(pole_hit_fraction(with_bias.ladder_inputs(x, 0), 0.01), 1e-3) << "d " << d;
    if ((d - 1) % 2 == 0) {  // even number of fraction levels: no pole at x = 0 even without biases
      CAttnUImpl no_bias(CAttnUOptions(16, 32, d).bias(false));
      EXPECT_LT(pole_hit_fraction(no_bias.ladder_inputs(x, 0), 0.01), 1e-3) << "no bias, d " << d;
    }
  }
}

// ---------------------------------------------------------------- cattn_m

TEST(CAttnM, ParameterCountIsExact) {
  const int64_t p = 8, l = 12;
  for (int64_t L : {1, 3}) {
    for (int64_t d : {1, 3}) {
      CAttnMImpl m(CAttnMOptions(p, l, L, d));
      EXPECT_EQ(numel_of(m, [](const std::string& n) { return !is_bias(n); }),
                L * p * d + L * l + p * p);
      EXPECT_EQ(numel_of(m, is_bias), L * d);
      if (d == 1) {
        EXPECT_EQ(L * p * d + L * l + p * p, L * (p + l) + p * p) << "the paper's formula";
      }
      CAttnMImpl heads(CAttnMOptions(p, l, L, d).heads(2).out_proj(true));
      EXPECT_EQ(numel_of(heads, [](const std::string& n) { return !is_bias(n); }),
                L * p * d + 2 * L * l + 2 * p * p);
    }
  }
}

torch::Tensor cattn_m_reference(CAttnMImpl& m, const torch::Tensor& x) {
  const auto& o = m.options();
  const int64_t B = x.size(0), N = x.size(1), p = x.size(2), L = o.ladders(), d = o.depth(),
                H = o.heads();
  const int64_t dh = p / H;
  auto xa = x.accessor<double, 3>();
  auto F = m.w_logits.accessor<double, 3>();
  auto Wv = m.w_v.accessor<double, 2>();
  torch::Tensor out = torch::zeros({B, N, p}, kF64);
  auto oa = out.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<std::vector<double>> z(N, std::vector<double>(L)),
        v(N, std::vector<double>(p, 0.0));
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t j = 0; j < L; ++j) {
        std::vector<double> a(d);
        for (int64_t k = 0; k < d; ++k) {
          a[k] = o.bias() ? m.b_ladder[k][j].item<double>() : 0.0;
          for (int64_t c = 0; c < p; ++c) a[k] += m.w_ladder[k][j][c].item<double>() * xa[b][t][c];
        }
        z[t][j] = literal_fraction(a);
      }
      for (int64_t q = 0; q < p; ++q)
        for (int64_t c = 0; c < p; ++c) v[t][q] += Wv[q][c] * xa[b][t][c];
    }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < N; ++t) {
        std::vector<double> s(t + 1);
        double top = -1e300, total = 0;
        for (int64_t u = 0; u <= t; ++u) {
          s[u] = 0;
          for (int64_t j = 0; j < L; ++j) s[u] += z[t][j] * F[h][j][u];
          top = std::max(top, s[u]);
        }
        for (int64_t u = 0; u <= t; ++u) total += (s[u] = std::exp(s[u] - top));
        for (int64_t u = 0; u <= t; ++u)
          for (int64_t c = 0; c < dh; ++c) oa[b][t][h * dh + c] += s[u] / total * v[u][h * dh + c];
      }
  }
  if (o.out_proj()) out = torch::linear(out, m.w_o);
  return out;
}

TEST(CAttnM, MatchesFormulaReferenceFloat64) {
  for (int variant = 0; variant < 3; ++variant) {
    torch::manual_seed(30 + variant);
    CAttnMOptions o(6, 10, 3, variant == 0 ? 3 : 4);
    // Without biases only an even depth keeps the ladders off the pole guard (spec §2.8).
    if (variant == 2) o.heads(2).out_proj(true).bias(false);
    CAttnMImpl m(o);
    m.to(torch::kFloat64);
    {
      torch::NoGradGuard ng;
      m.w_logits.normal_(0, 1.0);  // sharp enough to matter
    }
    const torch::Tensor x = normalised_input(2, 8, 6, torch::kFloat64);
    const torch::Tensor ref = cattn_m_reference(m, x);
    EXPECT_TRUE(torch::allclose(m.forward(x, {}), ref, 1e-10, 1e-12))
        << variant << " max diff " << (m.forward(x, {}) - ref).abs().max().item<double>();
  }
}

// Property 14.
TEST(CAttnM, AttentionRowsAreCausalAndSumToOne) {
  torch::manual_seed(8);
  const int64_t p = 8, l = 16;
  CAttnMImpl m(CAttnMOptions(p, l, 3, 3).heads(2));
  {
    torch::NoGradGuard ng;
    m.w_logits.normal_(0, 2.0);
  }
  torch::NoGradGuard ng;
  const torch::Tensor x = normalised_input(2, 12, p);
  const torch::Tensor a = m.attention(x, 0);  // (B, H, N, N)
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 2, 12, 12}));
  EXPECT_TRUE(torch::equal(a.triu(1), torch::zeros_like(a)));
  EXPECT_LT((a.sum(-1) - 1).abs().max().item<double>(), 1e-6);
  // F = 0: O_t is the mean of X W^v over positions <= t.
  m.w_logits.zero_();
  const torch::Tensor v = torch::linear(x, m.w_v);
  const torch::Tensor counts = torch::arange(1, 13, torch::kFloat32).view({1, 12, 1});
  EXPECT_TRUE(torch::allclose(m.forward(x, {}), v.cumsum(1) / counts, 1e-5, 1e-6));
}

TEST(CAttnM, CausalAndDecodes) {
  torch::manual_seed(9);
  CAttnMImpl m(CAttnMOptions(8, 16, 3, 3).heads(2));
  {
    torch::NoGradGuard ng;
    m.w_logits.normal_(0, 1.0);
  }
  expect_causal(m, 16, 8);
  expect_decode_matches(m, 16, 8);
}

TEST(CAttnM, PoleHitsAtInitialisationBelowOneInAThousand) {
  const torch::Tensor x = normalised_input(4, 32, 32);
  for (int64_t d = 1; d <= 7; ++d) {
    torch::manual_seed(d);
    CAttnMImpl m(CAttnMOptions(32, 32, 8, d));
    torch::NoGradGuard ng;
    EXPECT_LT(pole_hit_fraction(m.ladder_inputs(x), 0.01), 1e-3) << "d " << d;
  }
}

// ---------------------------------------------------------------- baselines

TEST(SynthesizerDense, AttentionRowsCausalAndDecodes) {
  torch::manual_seed(11);
  SynthesizerDenseImpl s(SynthesizerDenseOptions(8, 16, 2).bias(true).hidden(12));
  {
    torch::NoGradGuard ng;
    s.w_2.normal_(0, 1.0);
  }
  {
    torch::NoGradGuard ng;
    const torch::Tensor a = s.attention(normalised_input(2, 10, 8), 0);
    EXPECT_TRUE(torch::equal(a.triu(1), torch::zeros_like(a)));
    EXPECT_LT((a.sum(-1) - 1).abs().max().item<double>(), 1e-6);
  }
  expect_causal(s, 16, 8);
  expect_decode_matches(s, 16, 8);
  // Parameters: W1 h p + b1 h + W2 l h + b2 H l + 2 (p^2 + p).
  EXPECT_EQ(numel_of(s, [](const std::string&) { return true; }),
            12 * 8 + 12 + 16 * 12 + 2 * 16 + 2 * (64 + 8));
}

TEST(SparseAttention, PatternsOfChildEtAl) {
  // fixed, block 4, summary 1: own block, plus the last position of every earlier block.
  EXPECT_TRUE(sparse_pattern_allows(SparsePattern::kFixed, 4, 1, 9, 8));
  EXPECT_TRUE(sparse_pattern_allows(SparsePattern::kFixed, 4, 1, 9, 3));
  EXPECT_TRUE(sparse_pattern_allows(SparsePattern::kFixed, 4, 1, 9, 7));
  EXPECT_FALSE(sparse_pattern_allows(SparsePattern::kFixed, 4, 1, 9, 2));
  EXPECT_FALSE(sparse_pattern_allows(SparsePattern::kFixed, 4, 1, 9, 10));
  // strided, stride 4: the last 4 positions and every 4th one back.
  EXPECT_TRUE(sparse_pattern_allows(SparsePattern::kStrided, 4, 1, 9, 6));
  EXPECT_TRUE(sparse_pattern_allows(SparsePattern::kStrided, 4, 1, 9, 1));
  EXPECT_FALSE(sparse_pattern_allows(SparsePattern::kStrided, 4, 1, 9, 4));
  torch::manual_seed(12);
  SparseAttentionImpl a(SparseAttentionOptions(8, 2, 16).block(4).bias(true));
  const torch::Tensor mask = a.mask();
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t s = 0; s < 16; ++s)
      EXPECT_EQ(mask[t][s].item<float>() == 0.0f,
                sparse_pattern_allows(SparsePattern::kFixed, 4, 1, t, s));
  expect_causal(a, 16, 8);
  expect_decode_matches(a, 16, 8);
  // Output at t is unchanged when a hidden earlier position changes (t = 9 does not see s = 2).
  torch::NoGradGuard ng;
  const torch::Tensor x = normalised_input(1, 16, 8);
  torch::Tensor x2 = x.clone();
  x2.select(1, 2).normal_();
  EXPECT_TRUE(torch::equal(a.forward(x, {}).select(1, 9), a.forward(x2, {}).select(1, 9)));
  EXPECT_FALSE(torch::equal(a.forward(x, {}).select(1, 3), a.forward(x2, {}).select(1, 3)));
}

}  // namespace
}  // namespace cemfrac

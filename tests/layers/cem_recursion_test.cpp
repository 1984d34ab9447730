// The recursion options of the CEM sub-layers (docs/layers/cem.md §8), float64,
// N = 6, D = 8, H = 2, d_h = 4, M = 10:
//   cem.recursion_keys = iterate  step t's keys and values from the iterates x^(t);
//   cem.prox                      + 1/2 lambda |x - h|^2 in both energies;
//   cem.step_norm = rms           the iterate rescaled to h's per-token RMS before steps 2..T.
// Causality and "decoding equals the full forward" for these options are in the contract suite
// (variants iterate_keys, iterate_keys_dlr_prox, prox_step_norm, prox, step_norm_prox_fixed); the
// chunked decode test here also checks the per-step key cache's shape.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <string>
#include <vector>

#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/cem/cem_attention.h"
#include "cemfrac/layers/cem/cem_mlp.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr int64_t kB = 2, kN = 6, kD = 8, kH = 2, kDh = 4, kM = 10, kRank = 2;

// softplus^-1(y) = y + log(1 - e^-y), without overflow for large y.
double softplus_inv(double y) {
  return y + std::log(-std::expm1(-y));
}

struct Attn {
  std::string name;
  bool rope = false;
  CemRopeMode rope_mode = CemRopeMode::kExact;
  CemDiagonal dlr = CemDiagonal::kNone;
  bool distance = false;
  bool precond = false;
  CemRecursionKeys keys = CemRecursionKeys::kFixed;
  CemProxMode prox = CemProxMode::kNone;
  bool step_norm = false;
};

// float64, O(1) random weights, eta = 0.7, lambda = 0.8 (learned).
std::shared_ptr<CemAttentionImpl> make_attn(const Attn& v, int64_t steps, double w_std = 0.6,
                                            uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto m = std::make_shared<CemAttentionImpl>(CemAttentionOptions(kD, kH)
                                                  .rope(v.rope)
                                                  .rope_mode(v.rope_mode)
                                                  .dlr(v.dlr)
                                                  .dlr_distance(v.distance)
                                                  .recursion_keys(v.keys)
                                                  .step(CemStepOptions()
                                                            .steps(steps)
                                                            .precond(v.precond)
                                                            .precond_rank(kRank)
                                                            .prox(v.prox)
                                                            .step_norm(v.step_norm)));
  m->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    if (name == "w_q" || name == "w_k") p.value().normal_(0.0, w_std);
    if (name == "delta") p.value().normal_(0.0, 0.3);
    if (name == "eta_raw") p.value().fill_(softplus_inv(0.7));
    if (name == "lambda_raw") p.value().fill_(softplus_inv(0.8));
    if (name == "precond.p") p.value().normal_(0.0, 0.5);
    if (name == "precond.u" || name == "precond.v") p.value().normal_(0.0, 0.3);
  }
  return m;
}

void set_param(torch::nn::Module& m, const std::string& name, double value) {
  torch::NoGradGuard no_grad;
  m.named_parameters()[name].fill_(value);
}

MixerContext context(bool rope, int64_t offset, int64_t n) {
  static RotaryEmbedding rotary(kDh, 64, 10000.0);
  MixerContext ctx;
  ctx.offset = offset;
  if (rope) std::tie(ctx.rope_cos, ctx.rope_sin) = rotary.tables(offset, n, kF64);
  return ctx;
}

double max_abs(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}
using test::rel_err;

std::vector<Attn> iterate_variants() {
  std::vector<Attn> v;
  v.push_back({"plain"});
  v.push_back({"rope_exact", true});
  v.push_back({"rope_naive", true, CemRopeMode::kNaive});
  v.push_back({"dlr_per_head", false, CemRopeMode::kExact, CemDiagonal::kPerHead});
  v.push_back({"distance_shared", false, CemRopeMode::kExact, CemDiagonal::kShared, true});
  v.push_back({"precond", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true});
  for (Attn& a : v) a.keys = CemRecursionKeys::kIterate;
  return v;
}

// -eta P grad_x F(x) for a scalar F built by `energy` (P formed densely).
template <typename Energy>
torch::Tensor minus_eta_p_grad(const CemAttentionImpl& m, const torch::Tensor& x0, Energy energy) {
  torch::AutoGradMode on(true);
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor g = torch::autograd::grad({energy(x).sum()}, {x})[0];
  if (m.preconditioner() != nullptr) g = torch::matmul(g, m.preconditioner()->dense().t());
  return -m.eta() * g;
}

// ---- recursion_keys = iterate
// ----------------------------------------------------------------------

// Semantics: T steps with keys from the iterates are T applications of the one-step sub-layer to
// its own iterate, x <- x + mixer_(T=1)(x) (the weight-shared sub-layer repeated without
// re-normalising); T = 1 is bitwise the fixed-key layer; T = 2 differs from it; one key projection
// per step.
TEST(CemRecursionKeys, IterateIsTheOneStepSubLayerRepeatedOnTheIterate) {
  for (const Attn& v : iterate_variants()) {
    SCOPED_TRACE(v.name);
    const int64_t T = 3;
    auto m = make_attn(v, T);
    Attn fixed = v;
    fixed.keys = CemRecursionKeys::kFixed;
    auto one = make_attn(fixed, 1);  // same seed: same weights
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    const int64_t before = m->key_projections();
    const torch::Tensor got = m->forward(h, ctx);
    EXPECT_EQ(m->key_projections() - before, T);
    torch::Tensor x = h;
    for (int64_t t = 0; t < T; ++t) x = x + one->forward(x, ctx);
    EXPECT_LT(rel_err(got, x - h), 1e-12);

    m->set_steps(1);
    EXPECT_TRUE(torch::equal(m->forward(h, ctx), one->forward(h, ctx)));
    m->set_steps(2);
    auto fixed2 = make_attn(fixed, 2);
    EXPECT_GT(rel_err(m->forward(h, ctx), fixed2->forward(h, ctx)), 1e-3);
  }
}

// Every step t is -eta P times the gradient, at x = x^(t), of the conditional energy whose keys are
// the current iterates held fixed: F_t(x) = sum_i E_i(x_i; x^(t)_1..i) (+ 1/2 lambda |x - h|^2).
// This is what the update is the gradient of; it is not the gradient of one energy of x (next
// test).
TEST(CemRecursionKeys, EachStepIsTheGradientOfTheEnergyConditionedOnTheCurrentIterates) {
  std::vector<Attn> vs = iterate_variants();
  vs.erase(vs.begin() + 2);  // naive RoPE is not a gradient by design
  Attn with_prox{"plain_prox", false};
  with_prox.keys = CemRecursionKeys::kIterate;
  with_prox.prox = CemProxMode::kLearned;
  vs.push_back(with_prox);
  for (const Attn& v : vs) {
    SCOPED_TRACE(v.name);
    auto m = make_attn(v, 1);
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    torch::Tensor x = h;
    for (int64_t t = 0; t < 3; ++t) {
      CemAttentionCondition c = m->condition(x, ctx, t);  // keys from x^(t)
      c.anchor = h;
      const torch::Tensor got = m->step(x, c) - x;
      const torch::Tensor keys = x.clone();
      const torch::Tensor want = minus_eta_p_grad(
          *m, x, [&](const torch::Tensor& y) { return m->energy(y, keys, ctx, h); });
      EXPECT_LT(rel_err(got, want), 1e-11) << "step " << t;
      x = x + got;
    }
  }
}

// The update field v(x) = -grad_x F(x; keys = x) with keys from the iterates is causal with real
// cross-token coupling: dv_i/dx_j != 0 for some j < i but == 0 for every j > i. Its Jacobian is
// therefore not symmetric, and no scalar energy U(x) has v = -grad U (a gradient field's Jacobian
// is the Hessian, symmetric). docs/layers/cem.md §8.1.
TEST(CemRecursionKeys, IterateUpdateIsNotAGradientField) {
  Attn v{"plain"};
  v.keys = CemRecursionKeys::kIterate;
  auto m = make_attn(v, 1);
  const MixerContext ctx = context(false, 0, kN);
  const torch::Tensor x0 = torch::randn({1, kN, kD}, kF64);
  torch::Tensor x = x0.clone().requires_grad_(true);
  CemAttentionCondition c = m->condition(x, ctx, 1);  // keys from x itself (a step t >= 1)
  c.anchor = x0;
  const torch::Tensor field = m->direction(x, c).view({kN * kD});
  torch::Tensor J = torch::zeros({kN * kD, kN * kD}, kF64);
  for (int64_t r = 0; r < kN * kD; ++r) {
    J[r] = torch::autograd::grad({field[r]}, {x}, {}, /*retain_graph=*/true)[0].view({kN * kD});
  }
  double lower = 0, upper = 0;
  for (int64_t i = 0; i < kN; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      const double b = max_abs(J.narrow(0, i * kD, kD).narrow(1, j * kD, kD));
      if (j < i) lower = std::max(lower, b);
      if (j > i) upper = std::max(upper, b);
    }
  }
  EXPECT_GT(lower, 1e-2);  // token i's update depends on earlier iterates (through their keys)
  EXPECT_EQ(upper, 0.0);   // and on no later one (causal, exactly)
  EXPECT_GT(max_abs(J - J.t()), 1e-2);  // so J is not a Hessian
}

// Decoding in chunks with the per-step key cache equals the full forward; the state holds T caches
// of the fixed-key cache's shape (steps 1..T-1 in `iterate`).
TEST(CemRecursionKeys, DecodingWithPerStepKeysEqualsFullForward) {
  for (const Attn& v : iterate_variants()) {
    for (int64_t T : {1, 2, 4}) {
      SCOPED_TRACE(v.name + " T=" + std::to_string(T));
      auto m = make_attn(v, T);
      torch::NoGradGuard no_grad;
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor full = m->forward(h, context(v.rope, 0, kN));
      auto state = m->new_state();
      std::vector<torch::Tensor> parts;
      int64_t pos = 0;
      for (int64_t len : {2, 1, 1, 2}) {
        MixerContext ctx = context(v.rope, pos, len);
        ctx.state = state.get();
        parts.push_back(m->forward(h.narrow(1, pos, len), ctx));
        pos += len;
      }
      EXPECT_LT(max_abs(torch::cat(parts, 1) - full), 1e-12);
      const auto& s = static_cast<const CemAttentionState&>(*state);
      ASSERT_EQ(static_cast<int64_t>(s.iterate.size()), T - 1);
      for (const CemKeyCache& step : s.iterate) {
        EXPECT_EQ(step.k.values().sizes(), s.k.values().sizes());
        EXPECT_EQ(s.k.values().sizes(), (std::vector<int64_t>{kB, kH, kN, kDh}));
        EXPECT_EQ(step.h.defined(), v.dlr != CemDiagonal::kNone);
      }
    }
  }
}

// ---- T = 1 unchanged
// ---------------------------------------------------------------------------------

// With prox (learned or fixed), step_norm or iterate keys, the T = 1 sub-layer computes bitwise
// what the default one computes (same weights), and so do its input gradients.
TEST(CemRecursionOptions, TOneLayerIsUnchanged) {
  std::vector<Attn> opts(4);
  opts[0].keys = CemRecursionKeys::kIterate;
  opts[1].prox = CemProxMode::kLearned;
  opts[2].prox = CemProxMode::kFixed;
  opts[3].step_norm = true;
  for (size_t i = 0; i < opts.size(); ++i) {
    SCOPED_TRACE(i);
    auto base = make_attn(Attn{}, 1);
    auto m = make_attn(opts[i], 1);
    const torch::Tensor h0 = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor h1 = h0.clone().requires_grad_(true), h2 = h0.clone().requires_grad_(true);
    const MixerContext ctx = context(false, 0, kN);
    const torch::Tensor a = base->forward(h1, ctx), b = m->forward(h2, ctx);
    EXPECT_TRUE(torch::equal(a, b));
    a.sum().backward();
    b.sum().backward();
    EXPECT_TRUE(torch::equal(h1.grad(), h2.grad()));
  }
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("mlp " + std::to_string(i));
    CemStepOptions s;
    if (i == 0) s.prox(CemProxMode::kLearned);
    if (i == 1) s.prox(CemProxMode::kFixed);
    if (i == 2) s.step_norm(true);
    torch::manual_seed(3);
    auto base = std::make_shared<CemMlpImpl>(CemMlpOptions(kD, kM));
    torch::manual_seed(3);
    auto m = std::make_shared<CemMlpImpl>(CemMlpOptions(kD, kM).step(s));
    const torch::Tensor h = torch::randn({kB, kN, kD});
    EXPECT_TRUE(torch::equal(base->forward(h), m->forward(h)));
  }
}

// ---- prox
// ----------------------------------------------------------------------------------------------

// The step with the proximal term is -eta P grad of E + 1/2 lambda |x - h|^2 (learned and fixed
// lambda, attention and both MLP forms), at a perturbed x (at x = h the term's gradient is 0).
TEST(CemProx, StepIsMinusEtaPGradientOfEnergyWithProximalTerm) {
  for (CemProxMode mode : {CemProxMode::kLearned, CemProxMode::kFixed}) {
    for (bool precond : {false, true}) {
      Attn v{"prox"};
      v.prox = mode;
      v.precond = precond;
      v.rope = true;
      auto m = make_attn(v, 1);
      EXPECT_DOUBLE_EQ(m->prox_lambda(), mode == CemProxMode::kLearned ? 0.8 : 1.0);
      torch::NoGradGuard no_grad;
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
      const MixerContext ctx = context(true, 0, kN);
      const CemAttentionCondition c = m->condition(h, ctx);
      const torch::Tensor x = h + 0.5 * torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor got = m->step(x, c) - x;
      const torch::Tensor want =
          minus_eta_p_grad(*m, x, [&](const torch::Tensor& y) { return m->energy(y, h, ctx); });
      EXPECT_LT(rel_err(got, want), 1e-11);
    }
    for (bool form_b : {false, true}) {
      torch::manual_seed(2);
      auto m = std::make_shared<CemMlpImpl>(
          CemMlpOptions(kD, kM).form_b(form_b).step(CemStepOptions().prox(mode)));
      m->to(torch::kFloat64);
      {
        torch::NoGradGuard no_grad;
        m->w_u.normal_(0.0, 0.5);
        m->w_g.normal_(0.0, 0.5);
        if (mode == CemProxMode::kLearned) set_param(*m, "lambda_raw", softplus_inv(1.7));
      }
      torch::NoGradGuard no_grad;
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor x = h + 0.5 * torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor got = m->step(x, m->condition(h), h) - x;
      torch::Tensor want;
      {
        torch::AutoGradMode on(true);
        torch::Tensor y = x.clone().requires_grad_(true);
        want = -m->eta() * torch::autograd::grad({m->energy(y, h).sum()}, {y})[0];
      }
      EXPECT_LT(rel_err(got, want), 1e-11);
      // and the term is non-trivial: the step without the anchor differs by lambda eta (x - h).
      const torch::Tensor bare = m->step(x, m->condition(h)) - x;
      EXPECT_LT(rel_err(bare - got, m->eta() * m->prox_lambda() * (x - h)), 1e-11);
    }
  }
}

// Convergence on a fixed h (docs/layers/cem.md §8.2). With P = I the step map is
//   S(x) = x - eta lambda (x - h) + eta d(x),   d = -grad E,
// and if d is L-Lipschitz, |S(x) - S(y)| <= (|1 - eta lambda| + eta L) |x - y|: a contraction, so
// the iterate converges (geometrically, rate rho), whenever lambda > L and 0 < eta < 2 / (lambda +
// L). Attention: dd/dx_i = beta sum_k W_Qk^T Cov_p(W_Kk h) W_Qk, so L <= beta sum_k |W_Qk|^2 max_j
// |W_Kk h_j|^2. The test sets lambda = 2 L and eta = 1/lambda (rho = 1/2) or eta = 1.2/lambda (rho
// = 0.8) and checks |x^(t+1) - x^(t)| <= rho^t |x^(1) - x^(0)| up to rounding for t < 48.
TEST(CemProx, AttentionIterateConvergesInsideTheDerivedStepRange) {
  Attn v{"prox"};
  v.prox = CemProxMode::kLearned;
  auto m = make_attn(v, 1, /*w_std=*/0.3);
  torch::NoGradGuard no_grad;
  const torch::Tensor h = torch::randn({1, kN, kD}, kF64);
  const double beta = 1.0 / std::sqrt(double(kDh));
  double L = 0;
  for (int64_t k = 0; k < kH; ++k) {
    const torch::Tensor wq = m->w_q.narrow(0, k * kDh, kDh), wk = m->w_k.narrow(0, k * kDh, kDh);
    const double nq = torch::linalg_svdvals(wq).max().item<double>();  // |W_Qk|_2
    const double vk2 =
        torch::linear(h, wk).pow(2).sum(-1).max().item<double>();  // max_j |W_Kk h_j|^2
    L += beta * nq * nq * vk2;
  }
  ASSERT_GT(L, 0.1);  // a non-trivial energy
  const MixerContext ctx = context(false, 0, kN);
  const CemAttentionCondition c = m->condition(h, ctx);
  for (double eta_lambda : {1.0, 1.2}) {
    SCOPED_TRACE(eta_lambda);
    const double lambda = 2 * L, eta = eta_lambda / lambda;
    const double rho = std::abs(1 - eta * lambda) + eta * L;
    ASSERT_LT(rho, 1.0);
    set_param(*m, "lambda_raw", softplus_inv(lambda));
    set_param(*m, "eta_raw", softplus_inv(eta));
    torch::Tensor x = h;
    torch::Tensor next = m->step(x, c);
    const double first = max_abs(next - x);
    ASSERT_GT(first, 1e-3);
    double bound = first;
    for (int t = 1; t < 48; ++t) {
      x = next;
      next = m->step(x, c);
      bound *= rho;
      // rounding: each step's float64 arithmetic is exact to ~1e-15 of |x|
      EXPECT_LE(max_abs(next - x), bound + 1e-13) << "t = " << t;
    }
    // The module's own forward at T = 48 lands on the same point.
    m->set_steps(48);
    EXPECT_LT(max_abs(m->forward(h, ctx) + h - next), 1e-12);
    m->set_steps(1);
  }
}

// The MLP (option A): dd/dx = W_U^T diag(SiLU'(W_U x) * (W_G h)) W_U with |SiLU'| <= 1.0999, so
// L <= 1.0999 |W_U|^2 max|W_G h|; option B: L = |W_U|^2 max|SiLU(W_G h)| (the map is linear).
TEST(CemProx, MlpIterateConvergesInsideTheDerivedStepRange) {
  for (bool form_b : {false, true}) {
    SCOPED_TRACE(form_b ? "b" : "a");
    torch::manual_seed(4);
    auto m = std::make_shared<CemMlpImpl>(
        CemMlpOptions(kD, kM).form_b(form_b).step(CemStepOptions().prox(CemProxMode::kLearned)));
    m->to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    m->w_u.normal_(0.0, 0.5);
    m->w_g.normal_(0.0, 0.5);
    const torch::Tensor h = torch::randn({1, kN, kD}, kF64);
    const torch::Tensor gate = m->condition(h);
    const double nu = torch::linalg_svdvals(m->w_u).max().item<double>();
    const double L = (form_b ? 1.0 : 1.0999) * nu * nu * gate.abs().max().item<double>();
    ASSERT_GT(L, 0.1);
    const double lambda = 2 * L, eta = 1.2 / lambda, rho = std::abs(1 - eta * lambda) + eta * L;
    set_param(*m, "lambda_raw", softplus_inv(lambda));
    set_param(*m, "eta_raw", softplus_inv(eta));
    torch::Tensor x = h, next = m->step(x, gate, h);
    double bound = max_abs(next - x);
    ASSERT_GT(bound, 1e-3);
    for (int t = 1; t < 48; ++t) {
      x = next;
      next = m->step(x, gate, h);
      bound *= rho;
      EXPECT_LE(max_abs(next - x), bound + 1e-13) << "t = " << t;
    }
    m->set_steps(48);
    EXPECT_LT(max_abs(m->forward(h) + h - next), 1e-12);
  }
}

// ---- step_norm
// -----------------------------------------------------------------------------------------

// Attention with fixed keys and P = I: per token, E(x) = -1/beta sum_k lse(beta s_k(x)) is concave
// in x (s linear in x). Let r = |h_i| and x^ on the sphere |x^| = r, g = -grad E(x^), y = x^ + eta
// g and x^' = r y / |y| (the next normalised iterate). Convexity of -E gives
//   E(x^') <= E(x^) - g.(x^' - x^),   and   g.(x^' - x^) = (r|y| - y.x^ + r^2 - x^.x^') / eta
//   >= (r^2 - x^.x^') / eta = |x^' - x^|^2 / (2 eta)    (Cauchy-Schwarz: r|y| >= y.x^).
// So every step lowers the energy by at least |x^' - x^|^2 / (2 eta), for ANY eta > 0: the energy
// (bounded below on the sphere) converges and the steps are square-summable, hence go to 0. The
// test checks that inequality at each of 64 steps per token (rounding allowance 1e-12 (1 + |E|)),
// and that the module's forward is the iteration it describes.
TEST(CemStepNorm, AttentionEnergyFallsBySufficientDecreaseAtAnyStepSize) {
  for (bool dlr : {false, true}) {
    Attn v{"step_norm"};
    v.step_norm = true;
    if (dlr) v.dlr = CemDiagonal::kShared;  // bilinear diagonal: logits still linear in x
    auto m = make_attn(v, 1, /*w_std=*/0.8);
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(false, 0, kN);
    const CemAttentionCondition c = m->condition(h, ctx);
    const torch::Tensor rms_h = cem_rms(h);
    for (double eta : {0.3, 3.0}) {
      SCOPED_TRACE(std::string(dlr ? "dlr " : "") + std::to_string(eta));
      set_param(*m, "eta_raw", softplus_inv(eta));
      torch::Tensor xhat = h, x;
      torch::Tensor e = m->energy(xhat, h, ctx);  // (B, N)
      double first_step = 0, last_step = 0;
      for (int t = 0; t < 64; ++t) {
        x = m->step(xhat, c);
        const torch::Tensor xhat_next = cem_rescale_to(x, rms_h);
        const torch::Tensor e_next = m->energy(xhat_next, h, ctx);
        const torch::Tensor moved = (xhat_next - xhat).pow(2).sum(-1);  // (B, N)
        const torch::Tensor slack = e - moved / (2 * eta) - e_next + 1e-12 * (1 + e.abs());
        EXPECT_GE(slack.min().item<double>(), 0.0) << "t = " << t;
        const double step = moved.max().item<double>();
        if (t == 0) first_step = step;
        last_step = step;
        xhat = xhat_next;
        e = e_next;
      }
      EXPECT_GT(first_step, 1e-4);
      EXPECT_LT(last_step, first_step);
      m->set_steps(64);
      EXPECT_LT(max_abs(m->forward(h, ctx) + h - x), 1e-12);
      m->set_steps(1);
    }
  }
}

}  // namespace
}  // namespace cemfrac

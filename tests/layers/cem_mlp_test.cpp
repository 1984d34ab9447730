// cem_mlp against its closed-form energies and against SwiGLU (CEM spec §7), float64,
// N = 6, D = 8, M = 10, r = 2. Property numbers are the spec's.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <string>
#include <vector>

#include "cemfrac/layers/base/swiglu.h"
#include "cemfrac/layers/cem/cem_mlp.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr int64_t kB = 2, kN = 6, kD = 8, kM = 10, kRank = 2;

struct Variant {
  std::string name;
  bool form_b = false;
  bool precond = false;
  bool psd = false;
  bool learn_eta = true;
};

std::vector<Variant> variants() {
  return {{"a"}, {"b", true}, {"a_precond", false, true}, {"b_precond_psd", true, true, true}};
}

std::shared_ptr<CemMlpImpl> make(const Variant& v, int64_t steps = 1, uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto m = std::make_shared<CemMlpImpl>(
      CemMlpOptions(kD, kM).form_b(v.form_b).step(CemStepOptions()
                                                      .steps(steps)
                                                      .learn_eta(v.learn_eta)
                                                      .precond(v.precond)
                                                      .precond_rank(kRank)
                                                      .precond_psd(v.psd)));
  m->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    if (name == "w_u" || name == "w_g") p.value().normal_(0.0, 0.5);
    if (name == "eta_raw") p.value().fill_(std::log(std::exp(0.7) - 1.0));
    if (name == "precond.p") p.value().normal_(0.0, 0.5);
    if (name == "precond.u" || name == "precond.v") p.value().normal_(0.0, 0.3);
  }
  return m;
}

using test::rel_err;

// Phi(u) = int_0^u s sigmoid(s) ds by 64-point Gauss-Legendre (nodes by Newton on P_64).
double phi_quadrature(double u) {
  const int n = 64;
  double total = 0;
  for (int i = 1; i <= n; ++i) {
    double x = std::cos(M_PI * (i - 0.25) / (n + 0.5)), dp = 0;
    for (int it = 0; it < 100; ++it) {
      double p0 = 1, p1 = x;
      for (int k = 2; k <= n; ++k) {
        const double p2 = ((2 * k - 1) * x * p1 - (k - 1) * p0) / k;
        p0 = p1;
        p1 = p2;
      }
      dp = n * (x * p1 - p0) / (x * x - 1);
      const double dx = p1 / dp;
      x -= dx;
      if (std::abs(dx) < 1e-16) break;
    }
    const double w = 2 / ((1 - x * x) * dp * dp);
    const double s = 0.5 * u * (x + 1);
    total += w * s / (1 + std::exp(-s));
  }
  return 0.5 * u * total;
}

TEST(CemMlp, PhiClosedFormMatchesQuadratureAndDifferentiatesToSilu) {
  std::vector<double> us = {-40, -12, -5, -2.5, -1, -0.3, -1e-3, 0, 1e-3, 0.3, 1, 2.5, 5, 12};
  torch::Tensor u = torch::tensor(us, kF64).requires_grad_(true);
  torch::Tensor phi = cem_phi(u);
  for (size_t i = 0; i < us.size(); ++i) {
    const double want = us[i] < -30 ? M_PI * M_PI / 12 : phi_quadrature(us[i]);
    EXPECT_NEAR(phi[i].item<double>(), want, 1e-13 * std::max(1.0, std::abs(want)))
        << "u = " << us[i];
  }
  EXPECT_NEAR(phi[7].item<double>(), 0.0, 1e-15);  // Phi(0) = 0
  const torch::Tensor g = torch::autograd::grad({phi.sum()}, {u})[0];
  EXPECT_LT((g - torch::silu(u.detach())).abs().max().item<double>(), 1e-14);
}

torch::Tensor expected_displacement(CemMlpImpl& m, const torch::Tensor& x0,
                                    const torch::Tensor& h) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor g = torch::autograd::grad({m.energy(x, h).sum()}, {x})[0];
  if (m.preconditioner() != nullptr) g = torch::matmul(g, m.preconditioner()->dense().t());
  return -m.eta() * g;
}

// Property 4 (A and B, with and without P), at x = h and at a perturbed x.
TEST(CemMlp, StepIsMinusEtaPGradientOfEnergy) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto m = make(v);
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor gate = m->condition(h).detach();
    for (const torch::Tensor& x : {h, h + 0.4 * torch::randn({kB, kN, kD}, kF64)}) {
      const torch::Tensor got = (m->step(x, gate) - x).detach();
      EXPECT_LT(rel_err(got, expected_displacement(*m, x, h)), 1e-12);
    }
    // The explicit option-A formula: eta W_U^T [SiLU(W_U x) * W_G h].
    if (!v.form_b && !v.precond) {
      const torch::Tensor d = torch::matmul(
          torch::silu(torch::matmul(h, m->w_u.t())) * torch::matmul(h, m->w_g.t()), m->w_u);
      EXPECT_LT(rel_err((m->step(h, gate) - h).detach(), m->eta() * d), 1e-14);
    }
  }
}

// Property 5 (and 13: W_U's gradient is the sum of both uses).
TEST(CemMlp, OneStepEqualsSwiGluAndSharesGradients) {
  for (bool form_b : {false, true}) {
    SCOPED_TRACE(form_b ? "b" : "a");
    Variant v{"x", form_b};
    v.learn_eta = false;
    auto m = make(v);
    auto ref = std::make_shared<SwiGluImpl>(FfnOptions(kD, kM));
    ref->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      ref->w_gate.copy_(form_b ? m->w_g : m->w_u);
      ref->w_up.copy_(form_b ? m->w_u : m->w_g);
      ref->w_down.copy_(m->w_u.t());
    }
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor w = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor a = m->forward(h), b = ref->forward(h);
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-12);
    (a * w).sum().backward();
    (b * w).sum().backward();
    const torch::Tensor gu =
        (form_b ? ref->w_up.grad() : ref->w_gate.grad()) + ref->w_down.grad().t();
    const torch::Tensor gg = form_b ? ref->w_gate.grad() : ref->w_up.grad();
    EXPECT_LT((m->w_u.grad() - gu).abs().max().item<double>(), 1e-12);
    EXPECT_LT((m->w_g.grad() - gg).abs().max().item<double>(), 1e-12);
  }
}

// Property 8: T steps = T one-step maps with the gate fixed; the gate projected once per forward;
// not the same as applying the T = 1 sub-layer T times. Option B's recursion is linear:
// (I + eta W_U^T S W_U)^T h.
TEST(CemMlp, RecursionSemantics) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto m = make(v, 3);
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const int64_t before = m->gate_projections();
    const torch::Tensor y = m->forward(h);
    EXPECT_EQ(m->gate_projections(), before + 1);
    const torch::Tensor gate = m->condition(h);
    torch::Tensor x = h;
    for (int t = 0; t < 3; ++t) x = m->step(x, gate);
    EXPECT_LT((y - (x - h)).abs().max().item<double>(), 1e-13);
    if (v.form_b && !v.precond) {
      // Per position: A = I + eta W_U^T diag(S) W_U, x^(3) = A^3 h.
      for (int64_t n = 0; n < kN; ++n) {
        const torch::Tensor S = torch::silu(torch::matmul(m->w_g, h[0][n]));
        const torch::Tensor A =
            torch::eye(kD, kF64) + m->eta() * torch::matmul(m->w_u.t() * S, m->w_u);
        const torch::Tensor want = torch::matmul(torch::matrix_power(A, 3), h[0][n]);
        EXPECT_LT(rel_err(x[0][n], want), 1e-13);
      }
    }
    m->set_steps(1);
    torch::Tensor z = h;
    for (int t = 0; t < 3; ++t) z = z + m->forward(z);
    EXPECT_GT((y - (z - h)).abs().max().item<double>(), 1e-3);
  }
}

// Property 10: small steps lower every position's energy (P = I, and the PSD preconditioner).
TEST(CemMlp, SmallStepsDescend) {
  for (bool form_b : {false, true}) {
    for (bool psd : {false, true}) {
      SCOPED_TRACE(std::string(form_b ? "b" : "a") + (psd ? " psd" : ""));
      Variant v{"x", form_b, psd, psd};
      auto m = make(v);
      torch::NoGradGuard no_grad;
      if (psd) {
        m->named_parameters()["precond.p"].fill_(std::log(std::exp(1e-3) - 1.0));
        m->named_parameters()["precond.u"].mul_(0.03);
      } else {
        m->named_parameters()["eta_raw"].fill_(std::log(std::exp(1e-3) - 1.0));
      }
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor gate = m->condition(h);
      torch::Tensor x = h;
      for (int t = 0; t < 5; ++t) {
        const torch::Tensor next = m->step(x, gate);
        EXPECT_TRUE((m->energy(next, h) < m->energy(x, h)).all().item<bool>()) << "step " << t;
        x = next;
      }
    }
  }
}

// Property 12 (per module) and 11 for the MLP's preconditioner.
TEST(CemMlp, ParameterCountsAndPreconditioner) {
  auto count = [](const Variant& v) {
    int64_t n = 0;
    for (const auto& p : make(v)->parameters()) n += p.numel();
    return n;
  };
  Variant frozen{"frozen"};
  frozen.learn_eta = false;
  EXPECT_EQ(count(frozen), 2 * kD * kM);
  EXPECT_EQ(count({"a"}), 2 * kD * kM + 1);
  EXPECT_EQ(count({"p", false, true}), 2 * kD * kM + kD + 2 * kD * kRank);
  auto m = make({"p", false, true});
  const torch::Tensor P = m->preconditioner()->dense();
  EXPECT_LT((P - P.t()).abs().max().item<double>(), 1e-15);
  const torch::Tensor g = torch::randn({4, kD}, kF64);
  EXPECT_LT(rel_err(m->preconditioner()->apply(g), torch::matmul(g, P.t())), 1e-14);
  // A fresh module: P = I (to p's float32 rounding), one backward reaches p and V.
  auto fresh = std::make_shared<CemMlpImpl>(
      CemMlpOptions(kD, kM).step(CemStepOptions().precond(true).precond_rank(kRank)));
  fresh->to(torch::kFloat64);
  EXPECT_LT((fresh->preconditioner()->dense() - torch::eye(kD, kF64)).abs().max().item<double>(),
            1e-7);
  fresh->forward(torch::randn({kB, kN, kD}, kF64)).pow(2).sum().backward();
  auto params = fresh->named_parameters();
  EXPECT_GT(params["precond.p"].grad().abs().max().item<double>(), 0.0);
  EXPECT_GT(params["precond.v"].grad().abs().max().item<double>(), 0.0);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"w_u", "w_g", "precond.p", "precond.u", "precond.v"}));
}

}  // namespace
}  // namespace cemfrac

// Ladder gradient tests (CoFrGeNet spec §8, properties 3 and 4, and the exact-mode
// derivative of the clamped map): custom backward vs central differences in float64, vs autograd
// through the literal ladder, and vs autograd through the reference; the sign pattern.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <cmath>
#include <vector>

#include "cemfrac/ops/continuant.h"
#include "tests/ops/ladder_test_util.h"

namespace cemfrac {
namespace {

using test::expect_close;
using test::uniform;

// Central differences of f = continuant(a) for every a_k of every ladder at once (ladders are
// independent): returns (R, d, L) with df/da_k at [.][k-1][.].
at::Tensor central_differences(const at::Tensor& a, const ContinuantOptions& options, double h) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> cols;
  for (int64_t k = 0; k < a.size(1); ++k) {
    at::Tensor plus = a.clone();
    at::Tensor minus = a.clone();
    plus.select(1, k).add_(h);
    minus.select(1, k).sub_(h);
    cols.push_back((continuant(plus, options) - continuant(minus, options)) / (2 * h));
  }
  return at::stack(cols, 1);
}

// Ladders whose pole K_d = 0 is at least 1e-2 away along every coordinate a_k (K_d is affine in
// a_k, so that distance is |K_d| / |dK_d/da_k|) and whose |K_d| >= eps (guard inactive). The
// truncation error of a central difference with step h is then about (h / 1e-2)^2 relative, 1e-8 at
// h = 1e-6.
at::Tensor away_from_poles(const at::Tensor& a_in) {
  at::Tensor a = a_in.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor kd = continuant_tails_reference(a).select(-2, a.size(-2));  // (R, L)
  const at::Tensor dkd = torch::autograd::grad({kd.sum()}, {a})[0];            // (R, d, L)
  const at::Tensor distance = kd.detach().abs().unsqueeze(-2) / dkd.abs();
  return (std::get<0>(distance.min(-2)) >= 1e-2) & (kd.detach().abs() >= 0.01);
}

// Property 3: custom backward = central differences (float64, h = 1e-6, rel. tol 1e-6), d = 1..8.
// The absolute floor 1e-8 is the rounding error of the difference quotient itself, a few
// eps_machine |f| / h = 2e-10 |f|, for the ladders kept here (|f| <= 10).
TEST(ContinuantGrad, CentralDifferencesFloat64) {
  for (int64_t d = 1; d <= 8; ++d) {
    const at::Tensor a = uniform({4, d, 97}, -3, 3, at::kDouble, 2000 + d);
    auto [f, grad] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a,
                                          at::ones({4, 97}, at::kDouble));
    const at::Tensor keep = (away_from_poles(a) & (f.abs() <= 10)).unsqueeze(1).expand({4, d, 97});
    ASSERT_GT(keep.sum().item<int64_t>(), 4 * 97 / 4) << "d=" << d;
    const at::Tensor fd = central_differences(a, ContinuantOptions(), 1e-6);
    expect_close(grad, fd, 1e-6, 1e-8, "fused vs central differences, d=" + std::to_string(d),
                 keep);
    // The reference's autograd gradient passes the same check.
    auto [fr, gr] =
        test::value_and_grad([](const at::Tensor& x) { return continuant_reference(x); }, a,
                             at::ones({4, 97}, at::kDouble));
    expect_close(gr, fd, 1e-6, 1e-8, "reference vs central differences, d=" + std::to_string(d),
                 keep);
  }
}

// Property 3: custom backward = autograd through the literal nested form (unguarded, float64).
TEST(ContinuantGrad, MatchesAutogradThroughLiteralFloat64) {
  for (int64_t d = 1; d <= 8; ++d) {
    const at::Tensor a = uniform({4, d, 131}, -3, 3, at::kDouble, 2100 + d);
    const at::Tensor keep = test::tails_at_least(a, 1e-2).unsqueeze(1).expand({4, d, 131});
    const at::Tensor g = uniform({4, 131}, -1, 1, at::kDouble, 2200 + d);
    auto [f, grad] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a, g);
    auto [fl, gl] = test::value_and_grad(
        [](const at::Tensor& x) { return continuant_literal(x, ContinuantOptions().eps(0)); }, a,
        g);
    expect_close(grad, gl, 1e-10, 0, "fused vs literal autograd, d=" + std::to_string(d), keep);
  }
}

// Property 3, gradcheck-style: the whole autograd function in double, with leading dimensions, a
// random upstream gradient and random directions v: <grad, v> = (F(a + h v) - F(a - h v)) . g / 2h.
TEST(ContinuantGrad, DirectionalGradcheckFloat64) {
  for (auto impl : {ContinuantImpl::kFused, ContinuantImpl::kReference}) {
    const auto options = ContinuantOptions().impl(impl);
    at::Tensor a = uniform({2, 3, 5, 17}, 0.3, 2.5, at::kDouble, 2300);  // positive: far from poles
    const at::Tensor g = uniform({2, 3, 17}, -1, 1, at::kDouble, 2301);
    auto [f, grad] =
        test::value_and_grad([&](const at::Tensor& x) { return continuant(x, options); }, a, g);
    for (int trial = 0; trial < 5; ++trial) {
      const at::Tensor v = uniform({2, 3, 5, 17}, -1, 1, at::kDouble, 2400 + trial);
      const double h = 1e-6;
      at::NoGradGuard no_grad;
      const double numeric = ((continuant(a + h * v, options) - continuant(a - h * v, options)) * g)
                                 .sum()
                                 .item<double>() /
                             (2 * h);
      const double analytic = (grad * v).sum().item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::abs(numeric) + 1e-8)
          << to_string(impl) << " trial " << trial;
    }
  }
}

// Property 4: sign(df/da_k) = (-1)^k, and df/da_1 = -f^2 bitwise, for unclamped ladders.
TEST(ContinuantGrad, SignPatternAndFirstDerivative) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (int64_t d = 1; d <= 8; ++d) {
      const at::Tensor a = uniform({6, d, 211}, -3, 3, dtype, 2500 + d);
      const at::Tensor kd = continuant_tails_reference(a).select(-2, d);
      const at::Tensor unclamped = kd.abs() >= 0.01;
      auto [f, grad] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a,
                                            at::ones({6, 211}, dtype));
      for (int64_t k = 1; k <= d; ++k) {
        const at::Tensor gk = grad.select(1, k - 1);
        const at::Tensor nonzero = gk != 0;
        const at::Tensor expected_sign = at::full_like(gk, k % 2 == 1 ? -1.0 : 1.0);
        EXPECT_TRUE(
            at::equal(gk.sign().masked_select(nonzero), expected_sign.masked_select(nonzero)))
            << "sign of df/da_" << k << " d=" << d;
      }
      const at::Tensor g1 = grad.select(1, 0);
      EXPECT_TRUE(at::equal(g1.masked_select(unclamped), (-(f * f)).masked_select(unclamped)))
          << "df/da_1 = -f^2, d=" << d;
    }
  }
}

// Exact mode: inside the clamp K̂_d is constant, so df/da_1 = 0 and the rest is the derivative of
// K_{d-1}/(+-eps); checked against central differences of the clamped map, which are valid while
// the perturbation keeps |K_d| < eps. Surrogate mode there is Proposition 1 with K̂_d = +-eps.
TEST(ContinuantGrad, ExactModeInsideClamp) {
  const double eps = 0.01;
  for (int64_t d = 2; d <= 6; ++d) {
    // Choose a_2..a_d freely and a_1 so that K_d = a_1 K_{d-1} + K_{d-2} = target, |target| <
    // eps/2.
    at::Tensor a = uniform({1, d, 64}, 0.5, 2.0, at::kDouble, 2600 + d);
    const at::Tensor target = uniform({64}, -eps / 2, eps / 2, at::kDouble, 2700 + d);
    const at::Tensor tail = continuant_tails_reference(a.slice(1, 1, d));  // tails of a_2..a_d
    const at::Tensor k_d1 = tail.select(1, d - 1)[0];
    const at::Tensor k_d2 = tail.select(1, d - 2)[0];
    a[0][0] = (target - k_d2) / k_d1;
    const at::Tensor kd = continuant_tails_reference(a).select(1, d)[0];
    ASSERT_TRUE((kd.abs() < eps * 0.6).all().item<bool>()) << "setup, d=" << d;

    const auto exact = ContinuantOptions().backward(ContinuantBackward::kExact);
    auto [f, grad] = test::value_and_grad([&](const at::Tensor& x) { return continuant(x, exact); },
                                          a, at::ones({1, 64}, at::kDouble));
    // h small enough that K_d moves by far less than eps/2 (|dK_d/da_k| <= ~10 here).
    const at::Tensor fd = central_differences(a, exact, 1e-7);
    expect_close(grad, fd, 1e-6, 1e-6, "exact mode vs central differences, d=" + std::to_string(d));
    EXPECT_TRUE((grad.select(1, 0) == 0).all().item<bool>()) << "df/da_1 = 0 inside the clamp";
    auto [fr, gr] =
        test::value_and_grad([&](const at::Tensor& x) { return continuant_reference(x, exact); }, a,
                             at::ones({1, 64}, at::kDouble));
    expect_close(grad, gr, 1e-10, 1e-10, "exact mode fused vs reference, d=" + std::to_string(d));

    // Surrogate: (-1)^k (K_{d-k} / K̂_d)^2 with K̂_d = sgn(K_d) eps.
    auto [fs, gs] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a,
                                         at::ones({1, 64}, at::kDouble));
    const at::Tensor tails = continuant_tails_reference(a)[0];  // (d+1, 64)
    const at::Tensor kh = at::where(kd >= 0, at::full_like(kd, eps), at::full_like(kd, -eps));
    for (int64_t k = 1; k <= d; ++k) {
      const at::Tensor expected = (tails[d - k] / kh).square() * (k % 2 == 1 ? -1.0 : 1.0);
      expect_close(gs.select(1, k - 1)[0], expected, 1e-12, 0, "surrogate k=" + std::to_string(k));
    }
  }
}

// Why the reference injects Proposition 1 instead of letting autograd take the quotient rule of
// K_{d-1}/K_d: the quotient rule's two terms cancel. In float32, d = 8, a ~ U(1, 2), the naive
// gradient of a_d is off by far more than 1e-3 relative, while the reference stays within 1e-5.
TEST(ContinuantGrad, QuotientRuleAutogradCancelsButReferenceDoesNot) {
  const int64_t d = 8;
  const at::Tensor a = uniform({1, d, 512}, 1, 2, at::kFloat, 2800);
  const at::Tensor g = at::ones({1, 512}, at::kFloat);
  auto naive = [](const at::Tensor& x) {
    const at::Tensor t = continuant_tails_reference(x);
    return t.select(-2, x.size(-2) - 1) / t.select(-2, x.size(-2));
  };
  auto [fn, gn] = test::value_and_grad(naive, a, g);
  auto [fr, gr] =
      test::value_and_grad([](const at::Tensor& x) { return continuant_reference(x); }, a, g);
  auto [f64, g64] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); },
                                         a.to(at::kDouble), g.to(at::kDouble));
  const at::Tensor truth = g64.select(1, d - 1);
  const double naive_err =
      ((gn.select(1, d - 1).to(at::kDouble) - truth).abs() / truth.abs()).max().item<double>();
  const double ref_err =
      ((gr.select(1, d - 1).to(at::kDouble) - truth).abs() / truth.abs()).max().item<double>();
  EXPECT_GT(naive_err, 1e-3) << "quotient-rule autograd (expected to lose digits)";
  EXPECT_LT(ref_err, 1e-5) << "reference (Proposition 1 injected)";
}

}  // namespace
}  // namespace cemfrac

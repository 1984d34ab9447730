// Ladder forward and kernel-vs-reference tests (CoFrGeNet spec §8, properties 1, 2, 5, 6, 7,
// 9, 10). Gradients against finite differences and the literal ladder: continuant_grad_test.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/continuant.h"
#include "tests/ops/ladder_test_util.h"

namespace cemfrac {
namespace {

using test::bitwise_equal;
using test::expect_close;
using test::uniform;

// The kernel's raw outputs for a (R, d, L) input: f, r and the continuants K_{d-k} at [.][k-1][.].
struct KernelOut {
  at::Tensor f, r, k;
};
KernelOut run_kernel(const at::Tensor& a, double eps = 0.01) {
  KernelOut out;
  out.f = at::empty({a.size(0), a.size(2)}, a.options());
  out.r = at::empty_like(out.f);
  out.k = at::empty_like(a);
  kernels::continuant_forward_cpu(a.contiguous(), eps, out.f, out.r, out.k);
  return out;
}

// Property 1: forward = literal nested evaluation (no guards) in float64, away from small tails.
TEST(ContinuantForward, MatchesLiteralFloat64) {
  for (int64_t d = 1; d <= 8; ++d) {
    const at::Tensor a = uniform({16, d, 257}, -3, 3, at::kDouble, 100 + d);
    const at::Tensor keep = test::tails_at_least(a, 1e-2);
    ASSERT_GT(keep.sum().item<int64_t>(), keep.numel() / 3) << "d=" << d;
    const at::Tensor f = continuant(a);
    const at::Tensor lit = continuant_literal(a, ContinuantOptions().eps(0));
    expect_close(f, lit, 1e-12, 0, "f vs literal, d=" + std::to_string(d), keep);
  }
}

// Property 1, float32: both evaluation orders against a float64 reference; the tolerance follows
// the smallest tail because cancellation near small tails is inherent in float32.
TEST(ContinuantForward, Float32AgainstFloat64) {
  for (int64_t d = 1; d <= 8; ++d) {
    const at::Tensor a = uniform({16, d, 263}, -3, 3, at::kFloat, 200 + d);
    const at::Tensor truth = continuant(a.to(at::kDouble), ContinuantOptions().eps(0));
    const at::Tensor f = continuant(a);
    const at::Tensor lit = continuant_literal(a, ContinuantOptions().eps(0));
    const at::Tensor tails_1e2 = test::tails_at_least(a, 1e-2);
    const at::Tensor tails_1e1 = test::tails_at_least(a, 1e-1);
    const std::string tag = ", d=" + std::to_string(d);
    expect_close(f, truth, 1e-3, 0, "fused float32, tails >= 1e-2" + tag, tails_1e2);
    expect_close(f, truth, 1e-4, 0, "fused float32, tails >= 1e-1" + tag, tails_1e1);
    expect_close(lit, truth, 1e-3, 0, "literal float32, tails >= 1e-2" + tag, tails_1e2);
  }
}

// Property 2: the closed forms for d = 1, 2, 3 on integers. The continuants are exact integers; f
// is K_{d-1} * (1/K_d), two roundings, so it is within 2 ulp of the correctly rounded quotient.
TEST(ContinuantForward, ClosedFormsOnIntegers) {
  const at::Tensor ints = at::arange(-5, 6, at::kDouble);  // -5..5
  for (int64_t d = 1; d <= 3; ++d) {
    // Every combination of d values from -5..5, one ladder each.
    std::vector<at::Tensor> grids = at::meshgrid(std::vector<at::Tensor>(d, ints), "ij");
    std::vector<at::Tensor> cols;
    for (auto& g : grids) cols.push_back(g.reshape({1, -1}));
    const at::Tensor a = at::cat(cols, 0).unsqueeze(0);  // (1, d, 11^d)
    const at::Tensor a1 = a[0][0];
    at::Tensor closed;
    if (d == 1) {
      closed = 1.0 / a1;
    } else if (d == 2) {
      const at::Tensor a2 = a[0][1];
      closed = a2 / (a1 * a2 + 1);
    } else {
      const at::Tensor a2 = a[0][1], a3 = a[0][2];
      closed = (a2 * a3 + 1) / (a1 * a2 * a3 + a1 + a3);
    }
    const KernelOut out = run_kernel(a, 0.0);
    const at::Tensor kd = continuant_tails_reference(a).select(-2, d)[0];
    const at::Tensor off_pole = kd != 0;
    ASSERT_GT(off_pole.sum().item<int64_t>(), 0);
    expect_close(out.f[0], closed, 2 * std::numeric_limits<double>::epsilon(), 0,
                 "closed form d=" + std::to_string(d), off_pole);
    // K_{d-1} (stored for grad a_1) is an exact integer.
    const at::Tensor kd1 = out.k[0][0];
    EXPECT_TRUE(at::equal(kd1, kd1.round())) << "d=" << d;
  }
}

// Property 5: reversal symmetry and the determinant identity, exactly, on small integers.
TEST(ContinuantIdentities, ReversalAndDeterminantOnSmallIntegers) {
  for (int64_t d = 1; d <= 8; ++d) {
    torch::manual_seed(300 + d);
    const at::Tensor a = torch::randint(-4, 5, {3, d, 101}, torch::kDouble);
    auto K = [](const at::Tensor& x) {  // K(x_1..x_n) over dim -2; n = 0 gives 1
      if (x.size(-2) == 0) return at::ones({x.size(0), x.size(2)}, x.options());
      return continuant_tails_reference(x).select(-2, x.size(-2));
    };
    const at::Tensor full = K(a);
    EXPECT_TRUE(at::equal(full, K(a.flip(-2)))) << "reversal, d=" << d;
    if (d >= 2) {
      // K(a_1..a_d) K(a_2..a_{d-1}) - K(a_1..a_{d-1}) K(a_2..a_d) = (-1)^d
      const at::Tensor lhs =
          full * K(a.slice(-2, 1, d - 1)) - K(a.slice(-2, 0, d - 1)) * K(a.slice(-2, 1, d));
      EXPECT_TRUE(at::equal(lhs, at::full_like(lhs, d % 2 == 0 ? 1.0 : -1.0)))
          << "determinant identity, d=" << d;
    }
    // The kernel's stored continuants are the same integers: slot k-1 holds K_{d-k}.
    const at::Tensor tails = continuant_tails_reference(a);  // (3, d+1, L)
    const KernelOut out = run_kernel(a);
    for (int64_t k = 1; k <= d; ++k) {
      EXPECT_TRUE(at::equal(out.k.select(1, k - 1), tails.select(1, d - k)))
          << "kernel K_{d-k}, d=" << d << " k=" << k;
    }
  }
}

// Property 6: |K̂_d| >= eps, sign kept, K_d = +-0 -> +eps; read through r = 1/K̂_d.
TEST(ContinuantPoleGuard, ClampValueAndSign) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    // d = 1: K_1 = a_1.
    const std::vector<double> values = {0.0,   -0.0, 0.005, -0.005, 0.01,
                                        -0.01, 0.02, -0.02, 1e-30,  3.0};
    const at::Tensor a = at::tensor(values, at::kDouble).to(dtype).reshape({1, 1, -1});
    const KernelOut out = run_kernel(a);
    const double inv_eps = 1.0 / static_cast<double>(at::tensor(0.01, dtype).item<double>());
    for (size_t i = 0; i < values.size(); ++i) {
      const double r = out.r[0][i].item<double>();
      const double kd = values[i];
      EXPECT_LE(std::abs(r), inv_eps * (1 + 1e-6)) << "|K̂_d| >= eps at K_d=" << kd;
      if (kd != 0) {
        EXPECT_EQ(std::signbit(r), std::signbit(kd)) << "sign kept at K_d=" << kd;
      } else {
        EXPECT_FALSE(std::signbit(r)) << "K_d = " << kd << " must give +eps";
        EXPECT_NEAR(r, inv_eps, inv_eps * 1e-6);
      }
    }
    // d = 3 on the pole K_3 = a_1 a_2 a_3 + a_1 + a_3 = 0 with a = (1, -2, 1): f = K_2 / eps =
    // -1/eps.
    const at::Tensor on_pole =
        at::tensor({1.0, -2.0, 1.0}, at::kDouble).to(dtype).reshape({1, 3, 1});
    const at::Tensor f = continuant(on_pole);
    EXPECT_NEAR(f.item<double>(), -inv_eps, inv_eps * 1e-6);
  }
}

// Property 6: with the guard inactive, the guarded kernel is bitwise the unguarded (eps = 0) one.
TEST(ContinuantPoleGuard, InactiveGuardIsBitwiseUnguarded) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (int64_t d : {1, 2, 5, 8}) {
      at::Tensor a = uniform({8, d, 131}, -3, 3, dtype, 400 + d);
      const at::Tensor kd = continuant_tails_reference(a).select(-2, d);
      a = a.masked_fill((kd.abs() < 0.02).unsqueeze(-2), 1.0);  // keep ladders away from the clamp
      ASSERT_TRUE((continuant_tails_reference(a).select(-2, d).abs() >= 0.01).all().item<bool>());
      const at::Tensor g = uniform({8, 131}, -1, 1, dtype, 7);
      auto guarded = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a, g);
      auto unguarded = test::value_and_grad(
          [](const at::Tensor& x) { return continuant(x, ContinuantOptions().eps(0)); }, a, g);
      EXPECT_TRUE(bitwise_equal(guarded.first, unguarded.first)) << "f, d=" << d;
      EXPECT_TRUE(bitwise_equal(guarded.second, unguarded.second)) << "grad, d=" << d;
    }
  }
}

// Property 6: finite outputs and gradients for exact zeros and very large finite inputs, where the
// intermediate continuants overflow the dtype although f is representable. Where zeros and huge
// values mix, the exact gradient itself can exceed the dtype (a = (0, 1e30): f = 1e30, df/da_1 =
// -f^2 = -1e60): there the float32 gradient must be finite wherever a float64 evaluation says the
// exact value fits in float32, and inf only where it does not.
TEST(ContinuantPoleGuard, ZerosAndHugeInputsStayFinite) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const double big = dtype == at::kFloat ? std::numeric_limits<float>::max()
                                           : std::numeric_limits<double>::max();
    for (int64_t d = 1; d <= 8; ++d) {
      std::vector<at::Tensor> cases;
      cases.push_back(at::zeros({1, d, 5}, dtype));       // exact zeros
      cases.push_back(at::full({1, d, 5}, -0.0, dtype));  // negative zeros
      cases.push_back(at::full({1, d, 5}, big, dtype));   // the largest finite value
      cases.push_back(at::full({1, d, 5}, -big, dtype));
      // Random signs at magnitude 1e30: continuants up to 1e240 overflow float32 (and double at d=8
      // with 1e300); f ~ 1/a_1.
      const double huge = dtype == at::kFloat ? 1e30 : 1e300;
      const at::Tensor signs = uniform({1, d, 64}, -1, 1, at::kDouble, 500 + d).sign();
      cases.push_back((signs * huge).to(dtype));
      for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
        for (size_t c = 0; c < cases.size(); ++c) {
          const at::Tensor& a = cases[c];
          const at::Tensor g = at::ones({1, a.size(2)}, dtype);
          auto [f, grad] = test::value_and_grad(
              [mode](const at::Tensor& x) {
                return continuant(x, ContinuantOptions().backward(mode));
              },
              a, g);
          EXPECT_TRUE(f.isfinite().all().item<bool>()) << "f, case " << c << " d=" << d;
          EXPECT_TRUE(grad.isfinite().all().item<bool>()) << "grad, case " << c << " d=" << d;
        }
      }
      // Zeros mixed with huge values (float32 against float64, where 1e30^8 still fits).
      if (dtype == at::kFloat) {
        const at::Tensor mixed =
            (signs * 1e30).masked_fill(signs.gt(0.0) & (at::arange(64) % 3 == 0), 0).to(dtype);
        const at::Tensor g = at::ones({1, 64}, dtype);
        for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
          auto fn = [mode](const at::Tensor& x) {
            return continuant(x, ContinuantOptions().backward(mode));
          };
          auto [f32, g32] = test::value_and_grad(fn, mixed, g);
          auto [f64, g64] = test::value_and_grad(fn, mixed.to(at::kDouble), g.to(at::kDouble));
          const at::Tensor fits = g64.abs() <= std::numeric_limits<float>::max();
          ASSERT_TRUE(g64.isfinite().all().item<bool>());
          EXPECT_TRUE(f32.isfinite().all().item<bool>()) << "mixed f, d=" << d;
          EXPECT_TRUE(at::equal(g32.isfinite(), fits)) << "mixed grad finite iff it fits, d=" << d;
          expect_close(g32, g64, 1e-5, 1e-37, "mixed grad, d=" + std::to_string(d), fits);
          expect_close(f32, f64, 1e-5, 1e-37, "mixed f, d=" + std::to_string(d));
        }
      }
      // All-huge ladders: f = 1/(a_1 + O(1/a_2)) ~ 1/a_1, to dtype accuracy.
      const at::Tensor a = (signs * huge).to(dtype);
      const at::Tensor f = continuant(a);
      expect_close(f, 1.0 / a.select(1, 0).to(at::kDouble), 1e-6, 0,
                   "f = 1/a_1 for huge inputs, d=" + std::to_string(d));
    }
  }
}

// Non-finite inputs (stated behaviour, not guarded): a NaN anywhere in a ladder makes that ladder's
// f and gradient NaN and leaves the other ladders bitwise unchanged. +-inf follows IEEE arithmetic
// through the recurrence: at d = 1, f(+-inf) = +-0; deeper ladders give inf/inf = NaN.
TEST(ContinuantPoleGuard, NonFiniteInputs) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor clean = uniform({2, 5, 33}, 0.5, 2, dtype, 600);
    at::Tensor dirty = clean.clone();
    dirty[1][2][7] = nan;
    const at::Tensor g = at::ones({2, 33}, dtype);
    auto [f0, g0] =
        test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, clean, g);
    auto [f1, g1] =
        test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, dirty, g);
    EXPECT_TRUE(std::isnan(f1[1][7].item<double>()));
    EXPECT_TRUE(g1.select(0, 1).select(-1, 7).isnan().all().item<bool>());
    at::Tensor other = at::ones({2, 33}, at::kBool);
    other[1][7] = false;
    EXPECT_TRUE(at::equal(f1.masked_select(other), f0.masked_select(other)));
    EXPECT_TRUE(at::equal(g1.masked_select(other.unsqueeze(1).expand_as(g1)),
                          g0.masked_select(other.unsqueeze(1).expand_as(g0))));

    const at::Tensor d1 = at::tensor({inf, -inf}, at::kDouble).to(dtype).reshape({1, 1, 2});
    const at::Tensor f_d1 = continuant(d1);
    EXPECT_EQ(f_d1[0][0].item<double>(), 0.0);
    EXPECT_FALSE(std::signbit(f_d1[0][0].item<double>()));
    EXPECT_EQ(f_d1[0][1].item<double>(), 0.0);
    EXPECT_TRUE(std::signbit(f_d1[0][1].item<double>()));
    const at::Tensor d2 = at::tensor({1.0, inf}, at::kDouble).to(dtype).reshape({1, 2, 1});
    EXPECT_TRUE(std::isnan(continuant(d2).item<double>()));
  }
}

// Property 7: zeros of inner tail continuants are removable; the continuant form gives the finite
// value where the literal ladder's guarded inner reciprocal does not.
TEST(ContinuantRemovablePole, InnerTailZeroGivesFiniteValue) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    // d = 3, a_3 = 0: K_1 = 0, K_2 = 1, K_3 = a_1, so f = 1/a_1.
    const at::Tensor a = at::tensor({1.5, -0.75, 4.0, 2.0, 3.0, -5.0, 0.0, 0.0, 0.0}, at::kDouble)
                             .to(dtype)
                             .reshape({1, 3, 3});
    const at::Tensor f = continuant(a);
    expect_close(f, 1.0 / a.select(1, 0).to(at::kDouble), 4e-7, 0, "f = 1/a_1 when a_3 = 0");
    // Gradient (Proposition 1 with K_0 = 1, K_1 = 0, K_2 = 1, K_3 = a_1): (-1/a_1^2, 0, -1/a_1^2).
    auto [v, grad] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a,
                                          at::ones({1, 3}, dtype));
    const at::Tensor inv_sq = (1.0 / a.select(1, 0).to(at::kDouble)).square();
    expect_close(grad.select(1, 0), -inv_sq, 1e-6, 0, "df/da_1");
    expect_close(grad.select(1, 1), at::zeros_like(inv_sq), 0, 0, "df/da_2");
    expect_close(grad.select(1, 2), -inv_sq, 1e-6, 0, "df/da_3");
    // d = 3 with K_2 = a_2 a_3 + 1 = 0 (a_2 = -0.5, a_3 = 2): f = 0 exactly, K_3 = a_3.
    const at::Tensor b = at::tensor({0.25, -0.5, 2.0}, at::kDouble).to(dtype).reshape({1, 3, 1});
    EXPECT_EQ(continuant(b).item<double>(), 0.0);
    // The literal ladder divides by a_2 + 1/a_3 = 0 and its guard gives 1/(0.25 + 1/eps) instead.
    EXPECT_NEAR(continuant_literal(b).item<double>(), 1.0 / (0.25 + 100.0), 1e-6);
  }
}

// Property 9: fused = reference (forward and both gradients) across sizes that include 1, primes,
// non-multiples of the vector width and of the tile, leading dimensions and non-contiguous input.
TEST(ContinuantFusedVsReference, ForwardAndGradients) {
  struct Case {
    std::vector<int64_t> shape;  // (..., d, L)
  };
  const std::vector<Case> cases = {{{1, 1, 1}},    {{1, 8, 1}},    {{3, 5, 7}},      {{13, 4, 97}},
                                   {{2, 8, 1031}}, {{64, 6, 600}}, {{2, 3, 2, 513}}, {{5, 1, 9}}};
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
      for (size_t c = 0; c < cases.size(); ++c) {
        const auto& shape = cases[c].shape;
        // U(-3, 3): a few percent of ladders sit inside the clamp, exercising both branches.
        const at::Tensor a = uniform(shape, -3, 3, dtype, 700 + c);
        std::vector<int64_t> out_shape(shape.begin(), shape.end());
        out_shape.erase(out_shape.end() - 2);
        const at::Tensor g = uniform(out_shape, -1, 1, dtype, 800 + c);
        auto opts = ContinuantOptions().backward(mode);
        auto [f1, g1] =
            test::value_and_grad([&](const at::Tensor& x) { return continuant(x, opts); }, a, g);
        auto [f2, g2] = test::value_and_grad(
            [&](const at::Tensor& x) { return continuant_reference(x, opts); }, a, g);
        const std::string tag = std::string(" dtype=") + c10::toString(dtype) +
                                " mode=" + to_string(mode) + " case=" + std::to_string(c);
        // Surrogate mode: the same operations in the same order, so bitwise equal.
        if (mode == ContinuantBackward::kSurrogate) {
          EXPECT_TRUE(bitwise_equal(f1, f2)) << "f" << tag;
          EXPECT_TRUE(bitwise_equal(g1, g2)) << "grad" << tag;
        }
        // The bound, both modes (exact mode inside the clamp: long double vs autograd).
        expect_close(f1, f2, 1e-6, 0, "f" + tag);
        expect_close(g1, g2, 1e-6, 1e-6 * g2.abs().max().item<double>() * 1e-3, "grad" + tag);
      }
    }
  }
}

TEST(ContinuantFusedVsReference, NonContiguousInput) {
  // (L, d, R) transposed to (R, d, L): a strided view.
  const at::Tensor base = uniform({37, 6, 11}, -3, 3, at::kFloat, 900);
  const at::Tensor a = base.transpose(0, 2);
  ASSERT_FALSE(a.is_contiguous());
  const at::Tensor g = uniform({11, 37}, -1, 1, at::kFloat, 901);
  auto [f1, g1] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a, g);
  auto [f2, g2] = test::value_and_grad([](const at::Tensor& x) { return continuant_reference(x); },
                                       a.contiguous(), g);
  EXPECT_TRUE(bitwise_equal(f1, f2));
  EXPECT_TRUE(bitwise_equal(g1.contiguous(), g2));
}

TEST(ContinuantFusedVsReference, BFloat16ComputesInFloat32) {
  const at::Tensor a = uniform({4, 5, 77}, 0.5, 3, at::kBFloat16, 910);
  const at::Tensor g = uniform({4, 77}, -1, 1, at::kBFloat16, 911);
  auto [f, grad] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); }, a, g);
  EXPECT_EQ(f.scalar_type(), at::kBFloat16);
  EXPECT_EQ(grad.scalar_type(), at::kBFloat16);
  // Same as the float32 kernel on the widened input, rounded once at the end.
  auto [f32, grad32] = test::value_and_grad([](const at::Tensor& x) { return continuant(x); },
                                            a.to(at::kFloat), g.to(at::kFloat));
  EXPECT_TRUE(bitwise_equal(f, f32.to(at::kBFloat16)));
  EXPECT_TRUE(bitwise_equal(grad, grad32.to(at::kBFloat16)));
  // The reference does the same.
  auto [fr, gr] =
      test::value_and_grad([](const at::Tensor& x) { return continuant_reference(x); }, a, g);
  EXPECT_TRUE(bitwise_equal(f, fr));
  EXPECT_TRUE(bitwise_equal(grad, gr));
}

// Property 9: no dependence on thread count, batch composition or instruction set.
TEST(ContinuantDeterminism, ThreadCountBatchAndIsa) {
  const at::Tensor a = uniform({64, 8, 1031}, -3, 3, at::kFloat, 1000);
  const at::Tensor g = uniform({64, 1031}, -1, 1, at::kFloat, 1001);
  auto run = [&](const at::Tensor& x, const at::Tensor& gx) {
    return test::value_and_grad([](const at::Tensor& y) { return continuant(y); }, x, gx);
  };
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  auto one = run(a, g);
  at::set_num_threads(2);
  auto two = run(a, g);
  at::set_num_threads(threads_before);
  EXPECT_TRUE(bitwise_equal(one.first, two.first)) << "f, 1 vs 2 threads";
  EXPECT_TRUE(bitwise_equal(one.second, two.second)) << "grad, 1 vs 2 threads";
  // Rows evaluated one at a time, and a ladder slice, give the same bits as the whole batch.
  for (int64_t row : {0, 17, 63}) {
    auto single = run(a.slice(0, row, row + 1), g.slice(0, row, row + 1));
    EXPECT_TRUE(bitwise_equal(single.first, one.first.slice(0, row, row + 1))) << "row " << row;
    EXPECT_TRUE(bitwise_equal(single.second, one.second.slice(0, row, row + 1))) << "row " << row;
  }
  auto narrow = run(a.slice(2, 3, 40).contiguous(), g.slice(1, 3, 40).contiguous());
  EXPECT_TRUE(bitwise_equal(narrow.first, one.first.slice(1, 3, 40).contiguous()));
  EXPECT_TRUE(bitwise_equal(narrow.second, one.second.slice(2, 3, 40).contiguous()));
  // Baseline (SSE2) and AVX2 builds of the loops.
  if (kernels::continuant_cpu_isa() == "avx2") {
    kernels::set_continuant_cpu_isa("baseline");
    auto base = run(a, g);
    kernels::set_continuant_cpu_isa("auto");
    EXPECT_TRUE(bitwise_equal(base.first, one.first)) << "f, baseline vs avx2";
    EXPECT_TRUE(bitwise_equal(base.second, one.second)) << "grad, baseline vs avx2";
  } else {
    GTEST_LOG_(INFO) << "no AVX2 on this CPU: ISA comparison skipped";
  }
}

// Property 10: gradients from stored continuants are bitwise those from recomputed ones.
TEST(ContinuantRecompute, StoredAndRecomputedGiveSameBits) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
      for (int64_t d : {1, 2, 3, 8}) {
        at::Tensor a = uniform({9, d, 301}, -3, 3, dtype, 1100 + d);
        a[0][0][0] = 1e30;  // one overflowing ladder takes the slow path in both variants
        const at::Tensor g = uniform({9, 301}, -1, 1, dtype, 1200 + d);
        auto base = ContinuantOptions().backward(mode);
        auto saved = ContinuantOptions().backward(mode).save_continuants(true);
        auto x =
            test::value_and_grad([&](const at::Tensor& y) { return continuant(y, base); }, a, g);
        auto y =
            test::value_and_grad([&](const at::Tensor& z) { return continuant(z, saved); }, a, g);
        EXPECT_TRUE(bitwise_equal(x.first, y.first)) << "f d=" << d;
        EXPECT_TRUE(bitwise_equal(x.second, y.second)) << "grad d=" << d << " " << to_string(mode);
      }
    }
  }
}

TEST(ContinuantApi, InferenceImplementationsAndErrors) {
  const at::Tensor a = uniform({3, 4, 50}, -3, 3, at::kFloat, 1300);
  // The no-grad path (no cached reciprocal) gives the autograd path's bits.
  const at::Tensor f_inference = continuant(a);
  const at::Tensor f_train = continuant(a.clone().set_requires_grad(true)).detach();
  EXPECT_TRUE(bitwise_equal(f_inference, f_train));
  // impl selects the implementation.
  EXPECT_TRUE(bitwise_equal(continuant(a, test::reference()), continuant_reference(a)));
  EXPECT_TRUE(bitwise_equal(continuant(a, test::literal()), continuant_literal(a)));
  for (auto impl : {ContinuantImpl::kFused, ContinuantImpl::kReference, ContinuantImpl::kLiteral}) {
    EXPECT_EQ(parse_continuant_impl(to_string(impl)), impl);
  }
  for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
    EXPECT_EQ(parse_continuant_backward(to_string(mode)), mode);
  }
  EXPECT_THROW(parse_continuant_impl("fast"), cemfrac::Error);
  EXPECT_THROW(parse_continuant_backward("approx"), cemfrac::Error);
  // Argument errors name the argument.
  EXPECT_THROW(continuant(at::ones({5}, at::kFloat)), c10::Error);
  EXPECT_THROW(continuant(at::ones({2, 0, 5}, at::kFloat)), c10::Error);
  EXPECT_THROW(continuant(at::ones({2, 3, 5}, at::kInt)), c10::Error);
  EXPECT_THROW(continuant(a, ContinuantOptions().eps(-1)), c10::Error);
  // Zero ladders or rows: empty output of the right shape.
  EXPECT_EQ(continuant(at::ones({0, 3, 5})).sizes(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(continuant(at::ones({2, 3, 0})).sizes(), (std::vector<int64_t>{2, 0}));
  // float16 has no kernel of its own: computed in float32 like bfloat16.
  const at::Tensor half = uniform({2, 3, 10}, 0.5, 2, at::kHalf, 1301);
  EXPECT_TRUE(bitwise_equal(continuant(half), continuant(half.to(at::kFloat)).to(at::kHalf)));
}

}  // namespace
}  // namespace cemfrac

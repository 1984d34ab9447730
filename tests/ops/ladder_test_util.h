// Helpers shared by the ladder tests (tests/ops/continuant*_test.cpp).
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cemfrac/ops/continuant.h"

namespace cemfrac::test {

// Uniform(lo, hi) of the given shape and dtype from a seeded generator.
inline at::Tensor uniform(std::vector<int64_t> shape, double lo, double hi, at::ScalarType dtype,
                          uint64_t seed) {
  torch::manual_seed(seed);
  return torch::rand(shape, torch::dtype(torch::kDouble)).mul(hi - lo).add(lo).to(dtype);
}

// dLoss/da for Loss = sum(f * g): runs f = fn(a) and its backward.
template <typename Fn>
std::pair<at::Tensor, at::Tensor> value_and_grad(Fn fn, const at::Tensor& a_in,
                                                 const at::Tensor& g) {
  at::Tensor a = a_in.detach().clone().set_requires_grad(true);
  at::Tensor f = fn(a);
  at::Tensor grad = torch::autograd::grad({f}, {a}, {g})[0];
  return {f.detach(), grad};
}

// Every ladder's tails |K_1|..|K_d| are >= bound: mask of shape (..., L).
inline at::Tensor tails_at_least(const at::Tensor& a, double bound) {
  at::Tensor tails = continuant_tails_reference(a.to(at::kDouble)).abs();  // (..., d+1, L)
  return std::get<0>(tails.min(-2)) >= bound;                              // K_0 = 1 never decides
}

// EXPECTs |actual - expected| <= rtol |expected| + atol elementwise over `mask` (all when
// undefined); on failure prints the worst element with both values and the max abs / rel errors.
inline void expect_close(const at::Tensor& actual_in, const at::Tensor& expected_in, double rtol,
                         double atol, const std::string& what, const at::Tensor& mask = {}) {
  at::Tensor actual = actual_in.detach().to(at::kDouble).reshape(-1);
  at::Tensor expected = expected_in.detach().to(at::kDouble).reshape(-1);
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  at::Tensor m = mask.defined() ? mask.reshape(-1).to(at::kBool) : at::ones_like(actual, at::kBool);
  at::Tensor err = (actual - expected).abs();
  at::Tensor excess = (err - (expected.abs() * rtol + atol)).masked_fill(~m, -1.0);
  // NaN anywhere in the compared set is a failure too.
  at::Tensor nan = (actual.isnan() | expected.isnan()) & m;
  const int64_t worst = excess.argmax().item<int64_t>();
  const bool ok = excess.max().item<double>() <= 0 && !nan.any().item<bool>();
  if (!ok) {
    at::Tensor rel = err / expected.abs().clamp_min(1e-300);
    std::ostringstream msg;
    msg.precision(17);
    msg << what << ": worst element " << worst << " actual " << actual[worst].item<double>()
        << " expected " << expected[worst].item<double>() << "; max abs err "
        << err.masked_fill(~m, 0).max().item<double>() << ", max rel err "
        << rel.masked_fill(~m, 0).max().item<double>() << " (rtol " << rtol << ", atol " << atol
        << "), NaNs " << nan.sum().item<int64_t>();
    ADD_FAILURE() << msg.str();
  }
}

// Bitwise equality (NaNs at the same places count as equal).
inline bool bitwise_equal(const at::Tensor& x, const at::Tensor& y) {
  if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) return false;
  at::Tensor xc = x.contiguous();
  at::Tensor yc = y.contiguous();
  return std::memcmp(xc.data_ptr(), yc.data_ptr(), xc.nbytes()) == 0;
}

inline ContinuantOptions fused() {
  return ContinuantOptions();
}
inline ContinuantOptions reference() {
  return ContinuantOptions().impl(ContinuantImpl::kReference);
}
inline ContinuantOptions literal() {
  return ContinuantOptions().impl(ContinuantImpl::kLiteral);
}

}  // namespace cemfrac::test

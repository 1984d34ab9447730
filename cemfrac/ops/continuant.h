// Continued-fraction ladders as one differentiable function (CoFrGeNet spec §2; our notes:
// docs/layers/ladders.md).
//
//   f = 1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)) = K_{d-1} / K̂_d
//
// for every ladder of a tensor `a` laid out (..., d, L): leading dimensions are rows (tokens), d is
// the ladder depth, L the ladders of one row, ladder index fastest (each step of the continuant
// recurrence is then one contiguous multiply-add over L). The result has shape (..., L). K̂_d is the
// sign-preserving clamp sgn(K_d) max(|K_d|, eps), sgn(0) = +1.
//
// Three implementations of the same function, chosen by ContinuantOptions::impl:
//   kFused      custom autograd Function over the fused CPU kernel
//   (kernels/cpu/continuant_cpu.cpp):
//               one reciprocal per ladder, Proposition 1 backward with continuants recomputed from
//               a. Devices and dtypes without a kernel fall back to kReference.
//   kReference  continuant_reference(): the same math in ATen ops, gradient by autograd. Test
//   oracle
//               and fallback.
//   kLiteral    continuant_literal(): the nested fraction evaluated innermost-out with d guarded
//               reciprocals, differentiated by autograd (the paper's "CoFrGeNet-B" baseline). A
//               different function near poles: it clamps every inner tail instead of K_d only.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <string>

#include "cemfrac/ops/continuant_modes.h"

namespace cemfrac {

std::string to_string(ContinuantImpl impl);                     // "fused", "reference", "literal"
std::string to_string(ContinuantBackward backward);             // "surrogate", "exact"
ContinuantImpl parse_continuant_impl(const std::string& name);  // throws cemfrac::Error
ContinuantBackward parse_continuant_backward(const std::string& name);

struct ContinuantOptions {
  /// Pole guard: |K̂_d| >= eps. 0 gives the unguarded map (division by zero at a pole).
  TORCH_ARG(double, eps) = 0.01;
  /// Gradient inside the clamp (identical outside it).
  TORCH_ARG(ContinuantBackward, backward) = ContinuantBackward::kSurrogate;
  /// Which implementation evaluates the function.
  TORCH_ARG(ContinuantImpl, impl) = ContinuantImpl::kFused;
  /// kFused only: store the continuants K_{d-k} in the forward instead of recomputing them from `a`
  /// in the backward (d more values per ladder of memory; same gradient bits). For tests/ablation.
  TORCH_ARG(bool, save_continuants) = false;
};

/// The ladder function, differentiable in `a`. a: (..., d, L) floating, d >= 1; returns (..., L) in
/// a's dtype. float32 and float64 run in their own precision; bfloat16 and float16 are computed in
/// float32. First-order gradients only for kFused (its backward is not itself differentiable).
at::Tensor continuant(const at::Tensor& a, const ContinuantOptions& options = {});

/// kReference: continuants by the recurrence in ATen ops (bitwise the kernel's forward), gradient
/// by autograd. Plain autograd through K_{d-1}/K̂_d would take the quotient rule, whose two terms
/// cancel catastrophically (relative error ~ eps_machine K_d^2); the reference instead lets
/// autograd differentiate  sum_k w_k (a_k - a_k.detach())  with w_k = (-1)^k (K_{d-k} r)^2 computed
/// without gradient (value 0, gradient Proposition 1). In exact mode, ladders inside the clamp are
/// differentiated by autograd through K_{d-1} * r with r held constant. Any device.
at::Tensor continuant_reference(const at::Tensor& a, const ContinuantOptions& options = {});

/// kLiteral: t_d = rho(a_d), t_k = rho(a_k + t_{k+1}), f = t_1 with rho(z) = 1 / (sgn(z) max(|z|,
/// eps)), differentiated by autograd. Equal to continuant() whenever no guard is active in either.
at::Tensor continuant_literal(const at::Tensor& a, const ContinuantOptions& options = {});

/// The tail continuants K_0..K_d of every ladder, (..., d+1, L) with K_j at index j, unguarded, in
/// a's dtype (reduced floating types in float32). For tests and docs.
at::Tensor continuant_tails_reference(const at::Tensor& a);

}  // namespace cemfrac

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
//   kFused      the dispatcher operator cemfrac::continuant (ops/library.h): on the CPU the fused
//               kernel (kernels/cpu/continuant_cpu.cpp), one reciprocal per ladder; on the meta
//               device shapes only; on any other device the ATen twin. Its Autograd kernel's
//               backward is the operator cemfrac::continuant_backward (Proposition 1, continuants
//               recomputed from a), itself differentiable: under create_graph it is the closed form
//               in ATen ops, so second derivatives are exact.
//   kReference  continuant_reference(): the twin's forward and the same closed-form backward in
//               ATen ops, as one autograd node on any device. Test oracle; twice differentiable.
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
/// float32. Differentiable twice (and more) in every implementation.
at::Tensor continuant(const at::Tensor& a, const ContinuantOptions& options = {});

/// kReference: continuants by the recurrence in ATen ops (bitwise the kernel's forward). Gradient:
/// the closed form of Proposition 1, df/da_k = (-1)^k (K_{d-k} r)^2 with r = 1/K̂_d, in ATen ops of
/// a (not autograd through K_{d-1}/K̂_d: the quotient rule's two terms cancel catastrophically,
/// relative error ~ eps_machine K_d^2). In exact mode, ladders inside the clamp take
/// df/da_k = r K(a_2..a_{k-1}) K_{d-k}. Autograd differentiates that closed form, so second
/// derivatives are those of the ladder. Any device.
at::Tensor continuant_reference(const at::Tensor& a, const ContinuantOptions& options = {});

/// kLiteral: t_d = rho(a_d), t_k = rho(a_k + t_{k+1}), f = t_1 with rho(z) = 1 / (sgn(z) max(|z|,
/// eps)), differentiated by autograd. Equal to continuant() whenever no guard is active in either.
at::Tensor continuant_literal(const at::Tensor& a, const ContinuantOptions& options = {});

/// The tail continuants K_0..K_d of every ladder, (..., d+1, L) with K_j at index j, unguarded, in
/// a's dtype (reduced floating types in float32). For tests and docs.
at::Tensor continuant_tails_reference(const at::Tensor& a);

}  // namespace cemfrac

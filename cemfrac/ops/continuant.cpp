// continuant(): the ladder function with its three implementations (see continuant.h).
#include "cemfrac/ops/continuant.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/library.h"

namespace cemfrac {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Argument checks shared by all implementations; `where` names the caller in messages.
void check_ladder_input(const at::Tensor& a, const ContinuantOptions& options, const char* where) {
  TORCH_CHECK(a.defined(), where, ": argument 'a' is undefined");
  TORCH_CHECK(a.dim() >= 2, where, ": argument 'a' must be (..., depth, ladders), got shape ",
              a.sizes());
  TORCH_CHECK(a.size(-2) >= 1, where, ": ladder depth (a.size(-2)) must be >= 1, got shape ",
              a.sizes());
  TORCH_CHECK(at::isFloatingType(a.scalar_type()), where,
              ": argument 'a' must be floating point, got ", a.scalar_type());
  TORCH_CHECK(options.eps() >= 0, where, ": eps must be >= 0, got ", options.eps());
}

// bfloat16 and float16 are computed in float32 (continuants overflow float16 quickly, spec §2.7).
at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kBFloat16 || t == at::kHalf) ? at::kFloat : t;
}

// Output shape (..., L) of an (..., d, L) input.
std::vector<int64_t> output_shape(const at::Tensor& a) {
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
  shape.erase(shape.end() - 2);
  return shape;
}

// The (R, d, L) view of `a` in the kernel's dtype, contiguous.
at::Tensor as_rows(const at::Tensor& a) {
  const int64_t d = a.size(-2);
  const int64_t L = a.size(-1);
  int64_t rows = 1;
  for (int64_t i = 0; i + 2 < a.dim(); ++i) rows *= a.size(i);
  return a.to(compute_type(a.scalar_type())).contiguous().reshape({rows, d, L});
}

// ---- Fused kernels: the loops of kernels/cpu/continuant_cpu.cpp (CPU) and, in a CUDA build,
// kernels/cuda/continuant_cuda.cu (CUDA). One wrapper per op, instantiated per device's kernels.

using ForwardKernel = void (*)(const at::Tensor& a, double eps, const at::Tensor& f,
                               const at::Tensor& r, const at::Tensor& k_saved);
using BackwardKernel = void (*)(const at::Tensor& a, const at::Tensor& r,
                                const at::Tensor& k_saved, const at::Tensor& grad_f, double eps,
                                bool exact, const at::Tensor& grad_a);

// cemfrac::continuant without autograd (inference): no reciprocal kept.
template <ForwardKernel kForward>
at::Tensor continuant_fused(const at::Tensor& a, double eps, bool /*exact*/,
                            bool /*save_continuants*/) {
  check_ladder_input(a, ContinuantOptions().eps(eps), "cemfrac::continuant");
  const at::Tensor rows = as_rows(a);
  at::Tensor f = at::empty({rows.size(0), rows.size(2)}, rows.options());
  kForward(rows, eps, f, at::Tensor(), at::Tensor());
  return f.reshape(output_shape(a)).to(a.scalar_type());
}

// cemfrac::continuant_forward: f, r = 1/K̂_d and (when asked) the continuants.
template <ForwardKernel kForward>
std::tuple<at::Tensor, at::Tensor, at::Tensor> continuant_forward_fused(const at::Tensor& a,
                                                                        double eps,
                                                                        bool save_continuants) {
  check_ladder_input(a, ContinuantOptions().eps(eps), "cemfrac::continuant_forward");
  const at::Tensor rows = as_rows(a);  // (R, d, L)
  const int64_t R = rows.size(0), L = rows.size(2);
  at::Tensor f = at::empty({R, L}, rows.options());
  at::Tensor r = at::empty({R, L}, rows.options());
  at::Tensor k = save_continuants ? at::empty_like(rows) : at::Tensor();
  kForward(rows, eps, f, r, k);
  std::vector<int64_t> shape = output_shape(a);
  return {f.reshape(shape).to(a.scalar_type()), r.reshape(shape),
          save_continuants ? k.reshape(a.sizes()) : at::empty({0}, rows.options())};
}

// cemfrac::continuant_backward: Proposition 1 (or the exact clamped derivative).
template <BackwardKernel kBackward>
at::Tensor continuant_backward_fused(const at::Tensor& grad_f, const at::Tensor& a,
                                     const at::Tensor& r, const at::Tensor& k, double eps,
                                     bool exact) {
  const at::Tensor rows = as_rows(a);
  const int64_t R = rows.size(0), L = rows.size(2);
  const at::Tensor r_rows = r.to(rows.scalar_type()).contiguous().reshape({R, L});
  const at::Tensor k_rows =
      k.numel() == 0 ? at::Tensor() : k.to(rows.scalar_type()).contiguous().reshape(rows.sizes());
  const at::Tensor g = grad_f.to(rows.scalar_type()).contiguous().reshape({R, L});
  at::Tensor grad_a = at::empty_like(rows);
  kBackward(rows, r_rows, k_rows, g, eps, exact, grad_a);
  return grad_a.reshape(a.sizes()).to(a.scalar_type());
}

// ---- The ATen twin: every other backend, and the reference implementation ------------------------

// Tail continuants K_0..K_d of x (..., d, L); tails[j] = K_j (the kernel's recurrence, same bits).
std::vector<at::Tensor> tail_continuants(const at::Tensor& x) {
  const int64_t d = x.size(-2);
  std::vector<at::Tensor> tails;
  at::Tensor prev = at::zeros_like(x.select(-2, 0));  // K_{-1}
  at::Tensor cur = at::ones_like(prev);               // K_0
  tails.push_back(cur);
  for (int64_t k = d; k >= 1; --k) {
    at::Tensor next = x.select(-2, k - 1) * cur + prev;  // K_{d-k+1} = a_k K_{d-k} + K_{d-k-1}
    prev = cur;
    cur = next;
    tails.push_back(cur);
  }
  return tails;
}

// r = 1 / K̂_d with K̂_d = sgn(K_d) max(|K_d|, eps), sgn(0) = +1.
at::Tensor guarded_reciprocal_of(const at::Tensor& kd, double eps) {
  return at::where(kd >= 0, kd.clamp_min(eps), kd.clamp_max(-eps)).reciprocal();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> continuant_forward_twin(const at::Tensor& a,
                                                                       double eps,
                                                                       bool save_continuants) {
  check_ladder_input(a, ContinuantOptions().eps(eps), "cemfrac::continuant_forward");
  const at::Tensor x = a.to(compute_type(a.scalar_type()));
  const int64_t d = x.size(-2);
  const std::vector<at::Tensor> tails = tail_continuants(x);
  const at::Tensor r = guarded_reciprocal_of(tails[d], eps);
  const at::Tensor f = (tails[d - 1] * r).to(a.scalar_type());
  at::Tensor k = at::empty({0}, x.options());
  if (save_continuants) {
    std::vector<at::Tensor> ks;  // K_{d-k} at index k-1
    for (int64_t j = 1; j <= d; ++j) ks.push_back(tails[d - j]);
    k = at::stack(ks, -2);
  }
  return {f, r, k};
}

at::Tensor continuant_twin(const at::Tensor& a, double eps, bool /*exact*/,
                           bool /*save_continuants*/) {
  return std::get<0>(continuant_forward_twin(a, eps, false));
}

// The backward's closed form in ATen ops, recomputing everything from a (r and k are not read:
// they are a function of a, and reading them would cut the second derivative's path through them).
// Built from differentiable ops only, so autograd differentiates it exactly: the second derivative
// of the ladder (kernels/cpu/continuant_cpu.cpp states the formulas).
//   grad a_k = g (-1)^k (K_{d-k} r)^2                       (Proposition 1, K̂_d in r)
//   exact, |K_d| < eps:  grad a_k = g r H_k K_{d-k}      (H_k = K(a_2..a_{k-1}), H_1 = 0, H_2 = 1)
at::Tensor continuant_backward_closed_form(const at::Tensor& grad_f, const at::Tensor& a, double eps,
                                           bool exact) {
  const at::Tensor x = a.to(compute_type(a.scalar_type()));
  const int64_t d = x.size(-2);
  const std::vector<at::Tensor> tails = tail_continuants(x);
  const at::Tensor r = guarded_reciprocal_of(tails[d], eps);
  const at::Tensor g = grad_f.to(x.scalar_type());
  std::vector<at::Tensor> grads;
  for (int64_t k = 1; k <= d; ++k) {
    const at::Tensor q = tails[d - k] * r;
    grads.push_back((k % 2 == 1) ? -(q * q) * g : (q * q) * g);
  }
  at::Tensor grad_a = at::stack(grads, -2);
  if (exact) {
    std::vector<at::Tensor> inside_grads;
    at::Tensor h_prev = at::zeros_like(tails[0]);  // H_1 = K(empty) of the "a_2..a_0" block: 0
    at::Tensor h = at::ones_like(tails[0]);        // H_2 = 1
    for (int64_t k = 1; k <= d; ++k) {
      const at::Tensor& h_k = k == 1 ? h_prev : h;
      inside_grads.push_back(r * h_k * tails[d - k] * g);
      if (k >= 2) {  // H_{k+1} = a_k H_k + H_{k-1}
        at::Tensor next = x.select(-2, k - 1) * h + h_prev;
        h_prev = h;
        h = next;
      }
    }
    const at::Tensor inside = (tails[d].abs() < eps).unsqueeze(-2);
    grad_a = at::where(inside, at::stack(inside_grads, -2), grad_a);
  }
  return grad_a.to(a.scalar_type());
}

at::Tensor continuant_backward_twin(const at::Tensor& grad_f, const at::Tensor& a,
                                    const at::Tensor& /*r*/, const at::Tensor& /*k*/, double eps,
                                    bool exact) {
  return continuant_backward_closed_form(grad_f, a, eps, exact);
}

// ---- Meta kernels: shapes and dtypes only ----------------------------------------------------------

at::Tensor continuant_meta(const at::Tensor& a, double eps, bool, bool) {
  check_ladder_input(a, ContinuantOptions().eps(eps), "cemfrac::continuant");
  return at::empty(output_shape(a), a.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> continuant_forward_meta(const at::Tensor& a,
                                                                       double eps,
                                                                       bool save_continuants) {
  check_ladder_input(a, ContinuantOptions().eps(eps), "cemfrac::continuant_forward");
  const auto wide = a.options().dtype(compute_type(a.scalar_type()));
  return {at::empty(output_shape(a), a.options()), at::empty(output_shape(a), wide),
          save_continuants ? at::empty(a.sizes(), wide) : at::empty({0}, wide)};
}

at::Tensor continuant_backward_meta(const at::Tensor&, const at::Tensor& a, const at::Tensor&,
                                    const at::Tensor&, double, bool) {
  return at::empty(a.sizes(), a.options());
}

// ---- Autograd ---------------------------------------------------------------------------------

using ForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, double, bool);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, double, bool);
using LadderSig = at::Tensor(const at::Tensor&, double, bool, bool);

// The ladder as one autograd node: forward through cemfrac::continuant_forward (the device's
// kernel), backward through cemfrac::continuant_backward, which is differentiable again (its own
// Autograd kernel below).
struct ContinuantFunction : public torch::autograd::Function<ContinuantFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, double eps, bool exact,
                            bool save_continuants) {
    static const auto forward_op = ops::op<ForwardSig>("continuant_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [f, r, k] = forward_op.call(a, eps, save_continuants);
    ctx->save_for_backward({a, r, k});  // a itself: a second derivative flows back to it
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["exact"] = exact;
    return f;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    static const auto backward_op = ops::op<BackwardSig>("continuant_backward");
    const at::Tensor& grad_f = grad_outputs[0];
    if (!grad_f.defined() || !ctx->needs_input_grad(0)) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto saved = ctx->get_saved_variables();
    return {backward_op.call(grad_f, saved[0], saved[1], saved[2],
                             ctx->saved_data["eps"].toDouble(), ctx->saved_data["exact"].toBool()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor continuant_autograd(const at::Tensor& a, double eps, bool exact, bool save_continuants) {
  if (at::GradMode::is_enabled() && a.requires_grad()) {
    return ContinuantFunction::apply(a, eps, exact, save_continuants);
  }
  static const auto ladder_op = ops::op<LadderSig>("continuant");
  at::AutoDispatchBelowADInplaceOrView below_autograd;  // inference: no r kept
  return ladder_op.call(a, eps, exact, save_continuants);
}

// The backward as a differentiable operator: under create_graph (grad mode on in the backward,
// an input requiring grad) it is the closed form in ATen ops, which autograd records and
// differentiates; otherwise the device's kernel.
at::Tensor continuant_backward_autograd(const at::Tensor& grad_f, const at::Tensor& a,
                                        const at::Tensor& r, const at::Tensor& k, double eps,
                                        bool exact) {
  if (at::GradMode::is_enabled() && (grad_f.requires_grad() || a.requires_grad())) {
    return continuant_backward_closed_form(grad_f, a, eps, exact);
  }
  static const auto backward_op = ops::op<BackwardSig>("continuant_backward");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return backward_op.call(grad_f, a, r, k, eps, exact);
}

// kReference: the twin's forward and the closed-form backward, as an autograd node on any device
// (no dispatcher: the reference of the fused operator, and the one without a kernel anywhere).
struct ReferenceFunction : public torch::autograd::Function<ReferenceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, double eps, bool exact) {
    ctx->save_for_backward({a});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["exact"] = exact;
    return std::get<0>(continuant_forward_twin(a, eps, false));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad_f = grad_outputs[0];
    if (!grad_f.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    return {continuant_backward_closed_form(grad_f, ctx->get_saved_variables()[0],
                                            ctx->saved_data["eps"].toDouble(),
                                            ctx->saved_data["exact"].toBool()),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::string to_string(ContinuantImpl impl) {
  return enum_name(impl);
}

std::string to_string(ContinuantBackward backward) {
  return enum_name(backward);
}

ContinuantImpl parse_continuant_impl(const std::string& name) {
  if (auto impl = enum_from_name<ContinuantImpl>(name)) return *impl;
  fail("unknown ladder implementation '{}' (expected fused, reference or literal)", name);
}

ContinuantBackward parse_continuant_backward(const std::string& name) {
  if (auto mode = enum_from_name<ContinuantBackward>(name)) return *mode;
  fail("unknown ladder backward '{}' (expected surrogate or exact)", name);
}

at::Tensor continuant(const at::Tensor& a, const ContinuantOptions& options) {
  check_ladder_input(a, options, "continuant");
  switch (options.impl()) {
    case ContinuantImpl::kReference: return continuant_reference(a, options);
    case ContinuantImpl::kLiteral: return continuant_literal(a, options);
    case ContinuantImpl::kFused: break;
  }
  static const auto ladder_op = ops::op<LadderSig>("continuant");
  return ladder_op.call(a, options.eps(), options.backward() == ContinuantBackward::kExact,
                        options.save_continuants());
}

at::Tensor continuant_tails_reference(const at::Tensor& a) {
  TORCH_CHECK(a.dim() >= 2 && a.size(-2) >= 1, "continuant_tails_reference: bad shape ", a.sizes());
  return at::stack(tail_continuants(a.to(compute_type(a.scalar_type()))), -2);
}

at::Tensor continuant_reference(const at::Tensor& a, const ContinuantOptions& options) {
  check_ladder_input(a, options, "continuant_reference");
  return ReferenceFunction::apply(a, options.eps(),
                                  options.backward() == ContinuantBackward::kExact);
}

at::Tensor continuant_literal(const at::Tensor& a, const ContinuantOptions& options) {
  check_ladder_input(a, options, "continuant_literal");
  const at::Tensor x = a.to(compute_type(a.scalar_type()));
  const int64_t d = x.size(-2);
  const double eps = options.eps();
  // rho(z) = 1 / (sgn(z) max(|z|, eps)), sgn(0) = +1.
  auto guarded_reciprocal = [eps](const at::Tensor& z) {
    return at::where(z >= 0, z.clamp_min(eps), z.clamp_max(-eps)).reciprocal();
  };
  at::Tensor t = guarded_reciprocal(x.select(-2, d - 1));  // t_d = rho(a_d)
  for (int64_t k = d - 1; k >= 1; --k) {
    t = guarded_reciprocal(x.select(-2, k - 1) + t);  // t_k = rho(a_k + t_{k+1})
  }
  return t.to(a.scalar_type());
}

extern const bool kContinuantKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  using namespace cemfrac;
  m.impl("continuant", &continuant_fused<&kernels::continuant_forward_cpu>);
  m.impl("continuant_forward", &continuant_forward_fused<&kernels::continuant_forward_cpu>);
  m.impl("continuant_backward", &continuant_backward_fused<&kernels::continuant_backward_cpu>);
}

#ifdef CEMFRAC_WITH_CUDA
// The same wrappers over the CUDA kernels (docs/gpu.md: compiled, never run on a GPU yet).
TORCH_LIBRARY_IMPL(cemfrac, CUDA, m) {
  using namespace cemfrac;
  m.impl("continuant", &continuant_fused<&kernels::continuant_forward_cuda>);
  m.impl("continuant_forward", &continuant_forward_fused<&kernels::continuant_forward_cuda>);
  m.impl("continuant_backward", &continuant_backward_fused<&kernels::continuant_backward_cuda>);
}
#endif

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("continuant", &cemfrac::continuant_meta);
  m.impl("continuant_forward", &cemfrac::continuant_forward_meta);
  m.impl("continuant_backward", &cemfrac::continuant_backward_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("continuant", &cemfrac::continuant_twin);
  m.impl("continuant_forward", &cemfrac::continuant_forward_twin);
  m.impl("continuant_backward", &cemfrac::continuant_backward_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("continuant", &cemfrac::continuant_autograd);
  m.impl("continuant_backward", &cemfrac::continuant_backward_autograd);
}

// continuant(): the ladder function with its three implementations (see continuant.h).
#include "cemfrac/ops/continuant.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <optional>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/kernels/kernels.h"

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

// Forward without autograd (inference): no reciprocal cached.
at::Tensor fused_forward_no_grad(const at::Tensor& a, const ContinuantOptions& options) {
  const at::Tensor rows = as_rows(a);
  at::Tensor f = at::empty({rows.size(0), rows.size(2)}, rows.options());
  kernels::continuant_forward_cpu(rows, options.eps(), f, at::Tensor(), at::Tensor());
  return f.reshape(output_shape(a)).to(a.scalar_type());
}

struct ContinuantFunction : public torch::autograd::Function<ContinuantFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, double eps, bool exact,
                            bool save_continuants) {
    const at::Tensor rows = as_rows(a);  // (R, d, L)
    const int64_t R = rows.size(0);
    const int64_t L = rows.size(2);
    at::Tensor f = at::empty({R, L}, rows.options());
    at::Tensor r = at::empty({R, L}, rows.options());
    at::Tensor k_saved = save_continuants ? at::empty_like(rows) : at::Tensor();
    kernels::continuant_forward_cpu(rows, eps, f, r, k_saved);
    // Reduced-precision inputs are saved as given (half the memory) and widened again in backward.
    const bool widened = rows.scalar_type() != a.scalar_type();
    ctx->save_for_backward({widened ? a : rows, r, k_saved});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["exact"] = exact;
    ctx->saved_data["shape"] = a.sizes().vec();
    return f.reshape(output_shape(a)).to(a.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const at::Tensor& grad_f_in = grad_outputs[0];
    if (!grad_f_in.defined() || !ctx->needs_input_grad(0)) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const at::Tensor a_saved = saved[0];
    const at::Tensor rows = a_saved.dim() == 3 && a_saved.is_contiguous() &&
                                    a_saved.scalar_type() == saved[1].scalar_type()
                                ? a_saved
                                : as_rows(a_saved);
    const at::Tensor grad_f =
        grad_f_in.to(rows.scalar_type()).contiguous().reshape({rows.size(0), rows.size(2)});
    at::Tensor grad_a = at::empty_like(rows);
    kernels::continuant_backward_cpu(rows, saved[1], saved[2], grad_f,
                                     ctx->saved_data["eps"].toDouble(),
                                     ctx->saved_data["exact"].toBool(), grad_a);
    return {grad_a.reshape(shape).to(grad_f_in.scalar_type()), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

bool has_fused_kernel(const at::Tensor& a) {
  if (!a.device().is_cpu() || a.is_sparse()) return false;
  switch (a.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf: return true;
    default: return false;
  }
}

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
  if (!has_fused_kernel(a)) return continuant_reference(a, options);
  if (!(a.requires_grad() && at::GradMode::is_enabled())) return fused_forward_no_grad(a, options);
  return ContinuantFunction::apply(a, options.eps(),
                                   options.backward() == ContinuantBackward::kExact,
                                   options.save_continuants());
}

at::Tensor continuant_tails_reference(const at::Tensor& a) {
  TORCH_CHECK(a.dim() >= 2 && a.size(-2) >= 1, "continuant_tails_reference: bad shape ", a.sizes());
  const at::Tensor x = a.to(compute_type(a.scalar_type()));
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
  return at::stack(tails, -2);
}

at::Tensor continuant_reference(const at::Tensor& a, const ContinuantOptions& options) {
  check_ladder_input(a, options, "continuant_reference");
  const at::Tensor x = a.to(compute_type(a.scalar_type()));  // autograd flows through the cast
  const int64_t d = x.size(-2);
  const double eps = options.eps();
  // Tail continuants K_0..K_d; tails[j] = K_j. Only exact mode differentiates through them
  // (K_{d-1}).
  const bool exact = options.backward() == ContinuantBackward::kExact;
  std::vector<at::Tensor> tails;
  {
    std::optional<at::NoGradGuard> no_grad;
    if (!exact) no_grad.emplace();
    at::Tensor prev = at::zeros_like(x.select(-2, 0));
    at::Tensor cur = at::ones_like(prev);
    tails.push_back(cur);
    for (int64_t k = d; k >= 1; --k) {
      at::Tensor next = x.select(-2, k - 1) * cur + prev;
      prev = cur;
      cur = next;
      tails.push_back(cur);
    }
  }
  at::Tensor f_value;
  at::Tensor r;
  at::Tensor inside;
  {
    at::NoGradGuard no_grad;
    const at::Tensor& kd = tails[d];
    // K̂_d = sgn(K_d) max(|K_d|, eps), sgn(0) = +1; r = 1 / K̂_d; f = K_{d-1} r.
    const at::Tensor kh = at::where(kd >= 0, kd.clamp_min(eps), kd.clamp_max(-eps));
    r = kh.reciprocal();
    f_value = tails[d - 1] * r;
    inside = kd.abs() < eps;
  }
  // Gradient of Proposition 1: df/da_k = (-1)^k (K_{d-k} r)^2, injected as sum_k w_k (a_k -
  // a_k.detach()), whose value is exactly 0 and whose autograd derivative in a_k is w_k.
  at::Tensor f = f_value;
  for (int64_t k = 1; k <= d; ++k) {
    at::Tensor w;
    {
      at::NoGradGuard no_grad;
      const at::Tensor q = tails[d - k] * r;
      w = (k % 2 == 1) ? -(q * q) : q * q;
    }
    const at::Tensor a_k = x.select(-2, k - 1);
    f = f + (a_k - a_k.detach()) * w;
  }
  if (exact) {
    // Inside the clamp K̂_d is constant: f = K_{d-1} r with r held fixed, differentiated by
    // autograd.
    f = at::where(inside, tails[d - 1] * r, f);
  }
  return f.to(a.scalar_type());
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

}  // namespace cemfrac

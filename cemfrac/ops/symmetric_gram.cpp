// symmetric_gram(): the operator cemfrac::symmetric_gram (ops/library.h): BLAS syrk on the CPU,
// W W^T on every other device, shapes on Meta; its Autograd kernel's backward is one matmul in
// tensor ops, itself differentiable (see symmetric_gram.h).
#include "cemfrac/ops/symmetric_gram.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <type_traits>

#include "cemfrac/ops/library.h"

namespace cemfrac {
namespace {

using GramSig = at::Tensor(const at::Tensor&);

void check_gram_input(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "cemfrac::symmetric_gram: w must be a matrix (n, k), got ", w.sizes());
}

at::Tensor symmetric_gram_twin(const at::Tensor& w) {
  check_gram_input(w);
  return at::mm(w, w.t());
}

// Float32/64 with a CBLAS that has syrk (OpenBLAS, MKL): one triangle, mirrored (half a matmul).
at::Tensor symmetric_gram_cpu(const at::Tensor& w_in) {
  check_gram_input(w_in);
  const at::Tensor w = w_in.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor c;
  if (w.scalar_type() == at::kFloat || w.scalar_type() == at::kDouble) {
    AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "symmetric_gram", [&] {
      using Syrk = void (*)(int, int, int, int, int, scalar_t, const scalar_t*, int, scalar_t,
                            scalar_t*, int);
      static const auto syrk = reinterpret_cast<Syrk>(
          dlsym(RTLD_DEFAULT, std::is_same_v<scalar_t, float> ? "cblas_ssyrk" : "cblas_dsyrk"));
      if (syrk == nullptr) return;
      c = at::empty({n, n}, w.options());
      scalar_t* cp = c.data_ptr<scalar_t>();
      // Row-major (101), upper triangle (121), no transpose (111): C = W W^T above the diagonal.
      syrk(101, 121, 111, int(n), int(k), scalar_t(1), w.data_ptr<scalar_t>(), int(k), scalar_t(0),
           cp, int(n));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) cp[i * n + j] = cp[j * n + i];
    });
  }
  return c.defined() ? c : at::mm(w, w.t());
}

at::Tensor symmetric_gram_meta(const at::Tensor& w) {
  check_gram_input(w);
  return at::empty({w.size(0), w.size(0)}, w.options());
}

class SymmetricGramFunction : public torch::autograd::Function<SymmetricGramFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w) {
    static const auto gram_op = ops::op<GramSig>("symmetric_gram");
    ctx->save_for_backward({w});  // the input itself: the backward's matmul stays differentiable
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return gram_op.call(w);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor w = ctx->get_saved_variables()[0];
    const at::Tensor& g = grads[0];
    return {at::mm(g + g.t(), w)};  // C = W W^T  ->  dW = (g + g^T) W
  }
};

at::Tensor symmetric_gram_autograd(const at::Tensor& w) {
  if (at::GradMode::is_enabled() && w.requires_grad()) return SymmetricGramFunction::apply(w);
  static const auto gram_op = ops::op<GramSig>("symmetric_gram");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return gram_op.call(w);
}

}  // namespace

at::Tensor symmetric_gram(const at::Tensor& w) {
  static const auto gram_op = ops::op<GramSig>("symmetric_gram");
  return gram_op.call(w);
}

at::Tensor symmetric_gram_reference(const at::Tensor& w) {
  return at::mm(w, w.t());
}

extern const bool kSymmetricGramKernels = true;  // ops/library.cpp's link anchor

}  // namespace cemfrac

TORCH_LIBRARY_IMPL(cemfrac, CPU, m) {
  m.impl("symmetric_gram", &cemfrac::symmetric_gram_cpu);
}

TORCH_LIBRARY_IMPL(cemfrac, Meta, m) {
  m.impl("symmetric_gram", &cemfrac::symmetric_gram_meta);
}

TORCH_LIBRARY_IMPL(cemfrac, CompositeExplicitAutograd, m) {
  m.impl("symmetric_gram", &cemfrac::symmetric_gram_twin);
}

TORCH_LIBRARY_IMPL(cemfrac, Autograd, m) {
  m.impl("symmetric_gram", &cemfrac::symmetric_gram_autograd);
}

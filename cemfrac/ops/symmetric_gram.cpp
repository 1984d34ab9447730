#include "cemfrac/ops/symmetric_gram.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <torch/autograd.h>

#include <type_traits>

namespace cemfrac {
namespace {

class SymmetricGramFunction : public torch::autograd::Function<SymmetricGramFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w_in) {
    const at::Tensor w = w_in.detach().contiguous();
    ctx->save_for_backward({w_in});  // the input itself: the backward's matmul stays differentiable
    const int64_t n = w.size(0), k = w.size(1);
    at::Tensor c;
    if (w.device().is_cpu() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kDouble)) {
      AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "symmetric_gram", [&] {
        using Syrk = void (*)(int, int, int, int, int, scalar_t, const scalar_t*, int, scalar_t,
                              scalar_t*, int);
        static const auto syrk = reinterpret_cast<Syrk>(
            dlsym(RTLD_DEFAULT, std::is_same_v<scalar_t, float> ? "cblas_ssyrk" : "cblas_dsyrk"));
        if (syrk == nullptr) return;
        c = at::empty({n, n}, w.options());
        scalar_t* cp = c.data_ptr<scalar_t>();
        // Row-major (101), upper triangle (121), no transpose (111): C = W W^T above the diagonal.
        syrk(101, 121, 111, int(n), int(k), scalar_t(1), w.data_ptr<scalar_t>(), int(k),
             scalar_t(0), cp, int(n));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < i; ++j) cp[i * n + j] = cp[j * n + i];
      });
    }
    return c.defined() ? c : at::mm(w, w.t());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor w = ctx->get_saved_variables()[0];
    const at::Tensor& g = grads[0];
    return {at::mm(g + g.t(), w)};
  }
};

}  // namespace

at::Tensor symmetric_gram(const at::Tensor& w) {
  return SymmetricGramFunction::apply(w);
}

at::Tensor symmetric_gram_reference(const at::Tensor& w) {
  return at::mm(w, w.t());
}

}  // namespace cemfrac

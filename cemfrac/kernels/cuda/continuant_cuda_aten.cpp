// at::Tensor entry points of the CUDA ladder kernels, with the CPU kernels' signatures
// (kernels/kernels.h): the ladder operator registers them for the CUDA dispatch key. Built only with
// -DCEMFRAC_CUDA=ON against a CUDA LibTorch. Half and bfloat16 ladders are computed in float32 by
// the operator above (as on the CPU), so only float and double reach these.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cemfrac/kernels/cuda/continuant_cuda.h"
#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
namespace {

void check_ladder_tensor(const at::Tensor& t, const at::Tensor& like, int64_t dim,
                         const char* name) {
  TORCH_INTERNAL_ASSERT(t.defined() && t.is_contiguous() && t.scalar_type() == like.scalar_type() &&
                            t.dim() == dim && t.device() == like.device(),
                        "continuant CUDA kernel: bad tensor ", name);
}

template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

void continuant_forward_cuda(const at::Tensor& a, double eps, const at::Tensor& f,
                             const at::Tensor& r, const at::Tensor& k_saved) {
  TORCH_INTERNAL_ASSERT(a.is_cuda() && a.size(1) >= 1 && eps >= 0);
  check_ladder_tensor(a, a, 3, "a");
  check_ladder_tensor(f, a, 2, "f");
  if (r.defined()) check_ladder_tensor(r, a, 2, "r");
  if (k_saved.defined()) check_ladder_tensor(k_saved, a, 3, "k_saved");
  const c10::cuda::CUDAGuard guard(a.device());
  void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "continuant_forward_cuda", [&] {
    cuda::ladder_forward<scalar_t>(a.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
                                   ptr_or_null<scalar_t>(r), ptr_or_null<scalar_t>(k_saved),
                                   a.size(0), a.size(1), a.size(2), eps, stream);
  });
}

void continuant_backward_cuda(const at::Tensor& a, const at::Tensor& r, const at::Tensor& k_saved,
                              const at::Tensor& grad_f, double eps, bool exact,
                              const at::Tensor& grad_a) {
  TORCH_INTERNAL_ASSERT(a.is_cuda() && a.size(1) >= 1 && eps >= 0);
  check_ladder_tensor(a, a, 3, "a");
  check_ladder_tensor(r, a, 2, "r");
  check_ladder_tensor(grad_f, a, 2, "grad_f");
  check_ladder_tensor(grad_a, a, 3, "grad_a");
  if (k_saved.defined()) check_ladder_tensor(k_saved, a, 3, "k_saved");
  const c10::cuda::CUDAGuard guard(a.device());
  void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "continuant_backward_cuda", [&] {
    cuda::ladder_backward<scalar_t>(a.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(),
                                    ptr_or_null<scalar_t>(k_saved), grad_f.data_ptr<scalar_t>(),
                                    grad_a.data_ptr<scalar_t>(), a.size(0), a.size(1), a.size(2),
                                    eps, exact, stream);
  });
}

}  // namespace cemfrac::kernels

// The CUDA ladder kernels on a real device against the CPU kernel (label `cuda`). Skipped, with the
// reason, in a build without CUDA kernels or on a machine without a CUDA device; the same per-ladder
// math is checked on the CPU by tests/ops/continuant_cuda_math_test.cpp on every machine.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cemfrac/kernels/kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace cemfrac::test {
namespace {

TEST(ContinuantCuda, KernelEqualsTheCpuKernel) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
#ifdef CEMFRAC_WITH_CUDA
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (int64_t d : {1, 4, 8, 16}) {
      at::manual_seed(7 + d);
      const at::Tensor a = (at::rand({5, d, 1000}, at::kDouble) * 4 - 2).to(dtype);
      const at::Tensor g = (at::rand({5, 1000}, at::kDouble) * 2 - 1).to(dtype);
      for (bool exact : {false, true}) {
        at::Tensor f = at::empty({5, 1000}, a.options()), r = at::empty_like(f);
        at::Tensor ga = at::empty_like(a);
        kernels::continuant_forward_cpu(a, 0.01, f, r, at::Tensor());
        kernels::continuant_backward_cpu(a, r, at::Tensor(), g, 0.01, exact, ga);
        const at::Tensor ac = a.cuda(), gc = g.cuda();
        at::Tensor fc = at::empty_like(f, ac.options()), rc = at::empty_like(r, ac.options());
        at::Tensor gac = at::empty_like(a, ac.options());
        kernels::continuant_forward_cuda(ac, 0.01, fc, rc, at::Tensor());
        kernels::continuant_backward_cuda(ac, rc, at::Tensor(), gc, 0.01, exact, gac);
        const std::string what = std::string(at::toString(dtype)) + " d=" + std::to_string(d);
        // Fast path: bitwise (continuant_cuda_math.h); exact mode's clamped ladders take the slow
        // path, whose bound continuant_cuda_math_test.cpp derives: allow it here via allclose.
        EXPECT_TRUE(at::equal(fc.cpu(), f)) << what << " f";
        EXPECT_TRUE(at::equal(rc.cpu(), r)) << what << " r";
        if (!exact) {
          EXPECT_TRUE(at::equal(gac.cpu(), ga)) << what << " grad";
        } else {
          const double tol = dtype == at::kFloat ? 1e-5 : 1e-12;
          EXPECT_TRUE(at::allclose(gac.cpu(), ga, tol, tol)) << what << " exact grad";
        }
      }
    }
  }
#endif
}

}  // namespace
}  // namespace cemfrac::test

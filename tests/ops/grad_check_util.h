// A float64 central-difference check shared by the ops tests: the autograd gradient of a scalar
// loss against (loss(x + h e_i) - loss(x - h e_i)) / 2h for every element i of every input.
#pragma once
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <functional>
#include <vector>

namespace cemfrac::test {

using LossOfInputs = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

inline void expect_central_differences(const LossOfInputs& loss,
                                       const std::vector<torch::Tensor>& base, double h = 1e-6,
                                       double tolerance = 1e-8) {
  std::vector<torch::Tensor> vars;
  for (const torch::Tensor& t : base) vars.push_back(t.detach().clone().requires_grad_());
  const auto analytic = torch::autograd::grad({loss(vars)}, vars);
  for (size_t which = 0; which < base.size(); ++which) {
    for (int64_t i = 0; i < base[which].numel(); ++i) {
      std::vector<torch::Tensor> plus, minus;
      for (const torch::Tensor& t : base) {
        plus.push_back(t.detach().clone());
        minus.push_back(t.detach().clone());
      }
      plus[which].view({-1})[i] += h;
      minus[which].view({-1})[i] -= h;
      const double numeric = (loss(plus) - loss(minus)).item<double>() / (2 * h);
      EXPECT_NEAR(analytic[which].reshape({-1})[i].item<double>(), numeric, tolerance)
          << "input " << which << ", element " << i;
    }
  }
}

}  // namespace cemfrac::test

// The fused ops as dispatcher operators (ops/library.h): every schema is registered with a CPU,
// Meta, CompositeExplicitAutograd (ATen twin) and Autograd kernel; calling an operator through the
// dispatcher gives the raw kernel's bits; Meta gives shapes and dtypes; the Autograd kernel's
// gradient is the closed form, and its second derivative is exact (float64 central differences of
// the first derivative).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <functional>
#include <string>
#include <vector>

#include "cemfrac/kernels/kernels.h"
#include "cemfrac/ops/causal_attention.h"
#include "cemfrac/ops/continuant.h"
#include "cemfrac/ops/library.h"
#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/rms_norm.h"
#include "cemfrac/ops/rope.h"
#include "cemfrac/ops/silu_mul.h"
#include "cemfrac/ops/symmetric_gram.h"
#include "tests/ops/grad_check_util.h"
#include "tests/ops/ladder_test_util.h"

namespace cemfrac {
namespace {

using test::uniform;

bool same_bits(const at::Tensor& x, const at::Tensor& y) {
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         at::equal(x.contiguous().view(at::kByte), y.contiguous().view(at::kByte));
}

// Every schema of library.cpp resolves, and each operator has the kernels library.h promises.
TEST(DispatcherRegistration, EverySchemaHasItsKernels) {
  int count = 0;
  for (const char* const* schema = ops::op_schemas(); *schema != nullptr; ++schema, ++count) {
    const std::string s(*schema);
    const std::string name = s.substr(0, s.find('('));
    SCOPED_TRACE(name);
    const c10::OperatorHandle handle = ops::find_op(name.c_str());
    EXPECT_EQ(handle.schema().name(), "cemfrac::" + name);
    for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::Meta,
                     c10::DispatchKey::CompositeExplicitAutograd}) {
      EXPECT_TRUE(handle.hasKernelForDispatchKey(key)) << c10::toString(key);
    }
  }
  EXPECT_GE(count, 20);
  // The differentiable ones have an autograd kernel of their own.
  for (const char* name :
       {"continuant", "continuant_backward", "rms_norm", "rms_norm_backward", "silu_mul",
        "silu_mul_backward", "rope", "symmetric_gram", "linear", "causal_attention",
        "causal_attention_backward", "causal_attention_shared_bias",
        "causal_attention_shared_bias_backward", "causal_attention_head_diag",
        "causal_attention_head_diag_backward"}) {
    EXPECT_TRUE(ops::find_op(name).hasKernelForDispatchKey(c10::DispatchKey::Autograd)) << name;
  }
  EXPECT_THROW(ops::find_op("no_such_op"), c10::Error);
}

// ---- Ladders ------------------------------------------------------------------------------------

// The operator's forward and backward are the raw kernels' bits (the code the engine ran before
// the ops became operators: kernels::continuant_{forward,backward}_cpu on the (R, d, L) rows).
TEST(DispatcherContinuant, CpuOperatorIsTheKernel) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (bool exact : {false, true}) {
      const at::Tensor a = uniform({3, 2, 5, 67}, -3, 3, dtype, 41);  // rows (3, 2), d 5, L 67
      const at::Tensor g = uniform({3, 2, 67}, -1, 1, dtype, 42);
      const at::Tensor rows = a.reshape({6, 5, 67});
      at::Tensor f = at::empty({6, 67}, a.options()), r = at::empty({6, 67}, a.options());
      kernels::continuant_forward_cpu(rows, 0.01, f, r, at::Tensor());
      at::Tensor grad = at::empty_like(rows);
      kernels::continuant_backward_cpu(rows, r, at::Tensor(), g.reshape({6, 67}), 0.01, exact,
                                       grad);
      const auto options = ContinuantOptions().backward(exact ? ContinuantBackward::kExact
                                                              : ContinuantBackward::kSurrogate);
      auto [f_op, grad_op] = test::value_and_grad(
          [&](const at::Tensor& x) { return continuant(x, options); }, a, g);
      EXPECT_TRUE(same_bits(f_op, f.reshape({3, 2, 67})));
      EXPECT_TRUE(same_bits(grad_op, grad.reshape(a.sizes())));
      // Inference (no autograd) and the Python name reach the same kernel.
      EXPECT_TRUE(same_bits(continuant(a, options), f_op));
    }
  }
}

// Meta: the shapes and dtypes of the three operators, and forward + backward of the ladder on the
// meta device (reduced precision: f in a's dtype, r and the gradient's internals in float32).
TEST(DispatcherContinuant, MetaShapes) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const at::Tensor a =
        at::empty({4, 3, 6, 9}, at::TensorOptions().device(at::kMeta).dtype(dtype));
    const at::Tensor f = continuant(a);
    EXPECT_TRUE(f.is_meta());
    EXPECT_EQ(f.sizes(), (std::vector<int64_t>{4, 3, 9}));
    EXPECT_EQ(f.scalar_type(), dtype);
    static const auto forward_op = ops::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, double, bool)>("continuant_forward");
    {
      // The _forward operators have no autograd kernel (only the ladder's Function calls them,
      // below autograd); LibTorch 1.13 has no AutogradMeta fallthrough, so call them as it does.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      auto [f2, r, k] = forward_op.call(a, 0.01, true);
      const at::ScalarType wide = dtype == at::kBFloat16 ? at::kFloat : dtype;
      EXPECT_EQ(f2.sizes(), f.sizes());
      EXPECT_EQ(r.sizes(), f.sizes());
      EXPECT_EQ(r.scalar_type(), wide);
      EXPECT_EQ(k.sizes(), a.sizes());
      EXPECT_EQ(std::get<2>(forward_op.call(a, 0.01, false)).numel(), 0);
    }
    const at::Tensor x = a.clone().requires_grad_(true);
    const at::Tensor grad = torch::autograd::grad({continuant(x).sum()}, {x})[0];
    EXPECT_TRUE(grad.is_meta());
    EXPECT_EQ(grad.sizes(), a.sizes());
    EXPECT_EQ(grad.scalar_type(), dtype);
  }
  // Meta checks its arguments like the kernels do.
  EXPECT_THROW(continuant(at::empty({2, 0, 5}, at::kMeta)), c10::Error);
}

// The twin (the kernel on every other device) gives the CPU kernel's function: ContinuantImpl::
// kReference runs exactly the twin's forward and closed-form backward.
TEST(DispatcherContinuant, TwinMatchesCpu) {
  const at::Tensor a = uniform({5, 4, 33}, -3, 3, at::kDouble, 43);
  const at::Tensor g = uniform({5, 33}, -1, 1, at::kDouble, 44);
  for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
    const auto options = ContinuantOptions().backward(mode);
    auto [f1, g1] = test::value_and_grad(
        [&](const at::Tensor& x) { return continuant(x, options); }, a, g);
    auto [f2, g2] = test::value_and_grad(
        [&](const at::Tensor& x) { return continuant_reference(x, options); }, a, g);
    test::expect_close(f1, f2, 1e-12, 0, "f " + to_string(mode));
    // Exact mode inside the clamp: the kernel's long double path against the closed form in
    // double, whose head continuants may cancel a few digits.
    test::expect_close(g1, g2, 1e-10, 1e-12 * g2.abs().max().item<double>(), "grad " + to_string(mode));
  }
}

// Ladders well away from poles (every a_k in [0.5, 2]: all continuants positive and >= 1), so the
// guard is inactive, the function smooth, and the derivatives moderate (|d^3 f| = O(10)).
at::Tensor smooth_ladders(std::vector<int64_t> shape, uint64_t seed) {
  return uniform(std::move(shape), 0.5, 2, at::kDouble, seed);
}

// gradcheck: the first derivative of every implementation against central differences. h = 1e-6;
// truncation error h^2/6 |f'''| ~ 1e-11, rounding ~ eps_machine |loss| / h ~ 1e-9 (|loss| <= 10):
// tolerance 1e-8.
TEST(DispatcherContinuant, GradcheckFloat64) {
  const at::Tensor a = smooth_ladders({2, 3, 4}, 45);
  const at::Tensor w = uniform({2, 4}, -1, 1, at::kDouble, 46);
  for (auto impl : {ContinuantImpl::kFused, ContinuantImpl::kReference}) {
    for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
      SCOPED_TRACE(to_string(impl) + " " + to_string(mode));
      const auto options = ContinuantOptions().impl(impl).backward(mode);
      test::expect_central_differences(
          [&](const std::vector<at::Tensor>& x) { return (continuant(x[0], options) * w).sum(); },
          {a});
    }
  }
}

// gradgradcheck: the derivative of the gradient (create_graph) against central differences of the
// gradient, in both the ladder's input and the incoming gradient. Same step and bound as above
// (the gradient is as smooth as f here).
TEST(DispatcherContinuant, GradgradcheckFloat64) {
  const at::Tensor a = smooth_ladders({2, 3, 4}, 47);
  const at::Tensor w = uniform({2, 4}, -1, 1, at::kDouble, 48);
  const at::Tensor u = uniform({2, 3, 4}, -1, 1, at::kDouble, 49);
  for (auto impl : {ContinuantImpl::kFused, ContinuantImpl::kReference, ContinuantImpl::kLiteral}) {
    for (auto mode : {ContinuantBackward::kSurrogate, ContinuantBackward::kExact}) {
      SCOPED_TRACE(to_string(impl) + " " + to_string(mode));
      const auto options = ContinuantOptions().impl(impl).backward(mode);
      // loss2(a, w) = <d(f . w)/da, u>: its gradient in a is the Hessian times u.
      auto loss2 = [&](const std::vector<at::Tensor>& x) {
        at::Tensor a_var = x[0];
        at::Tensor w_var = x[1];
        if (!a_var.requires_grad()) a_var = a_var.detach().requires_grad_(true);
        at::AutoGradMode grad_on(true);
        const at::Tensor grad = torch::autograd::grad({(continuant(a_var, options) * w_var).sum()},
                                                      {a_var}, {}, true, /*create_graph=*/true)[0];
        return (grad * u).sum();
      };
      // Under create_graph the gradient depends on a and w (not silently a constant).
      {
        const at::Tensor x = a.clone().requires_grad_(true);
        const at::Tensor grad =
            torch::autograd::grad({(continuant(x, options) * w).sum()}, {x}, {}, true, true)[0];
        EXPECT_TRUE(grad.requires_grad());
      }
      test::expect_central_differences(loss2, {a, w});
    }
  }
}

// The Hessian of one ladder of every implementation equals the plain-autograd nested fraction's
// (kLiteral: no guard active here, so the same function), entry by entry.
TEST(DispatcherContinuant, HessianMatchesPlainLadder) {
  const at::Tensor a0 = smooth_ladders({1, 5, 1}, 50);
  auto hessian = [&](ContinuantImpl impl) {
    const auto options = ContinuantOptions().impl(impl);
    const at::Tensor a = a0.clone().requires_grad_(true);
    const at::Tensor grad =
        torch::autograd::grad({continuant(a, options).sum()}, {a}, {}, true, true)[0];
    std::vector<at::Tensor> rows;
    for (int64_t k = 0; k < 5; ++k) {
      rows.push_back(torch::autograd::grad({grad.view(-1)[k]}, {a}, {}, true)[0].view(-1));
    }
    return at::stack(rows);
  };
  const at::Tensor want = hessian(ContinuantImpl::kLiteral);
  ASSERT_GT(want.abs().max().item<double>(), 1e-2);
  for (auto impl : {ContinuantImpl::kFused, ContinuantImpl::kReference}) {
    test::expect_close(hessian(impl), want, 1e-12, 1e-14, "hessian " + to_string(impl));
  }
}

// ---- Every other operator: one harness -------------------------------------------------------

using Inputs = std::vector<at::Tensor>;
using OpFn = std::function<Inputs(const Inputs&)>;

// Central differences of loss over every element of the inputs marked differentiable, against
// autograd (inputs unused by the loss have derivative 0). The same step and bound as above:
// h = 1e-6; truncation h^2/6 |d^3 l| and rounding eps_machine |l| / h both well below 1e-8 for
// the O(1) inputs and |l| <= 10 used here.
void expect_central_differences_all(const std::function<at::Tensor(const Inputs&)>& loss,
                                    const Inputs& base, const std::vector<bool>& diff) {
  Inputs vars;
  Inputs wrt;
  for (size_t i = 0; i < base.size(); ++i) {
    vars.push_back(diff[i] ? base[i].detach().clone().requires_grad_(true) : base[i]);
    if (diff[i]) wrt.push_back(vars.back());
  }
  const auto analytic = torch::autograd::grad({loss(vars)}, wrt, {}, false, false,
                                              /*allow_unused=*/true);
  size_t slot = 0;
  for (size_t which = 0; which < base.size(); ++which) {
    if (!diff[which]) continue;
    const at::Tensor got =
        analytic[slot].defined() ? analytic[slot] : at::zeros_like(base[which]);
    ++slot;
    for (int64_t i = 0; i < base[which].numel(); ++i) {
      Inputs plus = base, minus = base;
      plus[which] = base[which].detach().clone();
      minus[which] = base[which].detach().clone();
      plus[which].view({-1})[i] += 1e-6;
      minus[which].view({-1})[i] -= 1e-6;
      const double numeric = (loss(plus) - loss(minus)).item<double>() / 2e-6;
      EXPECT_NEAR(got.reshape({-1})[i].item<double>(), numeric, 1e-8)
          << "input " << which << ", element " << i;
    }
  }
}

// For an operator `fn` and its plain-ATen `reference` (autograd through tensor ops), on float64
// `inputs` of which those marked in `diff` are differentiated:
//   1. CPU operator == reference in values, first and second derivatives (the CPU kernel, and the
//      closed-form backward differentiated again, against autograd through the reference);
//   2. gradcheck and gradgradcheck of the operator by central differences;
//   3. Meta: the outputs' shapes and dtypes, and a backward giving the inputs' shapes.
void check_operator(const std::string& what, const OpFn& fn, const OpFn& reference,
                    const Inputs& inputs, const std::vector<bool>& diff) {
  SCOPED_TRACE(what);
  const size_t n = inputs.size();
  const Inputs outs = fn(inputs);
  Inputs weights, directions;
  for (size_t j = 0; j < outs.size(); ++j) {
    weights.push_back(uniform(outs[j].sizes().vec(), -1, 1, at::kDouble, 60 + j));
  }
  for (size_t i = 0; i < n; ++i) {
    directions.push_back(uniform(inputs[i].sizes().vec(), -1, 1, at::kDouble, 70 + i));
  }
  // loss(inputs..., weights...) = sum_j <out_j, w_j>
  auto loss_of = [n](const OpFn& f) {
    return [n, f](const Inputs& x) {
      const Inputs o = f(Inputs(x.begin(), x.begin() + n));
      at::Tensor l = at::zeros({}, at::kDouble);
      for (size_t j = 0; j < o.size(); ++j) l = l + (o[j] * x[n + j]).sum();
      return l;
    };
  };
  // loss2 = sum_i <d loss / d input_i, u_i> over the differentiable inputs (create_graph).
  auto loss2_of = [&](const OpFn& f) {
    return [&, f](const Inputs& x) {
      at::AutoGradMode grad_on(true);
      Inputs vars = x;
      Inputs wrt;
      for (size_t i = 0; i < n; ++i) {
        if (!diff[i]) continue;
        if (!vars[i].requires_grad()) vars[i] = vars[i].detach().requires_grad_(true);
        wrt.push_back(vars[i]);
      }
      const auto grads = torch::autograd::grad({loss_of(f)(vars)}, wrt, {}, true,
                                               /*create_graph=*/true, /*allow_unused=*/true);
      at::Tensor l = at::zeros({}, at::kDouble);
      size_t slot = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!diff[i]) continue;
        if (grads[slot].defined()) l = l + (grads[slot] * directions[i]).sum();
        ++slot;
      }
      return l;
    };
  };
  Inputs all = inputs;
  all.insert(all.end(), weights.begin(), weights.end());
  std::vector<bool> all_diff = diff;
  all_diff.resize(all.size(), true);

  // 1. Against the reference: values, gradients, second derivatives (relative 1e-10: both are
  // float64 evaluations of one function in different orders).
  const Inputs ref_outs = reference(inputs);
  ASSERT_EQ(outs.size(), ref_outs.size());
  for (size_t j = 0; j < outs.size(); ++j) {
    test::expect_close(outs[j], ref_outs[j], 1e-10, 1e-12, "output " + std::to_string(j));
  }
  for (int order = 1; order <= 2; ++order) {
    auto derivatives = [&](const OpFn& f) {
      Inputs vars;
      Inputs wrt;
      for (size_t i = 0; i < all.size(); ++i) {
        vars.push_back(all_diff[i] ? all[i].detach().clone().requires_grad_(true) : all[i]);
        if (all_diff[i]) wrt.push_back(vars.back());
      }
      const at::Tensor l = order == 1 ? loss_of(f)(vars) : loss2_of(f)(vars);
      auto g = torch::autograd::grad({l}, wrt, {}, false, false, /*allow_unused=*/true);
      for (size_t i = 0; i < g.size(); ++i) {
        if (!g[i].defined()) g[i] = at::zeros_like(wrt[i]);
      }
      return g;
    };
    const auto got = derivatives(fn), want = derivatives(reference);
    for (size_t i = 0; i < got.size(); ++i) {
      test::expect_close(got[i], want[i], 1e-10, 1e-12,
                         "derivative order " + std::to_string(order) + " input " +
                             std::to_string(i));
    }
  }

  // 2. gradcheck, gradgradcheck.
  expect_central_differences_all(loss_of(fn), all, all_diff);
  expect_central_differences_all(loss2_of(fn), all, all_diff);

  // 3. Meta.
  Inputs meta;
  for (size_t i = 0; i < n; ++i) {
    meta.push_back(at::empty(inputs[i].sizes(), inputs[i].options().device(at::kMeta)));
    if (diff[i]) meta.back().requires_grad_(true);
  }
  const Inputs meta_outs = fn(meta);
  ASSERT_EQ(meta_outs.size(), outs.size());
  at::Tensor l = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
  for (size_t j = 0; j < outs.size(); ++j) {
    EXPECT_TRUE(meta_outs[j].is_meta());
    EXPECT_EQ(meta_outs[j].sizes(), outs[j].sizes()) << "output " << j;
    EXPECT_EQ(meta_outs[j].scalar_type(), outs[j].scalar_type());
    l = l + meta_outs[j].sum();
  }
  Inputs wrt;
  for (size_t i = 0; i < n; ++i) {
    if (diff[i]) wrt.push_back(meta[i]);
  }
  const auto grads = torch::autograd::grad({l}, wrt, {}, false, false, /*allow_unused=*/true);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      EXPECT_TRUE(grads[i].is_meta());
      EXPECT_EQ(grads[i].sizes(), wrt[i].sizes());
    }
  }
}

at::Tensor normal(std::vector<int64_t> shape, uint64_t seed) {
  return uniform(std::move(shape), -1.5, 1.5, at::kDouble, seed);
}

TEST(DispatcherOps, RmsNorm) {
  check_operator(
      "rms_norm", [](const Inputs& x) { return Inputs{rms_norm(x[0], x[1], 1e-5)}; },
      [](const Inputs& x) { return Inputs{rms_norm_reference(x[0], x[1], 1e-5)}; },
      {normal({2, 3, 4}, 1), normal({4}, 2)}, {true, true});
}

TEST(DispatcherOps, SiluMul) {
  check_operator(
      "silu_mul", [](const Inputs& x) { return Inputs{silu_mul(x[0], x[1])}; },
      [](const Inputs& x) { return Inputs{silu_mul_reference(x[0], x[1])}; },
      {normal({3, 5}, 3), normal({3, 5}, 4)}, {true, true});
}

TEST(DispatcherOps, Rope) {
  const at::Tensor angles = normal({3, 2}, 5) * 2;
  for (bool inverse : {false, true}) {
    check_operator(
        inverse ? "rope inverse" : "rope",
        [inverse](const Inputs& x) { return Inputs{apply_rope(x[0], x[1], x[2], inverse)}; },
        [inverse](const Inputs& x) {
          return Inputs{apply_rope_reference(x[0], x[1], x[2], inverse)};
        },
        {normal({2, 2, 3, 4}, 6), angles.cos(), angles.sin()}, {true, false, false});
  }
}

TEST(DispatcherOps, SymmetricGram) {
  check_operator(
      "symmetric_gram", [](const Inputs& x) { return Inputs{symmetric_gram(x[0])}; },
      [](const Inputs& x) { return Inputs{symmetric_gram_reference(x[0])}; }, {normal({3, 4}, 7)},
      {true});
}

TEST(DispatcherOps, Linear) {
  for (int64_t rows : {1, 3, 11}) {  // gemv, the skinny kernel (inference), sgemm
    check_operator(
        "linear rows=" + std::to_string(rows),
        [](const Inputs& x) { return Inputs{linear(x[0], x[1], x[2])}; },
        [](const Inputs& x) { return Inputs{at::linear(x[0], x[1], x[2])}; },
        {normal({rows, 4}, 8), normal({3, 4}, 9), normal({3}, 10)}, {true, true, true});
  }
  // Inference on a few rows is the skinny kernel, bit for bit (kernels.h).
  const at::Tensor x = normal({3, 4}, 11), w = normal({5, 4}, 12), b = normal({5}, 13);
  at::Tensor y = at::empty({3, 5}, x.options());
  kernels::skinny_linear_cpu(x, w, b, y);
  EXPECT_TRUE(same_bits(linear(x, w, b), y));
}

// Attention: B 1, H 2 query heads over H_kv 1 key/value head (grouped), N 3, d_h 2; tied values
// (v is k, CEM) and separate ones.
Inputs attention_inputs(uint64_t seed, std::vector<std::vector<int64_t>> extra) {
  Inputs in{normal({1, 2, 3, 2}, seed), normal({1, 1, 3, 2}, seed + 1),
            normal({1, 1, 3, 2}, seed + 2)};
  for (size_t i = 0; i < extra.size(); ++i) in.push_back(normal(extra[i], seed + 3 + i));
  return in;
}

TEST(DispatcherOps, CausalAttention) {
  for (bool tied : {false, true}) {
    auto values = [tied](const Inputs& x) { return tied ? x[1] : x[2]; };
    check_operator(
        tied ? "causal_attention tied" : "causal_attention",
        [values](const Inputs& x) { return Inputs{causal_attention(x[0], x[1], values(x), 0)}; },
        [values](const Inputs& x) {
          return Inputs{causal_attention_reference(x[0], x[1], values(x), 0)};
        },
        attention_inputs(14, {}), {true, true, !tied});
  }
}

TEST(DispatcherOps, CausalAttentionSharedBias) {
  for (bool tied : {false, true}) {
    auto values = [tied](const Inputs& x) { return tied ? x[1] : x[2]; };
    check_operator(
        tied ? "shared_bias tied" : "shared_bias",
        [values](const Inputs& x) {
          const auto o = causal_attention_shared_bias(x[0], x[1], values(x), x[3], x[4], x[5], 0);
          return Inputs{o.out, o.read};
        },
        [values](const Inputs& x) {
          const auto o =
              causal_attention_shared_bias_reference(x[0], x[1], values(x), x[3], x[4], x[5], 0);
          return Inputs{o.out, o.read};
        },
        attention_inputs(20, {{1, 3, 2}, {1, 3, 2}, {1, 3, 3}}),
        {true, true, !tied, true, true, true});
  }
}

TEST(DispatcherOps, CausalAttentionHeadDiag) {
  for (bool tied : {false, true}) {
    auto values = [tied](const Inputs& x) { return tied ? x[1] : x[2]; };
    check_operator(
        tied ? "head_diag tied" : "head_diag",
        [values](const Inputs& x) {
          const auto o = causal_attention_head_diag(x[0], x[1], values(x), x[3], x[4], x[5], 0);
          return Inputs{o.out, o.read};
        },
        [values](const Inputs& x) {
          const auto o =
              causal_attention_head_diag_reference(x[0], x[1], values(x), x[3], x[4], x[5], 0);
          return Inputs{o.out, o.read};
        },
        attention_inputs(30, {{1, 3, 2}, {1, 3, 2}, {2, 2}}),
        {true, true, !tied, true, true, true});
  }
}

}  // namespace
}  // namespace cemfrac

// cem_attention against its own closed-form energy and against tied MHA (CEM spec §7),
// float64, N = 6, D = 8, H = 2, d_h = 4, r = 2. Property numbers are the spec's.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cemfrac/layers/base/mha.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/cem/cem_attention.h"
#include "tests/model_test_util.h"

namespace cemfrac {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
constexpr int64_t kB = 2, kN = 6, kD = 8, kH = 2, kDh = 4, kRank = 2;

struct Variant {
  std::string name;
  bool rope = false;
  CemRopeMode rope_mode = CemRopeMode::kExact;
  CemDiagonal dlr = CemDiagonal::kNone;
  bool distance = false;
  bool precond = false;
  bool psd = false;
  bool learn_eta = true;
  CemAttentionKernel attention = CemAttentionKernel::kSoftmax;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"plain"});
  v.push_back({"dlr_per_head", false, CemRopeMode::kExact, CemDiagonal::kPerHead});
  v.push_back({"dlr_shared", false, CemRopeMode::kExact, CemDiagonal::kShared});
  v.push_back({"distance_per_head", false, CemRopeMode::kExact, CemDiagonal::kPerHead, true});
  v.push_back({"distance_shared", false, CemRopeMode::kExact, CemDiagonal::kShared, true});
  v.push_back({"rope_exact", true});
  v.push_back({"rope_exact_dlr_per_head", true, CemRopeMode::kExact, CemDiagonal::kPerHead});
  v.push_back(
      {"rope_exact_distance_shared", true, CemRopeMode::kExact, CemDiagonal::kShared, true});
  v.push_back({"precond", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true});
  v.push_back({"precond_psd", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true, true});
  v.push_back({"rope_dlr_precond", true, CemRopeMode::kExact, CemDiagonal::kPerHead, true, true});
  Variant linear{"linear"};
  linear.attention = CemAttentionKernel::kLinear;
  v.push_back(linear);
  Variant linear_rope = linear;
  linear_rope.name = "linear_rope_exact";
  linear_rope.rope = true;
  v.push_back(linear_rope);
  Variant linear_precond = linear;
  linear_precond.name = "linear_precond";
  linear_precond.precond = true;
  v.push_back(linear_precond);
  return v;
}

// A float64 module with O(1) random weights (so the softmax is far from uniform), random delta,
// random preconditioner factors and eta = 0.7 (when learnable).
std::shared_ptr<CemAttentionImpl> make(const Variant& v, int64_t steps = 1, uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto m = std::make_shared<CemAttentionImpl>(CemAttentionOptions(kD, kH)
                                                  .rope(v.rope)
                                                  .rope_mode(v.rope_mode)
                                                  .dlr(v.dlr)
                                                  .dlr_distance(v.distance)
                                                  .attention(v.attention)
                                                  .step(CemStepOptions()
                                                            .steps(steps)
                                                            .learn_eta(v.learn_eta)
                                                            .precond(v.precond)
                                                            .precond_rank(kRank)
                                                            .precond_psd(v.psd)));
  m->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    if (name == "w_q" || name == "w_k") p.value().normal_(0.0, 0.6);
    if (name == "delta") p.value().normal_(0.0, 0.3);
    if (name == "eta_raw") p.value().fill_(std::log(std::exp(0.7) - 1.0));
    if (name == "precond.p") p.value().normal_(0.0, 0.5);
    if (name == "precond.u" || name == "precond.v") p.value().normal_(0.0, 0.3);
  }
  return m;
}

MixerContext context(bool rope, int64_t offset, int64_t n) {
  static RotaryEmbedding rotary(kDh, 64, 10000.0);
  MixerContext ctx;
  ctx.offset = offset;
  if (rope) std::tie(ctx.rope_cos, ctx.rope_sin) = rotary.tables(offset, n, kF64);
  return ctx;
}

using test::rel_err;

// max |a - b| over max(1, max |b|): an absolute error for O(1) outputs, a relative one for the
// linear energy's, which grow with every step (it is unbounded below).
double err_over_scale(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

// -eta P grad_x E(x; h), with P formed densely here (the module never forms it).
torch::Tensor expected_displacement(CemAttentionImpl& m, const torch::Tensor& x0,
                                    const torch::Tensor& h, const MixerContext& ctx) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor g = torch::autograd::grad({m.energy(x, h, ctx).sum()}, {x})[0];
  if (m.preconditioner() != nullptr) g = torch::matmul(g, m.preconditioner()->dense().t());
  return -m.eta() * g;
}

// Property 1 (every variant, at x = h and at a perturbed x) and property 7 (separability: the
// batched all-position gradient of sum_i E_i equals each position's own gradient).
TEST(CemAttention, StepIsMinusEtaPGradientOfEnergy) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto m = make(v);
    torch::NoGradGuard outer;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    const CemAttentionCondition c = m->condition(h, ctx);
    for (const torch::Tensor& x : {h, h + 0.4 * torch::randn({kB, kN, kD}, kF64)}) {
      const torch::Tensor got = m->step(x, c) - x;
      torch::Tensor want;
      {
        torch::AutoGradMode on(true);
        want = expected_displacement(*m, x, h, ctx);
      }
      EXPECT_LT(rel_err(got, want), 1e-11);
      EXPECT_GT(want.abs().max().item<double>(), 1e-3);
    }
  }
}

// Property 1 for a step taken against a decode cache (the explicit-logit paths): the continuation's
// displacement is -eta P times the gradient of the whole sequence's energy at those positions.
TEST(CemAttention, StepAgainstACacheIsTheGradientToo) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto m = make(v);
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const int64_t first = 3, rest = kN - first;
    auto state = m->new_state();
    MixerContext ctx0 = context(v.rope, 0, first), ctx1 = context(v.rope, first, rest);
    ctx0.state = ctx1.state = state.get();
    torch::Tensor got, x;
    {
      torch::NoGradGuard no_grad;
      m->condition(h.narrow(1, 0, first), ctx0);
      const CemAttentionCondition c = m->condition(h.narrow(1, first, rest), ctx1);
      x = h.narrow(1, first, rest) + 0.3 * torch::randn({kB, rest, kD}, kF64);
      got = m->step(x, c) - x;
    }
    const torch::Tensor want = expected_displacement(*m, torch::cat({h.narrow(1, 0, first), x}, 1),
                                                     h, context(v.rope, 0, kN))
                                   .narrow(1, first, rest);
    EXPECT_LT(rel_err(got, want), 1e-11);
  }
}

// The backward of every fused D+LR path (the shared-bias op, one call per head for the per-head
// bilinear form, the augmented heads for the distance form): the gradients of a T = 1 forward with
// respect to h and to every parameter equal those of the oracle -eta P grad_x E(x; h) at x = h,
// differentiated again by autograd (x is h through a separate node, so grad_x takes only the
// query-side path). float64; the two sides differ only in summation order, so 1e-10 is generous.
TEST(CemAttention, ParameterGradientsEqualTheEnergyOracle) {
  for (const Variant& v : variants()) {
    if (v.dlr == CemDiagonal::kNone && v.attention == CemAttentionKernel::kSoftmax) continue;
    SCOPED_TRACE(v.name);
    auto m = make(v);
    const torch::Tensor h0 = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor w = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    std::vector<torch::Tensor> inputs{h0.clone().requires_grad_(true)};
    for (const auto& p : m->parameters()) inputs.push_back(p);

    const torch::Tensor got_out = m->forward(inputs[0], ctx);
    const auto got = torch::autograd::grad({(got_out * w).sum()}, inputs);

    const torch::Tensor h = h0.clone().requires_grad_(true);
    std::vector<torch::Tensor> oracle_inputs{h};
    for (const auto& p : m->parameters()) oracle_inputs.push_back(p);
    const torch::Tensor x = h * 1.0;
    torch::Tensor g = torch::autograd::grad({m->energy(x, h, ctx).sum()}, {x}, {}, true,
                                            /*create_graph=*/true)[0];
    if (m->preconditioner() != nullptr) g = torch::matmul(g, m->preconditioner()->dense().t());
    torch::Tensor eta = torch::ones({}, kF64);
    for (const auto& p : m->named_parameters())
      if (p.key() == "eta_raw") eta = torch::softplus(p.value()).squeeze();
    const torch::Tensor want_out = -eta * g;
    const auto want = torch::autograd::grad({(want_out * w).sum()}, oracle_inputs);

    EXPECT_LT(rel_err(got_out, want_out), 1e-11);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(i == 0 ? std::string("h") : m->named_parameters().keys()[i - 1]);
      EXPECT_LT(rel_err(got[i], want[i]), 1e-10);
      EXPECT_GT(want[i].abs().max().item<double>(), 1e-6);
    }
  }
}

TEST(CemAttention, EnergyIsSeparable) {
  auto m = make({"rope_dlr", true, CemRopeMode::kExact, CemDiagonal::kPerHead});
  const torch::Tensor h = torch::randn({1, kN, kD}, kF64);
  const torch::Tensor x = (h + 0.3 * torch::randn({1, kN, kD}, kF64)).requires_grad_(true);
  const MixerContext ctx = context(true, 0, kN);
  const torch::Tensor E = m->energy(x, h, ctx);  // (1, N)
  for (int64_t j = 0; j < kN; ++j) {
    const torch::Tensor g = torch::autograd::grad({E[0][j]}, {x}, {}, /*retain_graph=*/true)[0];
    for (int64_t i = 0; i < kN; ++i) {
      if (i != j) {
        EXPECT_EQ(g[0][i].abs().max().item<double>(), 0.0) << "dE_" << j << "/dx_" << i;
      }
    }
    EXPECT_GT(g[0][j].abs().max().item<double>(), 0.0);
  }
}

// cem.attention = linear, written out: at T = 1 with eta = 1 the output at i is
// sum_k W_Qk^T sum_{j<=i} (beta q_ki.k_kj / (i + 1)) k_kj, beta = 1/sqrt(d_h); at a decode offset
// the count is of every key seen.
TEST(CemAttention, LinearStepIsTheWrittenOutSum) {
  Variant v{"linear"};
  v.attention = CemAttentionKernel::kLinear;
  v.learn_eta = false;
  auto m = make(v);
  torch::NoGradGuard no_grad;
  const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
  const torch::Tensor got = m->forward(h, context(false, 0, kN));
  const double beta = 1.0 / std::sqrt(double(kDh));
  torch::Tensor want = torch::zeros({kB, kN, kD}, kF64);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t i = 0; i < kN; ++i) {
      for (int64_t k = 0; k < kH; ++k) {
        const torch::Tensor wq = m->w_q.narrow(0, k * kDh, kDh),
                            wk = m->w_k.narrow(0, k * kDh, kDh);
        const torch::Tensor q = torch::mv(wq, h[b][i]);
        torch::Tensor a = torch::zeros({kDh}, kF64);
        for (int64_t j = 0; j <= i; ++j) {
          const torch::Tensor key = torch::mv(wk, h[b][j]);
          a += beta * torch::dot(q, key) / double(i + 1) * key;
        }
        want[b][i] += torch::mv(wq.t(), a);
      }
    }
  }
  EXPECT_LT(rel_err(got, want), 1e-12);
  // Against a cache of 2 positions: query 2 + n sees 3 + n keys.
  auto state = m->new_state();
  MixerContext first = context(false, 0, 2), rest = context(false, 2, kN - 2);
  first.state = rest.state = state.get();
  m->forward(h.narrow(1, 0, 2), first);
  EXPECT_LT(rel_err(m->forward(h.narrow(1, 2, kN - 2), rest), want.narrow(1, 2, kN - 2)), 1e-12);
  // Not the softmax step (the test can fail).
  Variant soft{"plain"};
  soft.learn_eta = false;
  EXPECT_GT(rel_err(make(soft)->forward(h, context(false, 0, kN)), want), 1e-2);
}

// Property 3: the naive RoPE step is not a gradient.
TEST(CemAttention, NaiveRopeIsNotAGradient) {
  auto m = make({"rope_naive", true, CemRopeMode::kNaive});
  torch::NoGradGuard no_grad;
  const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
  const MixerContext ctx = context(true, 0, kN);
  const torch::Tensor got = m->step(h, m->condition(h, ctx)) - h;
  torch::Tensor want;
  {
    torch::AutoGradMode on(true);
    want = expected_displacement(*m, h, h, ctx);
  }
  EXPECT_GT(rel_err(got, want), 1e-3);
}

// An MHA holding the tied weights: w_qkv = [W_Q; W_K; W_K], w_o = W_Q^T.
std::shared_ptr<MhaImpl> tied_mha(const CemAttentionImpl& m, bool rope) {
  auto mha = std::make_shared<MhaImpl>(MhaOptions(kD, kH).rope(rope));
  mha->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  mha->w_qkv.copy_(torch::cat({m.w_q, m.w_k, m.w_k}, 0));
  mha->w_o.copy_(m.w_q.t());
  return mha;
}

// Property 2 (and 13: the tied tensor collects the gradients of both of its uses).
TEST(CemAttention, OneStepEqualsTiedMhaAndSharesGradients) {
  for (bool rope : {false, true}) {
    SCOPED_TRACE(rope ? "rope naive vs Llama attention" : "no rope");
    Variant v{"tied", rope, CemRopeMode::kNaive};
    v.learn_eta = false;
    auto m = make(v);
    auto mha = tied_mha(*m, rope);
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const torch::Tensor w = torch::randn({kB, kN, kD}, kF64);  // a random cotangent
    const MixerContext ctx = context(rope, 0, kN);
    const torch::Tensor a = m->forward(h, ctx), b = mha->forward(h, ctx);
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-12);
    (a * w).sum().backward();
    (b * w).sum().backward();
    const torch::Tensor gq = mha->w_qkv.grad().narrow(0, 0, kD) + mha->w_o.grad().t();
    const torch::Tensor gk =
        mha->w_qkv.grad().narrow(0, kD, kD) + mha->w_qkv.grad().narrow(0, 2 * kD, kD);
    EXPECT_LT((m->w_q.grad() - gq).abs().max().item<double>(), 1e-12);
    EXPECT_LT((m->w_k.grad() - gk).abs().max().item<double>(), 1e-12);
  }
}

// Property 14: in the augmented-head path the scale is 1/sqrt(d_h), so delta = 0 gives plain tied
// attention; the shared path likewise.
TEST(CemAttention, ZeroDiagonalEqualsPlain) {
  for (CemDiagonal dlr : {CemDiagonal::kPerHead, CemDiagonal::kShared}) {
    auto plain = make({"plain", true});
    auto with = make({"dlr", true, CemRopeMode::kExact, dlr});
    {
      torch::NoGradGuard no_grad;
      with->delta.zero_();
    }
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(true, 0, kN);
    EXPECT_LT((plain->forward(h, ctx) - with->forward(h, ctx)).abs().max().item<double>(), 1e-13);
  }
}

// A batch of 0 rows gives 0 rows (as Mha does), for every variant and step count, and so
// does its backward (it was "cannot reshape tensor of 0 elements").
TEST(CemAttention, EmptyBatchGivesAnEmptyOutput) {
  for (const Variant& v : variants()) {
    for (int64_t steps : {1, 3}) {
      auto m = make(v, steps);
      const torch::Tensor h = torch::randn({0, kN, kD}, kF64).requires_grad_(true);
      const torch::Tensor y = m->forward(h, context(v.rope, 0, kN));
      EXPECT_EQ(y.sizes(), h.sizes()) << v.name << " T=" << steps;
      y.sum().backward();
      EXPECT_EQ(h.grad().sizes(), h.sizes()) << v.name;
    }
  }
}

// Property 6 at the mixer: perturbing later inputs leaves earlier outputs bit-identical and their
// gradient exactly zero, for every variant and T.
TEST(CemAttention, Causal) {
  for (const Variant& v : variants()) {
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(v.name + " T=" + std::to_string(T));
      auto m = make(v, T);
      const torch::Tensor h = torch::randn({1, kN, kD}, kF64).requires_grad_(true);
      const MixerContext ctx = context(v.rope, 0, kN);
      const torch::Tensor y = m->forward(h, ctx);
      for (int64_t i = 0; i + 1 < kN; ++i) {
        torch::Tensor h2 = h.detach().clone();
        {
          torch::NoGradGuard no_grad;
          h2.narrow(1, i + 1, kN - i - 1).add_(torch::randn({1, kN - i - 1, kD}, kF64));
        }
        const torch::Tensor y2 = m->forward(h2, ctx);
        EXPECT_TRUE(torch::equal(y.narrow(1, 0, i + 1), y2.narrow(1, 0, i + 1)))
            << "position " << i;
        const torch::Tensor g = torch::autograd::grad({y[0][i].sum()}, {h}, {}, true)[0];
        EXPECT_EQ(g.narrow(1, i + 1, kN - i - 1).abs().max().item<double>(), 0.0)
            << "position " << i;
      }
    }
  }
}

// Property 8: T steps = T one-step maps with h fixed; keys projected once per forward; not the same
// as applying the T = 1 sub-layer T times (which recomputes keys from the iterate).
TEST(CemAttention, RecursionSemantics) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    auto m = make(v, 3);
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    const int64_t before = m->key_projections();
    const torch::Tensor y = m->forward(h, ctx);
    EXPECT_EQ(m->key_projections(), before + 1);
    const CemAttentionCondition c = m->condition(h, ctx);
    torch::Tensor x = h;
    for (int t = 0; t < 3; ++t) x = m->step(x, c);
    EXPECT_LT(err_over_scale(y, x - h), 1e-13);
    m->set_steps(1);
    torch::Tensor z = h;
    for (int t = 0; t < 3; ++t) z = z + m->forward(z, ctx);
    EXPECT_GT((y - (z - h)).abs().max().item<double>(), 1e-3);
  }
}

// The gram path (queries moved by a_t G, read-outs projected once) is the direct loop's function:
// outputs and every gradient agree in float64, for each variant it serves, T = 2, 3, 5, at offset 0
// and continuing a decode cache; auto picks it only when it saves work.
TEST(CemAttention, GramPathEqualsDirectLoop) {
  std::vector<Variant> vs;
  for (const Variant& v : variants())
    if (v.dlr == CemDiagonal::kNone) vs.push_back(v);
  vs.push_back({"rope_naive", true, CemRopeMode::kNaive});
  vs.push_back(
      {"frozen_eta", false, CemRopeMode::kExact, CemDiagonal::kNone, false, false, false, false});
  ASSERT_EQ(vs.size(), 9u);
  for (const Variant& v : vs) {
    for (int64_t T : {2, 3, 5}) {
      SCOPED_TRACE(v.name + " T=" + std::to_string(T));
      auto m = make(v, T);
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64).requires_grad_(true);
      const MixerContext ctx = context(v.rope, 0, kN);
      std::vector<torch::Tensor> inputs{h};
      for (const auto& p : m->parameters()) inputs.push_back(p);
      const torch::Tensor g = torch::randn({kB, kN, kD}, kF64);
      std::vector<torch::Tensor> out, grads[2];
      for (int path = 0; path < 2; ++path) {
        m->set_recursion(path == 0 ? CemRecursion::kDirect : CemRecursion::kGram);
        EXPECT_EQ(m->uses_gram(kB * kN), path == 1);
        out.push_back(m->forward(h, ctx));
        grads[path] = torch::autograd::grad({(out.back() * g).sum()}, inputs);
      }
      EXPECT_LT(rel_err(out[1], out[0]), 1e-12);
      for (size_t i = 0; i < inputs.size(); ++i)
        EXPECT_LT(rel_err(grads[1][i], grads[0][i]), 1e-11) << "input " << i;

      // Continuing a cache: the first 4 positions, then the last 2 through the state.
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> tail;
      for (int path = 0; path < 2; ++path) {
        m->set_recursion(path == 0 ? CemRecursion::kDirect : CemRecursion::kGram);
        auto state = m->new_state();
        MixerContext head_ctx = context(v.rope, 0, 4);
        head_ctx.state = state.get();
        m->forward(h.narrow(1, 0, 4), head_ctx);
        MixerContext tail_ctx = context(v.rope, 4, 2);
        tail_ctx.state = state.get();
        tail.push_back(m->forward(h.narrow(1, 4, 2), tail_ctx));
      }
      EXPECT_LT(rel_err(tail[1], tail[0]), 1e-12);
      EXPECT_LT(rel_err(tail[1], out[0].narrow(1, 4, 2)), 1e-12);
    }
  }
  // Auto: gram only when (T - 1) * tokens >= 2 D, T >= 2, no D+LR.
  auto m = make(variants()[0], 2);
  EXPECT_FALSE(m->uses_gram(2 * kD - 1));
  EXPECT_TRUE(m->uses_gram(2 * kD));
  m->set_steps(1);
  EXPECT_FALSE(m->uses_gram(1000));
  auto dlr = make(variants()[1], 4);
  ASSERT_EQ(dlr->options().dlr(), CemDiagonal::kPerHead);
  EXPECT_FALSE(dlr->uses_gram(1000));
  dlr->set_recursion(CemRecursion::kGram);
  EXPECT_FALSE(dlr->uses_gram(1000));  // not available under D+LR
}

// Property 9: decoding in chunks with the K-only cache gives the full forward's output, T = 1,
// 2, 4.
TEST(CemAttention, DecodingEqualsFullForward) {
  Variant naive{"rope_naive", true, CemRopeMode::kNaive};
  std::vector<Variant> vs = variants();
  vs.push_back(naive);
  for (const Variant& v : vs) {
    for (int64_t T : {1, 2, 4}) {
      SCOPED_TRACE(v.name + " T=" + std::to_string(T));
      auto m = make(v, T);
      torch::NoGradGuard no_grad;
      const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
      const torch::Tensor full = m->forward(h, context(v.rope, 0, kN));
      auto state = m->new_state();
      std::vector<torch::Tensor> parts;
      int64_t pos = 0;
      for (int64_t len : {2, 1, 1, 2}) {
        MixerContext ctx = context(v.rope, pos, len);
        ctx.state = state.get();
        parts.push_back(m->forward(h.narrow(1, pos, len), ctx));
        pos += len;
      }
      EXPECT_LT(err_over_scale(torch::cat(parts, 1), full), 1e-12);
      const auto& s = static_cast<const CemAttentionState&>(*state);
      EXPECT_EQ(s.k.values().sizes(), (std::vector<int64_t>{kB, kH, kN, kDh}));
      EXPECT_EQ(s.v.defined(), v.rope && v.rope_mode == CemRopeMode::kNaive);  // K only otherwise
      EXPECT_EQ(s.h.defined(), v.dlr != CemDiagonal::kNone);
    }
  }
}

// Property 10: with P = I or the PSD preconditioner and a small eta every step lowers each
// position's energy.
TEST(CemAttention, SmallStepsDescend) {
  std::vector<Variant> vs = {{"plain"},
                             {"dlr", true, CemRopeMode::kExact, CemDiagonal::kPerHead},
                             {"distance", false, CemRopeMode::kExact, CemDiagonal::kShared, true}};
  for (Variant v : vs) {
    SCOPED_TRACE(v.name);
    auto m = make(v);
    {
      torch::NoGradGuard no_grad;
      m->named_parameters()["eta_raw"].fill_(std::log(std::exp(1e-3) - 1.0));
    }
    torch::NoGradGuard no_grad;
    const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
    const MixerContext ctx = context(v.rope, 0, kN);
    const CemAttentionCondition c = m->condition(h, ctx);
    torch::Tensor x = h;
    // Position 0 sees only itself: its energy is linear in x, so it strictly descends too.
    for (int t = 0; t < 5; ++t) {
      const torch::Tensor next = m->step(x, c);
      EXPECT_TRUE((m->energy(next, h, ctx) < m->energy(x, h, ctx)).all().item<bool>())
          << "step " << t;
      x = next;
    }
  }
  // PSD preconditioner: its descent needs no small eta beyond P's own scale.
  Variant psd{"psd", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true, true};
  auto m = make(psd);
  torch::NoGradGuard no_grad;
  m->named_parameters()["precond.p"].fill_(std::log(std::exp(1e-3) - 1.0));
  m->named_parameters()["precond.u"].mul_(0.03);
  const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
  const MixerContext ctx = context(false, 0, kN);
  const CemAttentionCondition c = m->condition(h, ctx);
  const torch::Tensor next = m->step(h, c);
  EXPECT_TRUE((m->energy(next, h, ctx) < m->energy(h, h, ctx)).all().item<bool>());
}

// Property 16: W_Q -> a W_Q, W_K -> W_K / a changes nothing; (a W_Q, a W_K) acts as (a^2 W_Q, W_K).
TEST(CemAttention, ScaleInvariance) {
  Variant v{"plain"};
  auto m = make(v);
  auto m2 = make(v);
  torch::NoGradGuard no_grad;
  const torch::Tensor h = torch::randn({kB, kN, kD}, kF64);
  const MixerContext ctx = context(false, 0, kN);
  const torch::Tensor y = m->forward(h, ctx);
  const double a = 1.7;
  m2->w_q.mul_(a);
  m2->w_k.div_(a);
  EXPECT_LT(rel_err(m2->forward(h, ctx), y), 1e-13);
  m2->w_k.mul_(a * a);  // (a W_Q, a W_K)
  const torch::Tensor both = m2->forward(h, ctx);
  m2->w_q.mul_(a);
  m2->w_k.div_(a);  // (a^2 W_Q, W_K)
  EXPECT_LT(rel_err(both, m2->forward(h, ctx)), 1e-13);
  EXPECT_GT(rel_err(both, y * a * a), 1e-3);  // the logits changed too: not a plain rescaling
  // And the energy scales with the logits: E(a W_Q, W_K / a) = E.
  m2->w_q.div_(a);
  m2->w_k.div_(a);  // back to (a W_Q, W_K / a)
  EXPECT_LT(rel_err(m2->energy(h, h, ctx), m->energy(h, h, ctx)), 1e-13);
}

// Property 12 (per module) and 13: the projections are the only matrices, one tensor each.
TEST(CemAttention, ParameterCounts) {
  auto count = [](const Variant& v) {
    auto m = make(v);
    int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    return n;
  };
  Variant frozen{"frozen"};
  frozen.learn_eta = false;
  EXPECT_EQ(count(frozen), 2 * kD * kH * kDh);
  EXPECT_EQ(count({"plain"}), 2 * kD * kH * kDh + 1);
  EXPECT_EQ(count({"h", false, CemRopeMode::kExact, CemDiagonal::kPerHead}),
            2 * kD * kD + 1 + kH * kD);
  EXPECT_EQ(count({"s", false, CemRopeMode::kExact, CemDiagonal::kShared}), 2 * kD * kD + 1 + kD);
  EXPECT_EQ(count({"p", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true}),
            2 * kD * kD + kD + 2 * kD * kRank);  // eta fixed at 1 with P
  EXPECT_EQ(count({"psd", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true, true}),
            2 * kD * kD + kD + kD * kRank);
  auto m = make({"plain"});
  std::vector<std::string> names;
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"w_q", "w_k", "eta_raw"}));
}

// Property 11 for the attention's preconditioner: factored = dense, symmetric, P = I at init,
// gradients reach p and V.
TEST(CemAttention, PreconditionerAlgebra) {
  torch::manual_seed(3);
  CemPreconditionerImpl fresh(kD, kRank, false, ParamKind::kAttention, torch::kCPU);
  fresh.to(torch::kFloat64);
  // P = I up to the float32 rounding of p = log(e - 1); the low-rank part is exactly 0 (V = 0).
  EXPECT_LT((fresh.dense() - torch::eye(kD, kF64)).abs().max().item<double>(), 1e-7);
  EXPECT_TRUE(torch::equal(fresh.v, torch::zeros_like(fresh.v)));
  const torch::Tensor g = torch::randn({3, 5, kD}, kF64);
  EXPECT_LT(rel_err(fresh.apply(g), g), 1e-7);
  auto m = make({"p", false, CemRopeMode::kExact, CemDiagonal::kNone, false, true});
  const torch::Tensor P = m->preconditioner()->dense();
  EXPECT_LT((P - P.t()).abs().max().item<double>(), 1e-15);
  EXPECT_LT(rel_err(m->preconditioner()->apply(g), torch::matmul(g, P.t())), 1e-14);
  // Fresh P (V = 0): one backward reaches p and V (U from the second step on).
  auto fresh_m = std::make_shared<CemAttentionImpl>(
      CemAttentionOptions(kD, kH).step(CemStepOptions().precond(true).precond_rank(kRank)));
  fresh_m->to(torch::kFloat64);
  fresh_m->forward(torch::randn({kB, kN, kD}, kF64), context(false, 0, kN)).pow(2).sum().backward();
  auto params = fresh_m->named_parameters();
  EXPECT_GT(params["precond.p"].grad().abs().max().item<double>(), 0.0);
  EXPECT_GT(params["precond.v"].grad().abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace cemfrac

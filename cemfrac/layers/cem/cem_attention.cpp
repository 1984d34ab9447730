// The step is causal attention; the plain tied case goes through the same causal_attention (fused
// full-sequence kernel, explicit-matmul path with a state) as MHA, with V = K passed as one tensor.
//
// D+LR per head uses augmented heads: q~ = [W_Qk x; delta_k * x (; 1)], k~ = v~ = [W_Kk h; h (;
// bias)] of width W = d_h + D (+ 1 for the distance form's key bias -1/2 sum_a delta_ka h_ja^2).
// causal_attention scales by 1/sqrt(W); the queries are multiplied by sqrt(W / d_h) first, so the
// logits carry exactly beta = 1/sqrt(d_h), as the energy says. The output's first d_h channels go
// through W_Q^T, the next D are multiplied by delta_k and summed over heads, the last (bias)
// channel is dropped. Continuing a decode cache, per head takes explicit logits q k^T + (delta_k *
// x) h^T instead (h broadcast over the heads, nothing of size H T D materialised per token).
//
// D+LR shared adds one (N, T) logit bias beta (delta * x) h^T to every head and reads the diagonal
// term once: delta * (sum_k P_k) h, so it costs two D-wide matmuls instead of H; the bilinear form
// runs as one op (causal_attention_shared_bias: fused for full sequences), the distance form with
// explicit logits.
#include "cemfrac/layers/cem/cem_attention.h"

#include <torch/types.h>

#include <cmath>
#include <limits>
#include <string>

#include "cemfrac/core/check.h"
#include "cemfrac/ops/causal_attention.h"
#include "cemfrac/ops/linear.h"
#include "cemfrac/ops/rope.h"
#include "cemfrac/ops/symmetric_gram.h"

namespace cemfrac {

namespace {

// (B, N, H d_h) -> (B, H, N, d_h)
// Sizes spelled out (no -1): a batch of 0 rows has nothing to infer them from.
torch::Tensor split_heads(const torch::Tensor& t, int64_t H) {
  return t.view({t.size(0), t.size(1), H, t.size(2) / H}).transpose(1, 2);
}

// (B, H, N, d_h) -> (B, N, H d_h)
torch::Tensor merge_heads(const torch::Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// (N, T) true where key t is hidden from query n at absolute position offset + n.
torch::Tensor hidden_mask(int64_t N, int64_t T, int64_t offset, torch::Device device) {
  return torch::ones({N, T}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .triu(offset + 1);
}

// cem.attention = linear: the read-out sum_j w_ij v_j with w_ij = beta q_i.k_j / n_i over the keys
// query i sees (n_i of them: positions 0..offset + i), beta = 1/sqrt(d_h) as causal_attention's.
// q (B, H, N, d_h), k and v (B, H, T, d_h) -> (B, H, N, d_h).
torch::Tensor causal_linear_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, int64_t offset) {
  const int64_t N = q.size(2), T = k.size(2);
  const double beta = 1.0 / std::sqrt(double(q.size(-1)));
  const torch::Tensor n_i =
      torch::arange(offset + 1, offset + N + 1, q.options()).view({N, 1});  // (N, 1)
  const torch::Tensor w = (torch::matmul(q, k.transpose(-2, -1)) * beta)
                              .masked_fill(hidden_mask(N, T, offset, q.device()), 0.0) /
                          n_i;  // (B, H, N, T)
  return torch::matmul(w, v);
}

}  // namespace

CemAttentionImpl::CemAttentionImpl(const CemAttentionOptions& o)
    : options_(o), recursion_(o.recursion()) {
  const int64_t D = o.d_model(), H = o.n_heads();
  TORCH_INTERNAL_ASSERT(D % H == 0, "cem_attention: n_heads must divide d_model");
  TORCH_INTERNAL_ASSERT(
      o.attention() == CemAttentionKernel::kSoftmax || o.dlr() == CemDiagonal::kNone,
      "cem_attention: linear attention has no D+LR form");
  head_dim_ = D / H;
  const torch::Device device = o.device();
  w_q = add_parameter("w_q", init_normal({H * head_dim_, D}, o.init_std(), device),
                      ParamKind::kAttention, ParamGroup::kDecay);
  w_k = add_parameter("w_k", init_normal({H * head_dim_, D}, o.init_std(), device),
                      ParamKind::kAttention, ParamGroup::kDecay);
  if (o.step().learn_eta() && !o.step().precond()) {
    eta_.raw =
        add_parameter("eta_raw", init_constant({1}, softplus_inverse(o.step().eta_init()), device),
                      ParamKind::kAttention, ParamGroup::kNoDecay);
  }
  if (o.dlr() == CemDiagonal::kPerHead) {
    delta = add_parameter("delta", init_constant({H, D}, 0.0, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  } else if (o.dlr() == CemDiagonal::kShared) {
    delta = add_parameter("delta", init_constant({D}, 0.0, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  }
  prox_.on = o.step().prox() != CemProxMode::kNone;
  if (o.step().prox() == CemProxMode::kLearned) {
    prox_.raw = add_parameter("lambda_raw", init_constant({1}, softplus_inverse_of_one(), device),
                              ParamKind::kAttention, ParamGroup::kNoDecay);
  }
  if (o.step().precond()) {
    precond_ = register_module("precond", std::make_shared<CemPreconditionerImpl>(
                                              D, o.step().precond_rank(), o.step().precond_psd(),
                                              ParamKind::kAttention, device));
  }
}

std::unique_ptr<MixerState> CemAttentionImpl::new_state() const {
  return std::make_unique<CemAttentionState>();
}

CemAttentionCondition CemAttentionImpl::condition(const torch::Tensor& h, const MixerContext& ctx,
                                                  int64_t step) {
  const int64_t B = h.size(0), N = h.size(1), H = options_.n_heads(), D = options_.d_model();
  CemAttentionCondition c;
  c.offset = ctx.offset;
  c.anchor = h;
  if (rotates()) {
    TORCH_INTERNAL_ASSERT(ctx.rope_cos.defined(), "cem_attention: RoPE on but no rotary tables");
    c.cos = ctx.rope_cos;
    c.sin = ctx.rope_sin;
  }

  // 1. Keys from the fixed input, once per forward: (B, H, N, d_h); rotated unless rope_mode =
  // none.
  ++key_projections_;
  torch::Tensor k = split_heads(cemfrac::linear(h, w_k), H);
  torch::Tensor v = k;  // values == keys
  if (rotates()) {
    k = apply_rope(k, c.cos, c.sin);
    // Exact: the values are the rotated keys (one tensor). Naive: unrotated values (an ablation).
    if (options_.rope_mode() == CemRopeMode::kExact) v = k;
  }
  torch::Tensor hh = options_.dlr() != CemDiagonal::kNone ? h : torch::Tensor();

  // 2. With a decode state, prepend everything seen before and remember the result.
  if (ctx.state != nullptr) {
    auto* full = static_cast<CemAttentionState*>(ctx.state);
    CemKeyCache* state = full;  // step 0 (and every step with fixed keys)
    if (step > 0) {
      if (static_cast<int64_t>(full->iterate.size()) < step) full->iterate.resize(step);
      state = &full->iterate[step - 1];
    }
    CEMFRAC_CHECK(
        step == 0 || state->k.defined() || ctx.offset == 0,
        "decode state of cem_attention: step {} has no keys for the {} positions seen before; "
        "decode with the recursion_keys setting the state was started with",
        step, ctx.offset);
    const bool separate_v = !v.is_same(k);
    k = state->k.append(k, ctx.offset, ctx.capacity, 2, "cem_attention");  // (B, H, T, d_h)
    v = separate_v ? state->v.append(v, ctx.offset, ctx.capacity, 2, "cem_attention") : k;
    if (hh.defined())
      hh = state->h.append(hh, ctx.offset, ctx.capacity, 1, "cem_attention");  // (B, T, D)
  }
  c.k = k;
  c.v = v;
  c.h = hh;
  const int64_t T = k.size(2);

  // 3. D+LR: the diagonal's key-side pieces, also once. Per head, a full sequence (training, the
  // first chunk) runs the fused per-head-diagonal op (bilinear form) or the augmented
  // heads through the fused kernel (distance form); a continuation against a cache uses explicit
  // logits instead, so no (B, H, T, d_h + D) tensor is rebuilt per decoded token.
  if (options_.dlr() == CemDiagonal::kPerHead && (ctx.offset != 0 || T != N)) {
    if (options_.dlr_distance()) {
      // -1/2 sum_a delta_ka h_ja^2: (B, T, H) -> (B, H, 1, T)
      c.key_bias = torch::matmul(hh * hh, delta.t()).mul(-0.5).transpose(1, 2).unsqueeze(2);
    }
  } else if (options_.dlr() == CemDiagonal::kPerHead && !options_.dlr_distance()) {
    // The bilinear form over a full sequence: one fused op in direction(), nothing to build here.
    c.per_head_fused = true;
  } else if (options_.dlr() == CemDiagonal::kPerHead) {
    std::vector<torch::Tensor> kp{k, hh.unsqueeze(1).expand({B, H, T, D})};
    std::vector<torch::Tensor> vp{v, kp[1]};
    if (options_.dlr_distance()) {
      // -1/2 sum_a delta_ka h_ja^2: (B, T, H) -> (B, H, T, 1)
      torch::Tensor bias =
          torch::matmul(hh * hh, delta.t()).mul(-0.5).transpose(1, 2).unsqueeze(-1);
      kp.push_back(bias);
      vp.push_back(bias);
    }
    c.k_aug = torch::cat(kp, -1);
    c.v_aug = v.is_same(k) ? c.k_aug : torch::cat(vp, -1);
  } else if (options_.dlr() == CemDiagonal::kShared && options_.dlr_distance()) {
    c.key_bias = torch::matmul(hh * hh, delta).mul(-0.5).view({B, 1, 1, T});
  }
  return c;
}

namespace {

// The read-out a and the diagonal term under the per-head D+LR diagonal: the fused op, the
// explicit logits against a cache, or attention over keys augmented with the diagonal's columns.
void per_head_dlr_read(const torch::Tensor& q, const torch::Tensor& x, const torch::Tensor& delta,
                       const CemAttentionCondition& c, const CemAttentionOptions& opt, int64_t d_h,
                       torch::Tensor& a, torch::Tensor& diag) {
  const int64_t B = x.size(0), N = x.size(1), H = opt.n_heads(), D = opt.d_model();
  const int64_t T = c.k.size(2);
  const double beta = 1.0 / std::sqrt(double(d_h));
  if (c.per_head_fused) {
    // One op: head k's logits beta (q_k k_k^T + (delta_k * x) h^T) and the read-outs
    // sum_k delta_k * (P_k h), with no (B, H, T, d_h + D) key, query or output tensor and no
    // (B, H, N, D) product of delta and x.
    const AttentionWithRead o = causal_attention_head_diag(q, c.k, c.v, x, c.h, delta, c.offset);
    a = o.out;
    diag = o.read;
    return;
  }
  if (!c.k_aug.defined()) {
    // Explicit logits beta (q k^T + (delta_k * x) h^T [+ key bias]) against the cache.
    const torch::Tensor xd = x.unsqueeze(1) * delta.view({1, H, 1, D});  // (B, H, N, D)
    const torch::Tensor hs = c.h.unsqueeze(1);                           // (B, 1, T, D)
    torch::Tensor scores =
        torch::matmul(q, c.k.transpose(-2, -1)) + torch::matmul(xd, hs.transpose(-2, -1));
    if (c.key_bias.defined()) scores = scores + c.key_bias;
    scores = (scores * beta)
                 .masked_fill(hidden_mask(N, T, c.offset, x.device()),
                              -std::numeric_limits<double>::infinity());
    const torch::Tensor probs = torch::softmax(scores, -1);               // (B, H, N, T)
    a = torch::matmul(probs, c.v);                                        // (B, H, N, d_h)
    diag = (torch::matmul(probs, hs) * delta.view({1, H, 1, D})).sum(1);  // (B, N, D)
    if (opt.dlr_distance()) diag = diag - delta.sum(0) * x;
    return;
  }
  std::vector<torch::Tensor> qp{q, x.unsqueeze(1) * delta.view({1, H, 1, D})};  // (B, H, N, D)
  if (opt.dlr_distance()) qp.push_back(torch::ones({B, H, N, 1}, x.options()));
  torch::Tensor q_aug = torch::cat(qp, -1);
  const int64_t W = q_aug.size(-1);
  q_aug = q_aug * std::sqrt(double(W) / double(d_h));  // causal_attention's 1/sqrt(W) -> beta
  torch::Tensor o = causal_attention(q_aug, c.k_aug, c.v_aug, c.offset);  // (B, H, N, W)
  a = o.narrow(-1, 0, d_h);
  diag = (o.narrow(-1, d_h, D) * delta.view({1, H, 1, D})).sum(1);  // sum_k delta_k * (P_k h)
  if (opt.dlr_distance()) diag = diag - delta.sum(0) * x;           // - sum_k delta_k * x
}

// The same under the diagonal shared by the heads: the fused op, or (distance form) explicit
// logits with the key bias.
void shared_dlr_read(const torch::Tensor& q, const torch::Tensor& x, const torch::Tensor& delta,
                     const CemAttentionCondition& c, const CemAttentionOptions& opt, int64_t d_h,
                     torch::Tensor& a, torch::Tensor& diag) {
  const int64_t N = x.size(1), H = opt.n_heads();
  const int64_t T = c.k.size(2);
  const double beta = 1.0 / std::sqrt(double(d_h));
  if (!opt.dlr_distance()) {
    // One op: the bias (delta * x) h^T shared by the heads, and (sum_k P_k) h read once.
    const AttentionWithRead o =
        causal_attention_shared_bias(q, c.k, c.v, x * delta, c.h, c.h, c.offset);
    a = o.out;
    diag = delta * o.read;
    return;
  }
  // Distance form: logits beta (q k^T + (delta * x) h^T + key bias), causal mask, softmax.
  torch::Tensor scores = torch::matmul(q, c.k.transpose(-2, -1));                  // (B, H, N, T)
  scores = scores + torch::matmul(x * delta, c.h.transpose(-2, -1)).unsqueeze(1);  // + (B, 1, N, T)
  if (c.key_bias.defined()) scores = scores + c.key_bias;
  scores = (scores * beta)
               .masked_fill(hidden_mask(N, T, c.offset, x.device()),
                            -std::numeric_limits<double>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1);  // (B, H, N, T)
  a = torch::matmul(probs, c.v);                     // (B, H, N, d_h)
  diag = delta * torch::matmul(probs.sum(1), c.h);   // (B, N, D)
  if (opt.dlr_distance()) diag = diag - double(H) * delta * x;
}

}  // namespace

torch::Tensor CemAttentionImpl::direction(const torch::Tensor& x,
                                          const CemAttentionCondition& c) const {
  const int64_t H = options_.n_heads(), d_h = head_dim_;

  // 1. Queries from the iterate (the only projection repeated per step): (B, H, N, d_h).
  torch::Tensor q = split_heads(cemfrac::linear(x, w_q), H);
  if (rotates()) q = apply_rope(q, c.cos, c.sin);

  // 2. Attention read-out a (B, H, N, d_h) and, under D+LR, the diagonal term (B, N, D).
  torch::Tensor a, diag;
  switch (options_.dlr()) {
    case CemDiagonal::kNone:
      a = options_.attention() == CemAttentionKernel::kLinear
              ? causal_linear_attention(q, c.k, c.v, c.offset)
              : causal_attention(q, c.k, c.v, c.offset);
      break;
    case CemDiagonal::kPerHead: per_head_dlr_read(q, x, delta, c, options_, d_h, a, diag); break;
    case CemDiagonal::kShared: shared_dlr_read(q, x, delta, c, options_, d_h, a, diag); break;
  }

  // 3. Exact RoPE: rotate the read-out back by R_{-i}; then the output projection W_Q^T.
  if (rotates() && options_.rope_mode() == CemRopeMode::kExact)
    a = apply_rope(a, c.cos, c.sin, /*inverse=*/true);
  torch::Tensor d = torch::matmul(merge_heads(a), w_q);  // (B, N, D): same tensor as the queries'
  if (diag.defined()) d = d + diag;

  // 4. The proximal term's gradient lambda (x - h), then the preconditioner on the whole gradient,
  // applied without forming the D x D matrix.
  if (prox_.on && c.anchor.defined()) d = d - prox_.gradient(x, c.anchor);
  if (precond_) d = precond_->apply(d);
  return d;
}

torch::Tensor CemAttentionImpl::step(const torch::Tensor& x, const CemAttentionCondition& c) const {
  return eta_.advance(x, direction(x, c));
}

bool CemAttentionImpl::uses_gram(int64_t tokens) const {
  const int64_t T = options_.step().steps();
  if (T < 2 || options_.dlr() != CemDiagonal::kNone) return false;
  // The gram path moves only the queries: keys from the iterates, the proximal term and step_norm
  // act on x itself.
  if (options_.recursion_keys() == CemRecursionKeys::kIterate || prox_.on ||
      options_.step().step_norm()) {
    return false;
  }
  if (recursion_ != CemRecursion::kAuto) return recursion_ == CemRecursion::kGram;
  return (T - 1) * tokens >= 2 * options_.d_model();
}

torch::Tensor CemAttentionImpl::readout(const torch::Tensor& q_merged,
                                        const CemAttentionCondition& c) const {
  torch::Tensor q = split_heads(q_merged, options_.n_heads());
  if (rotates()) q = apply_rope(q, c.cos, c.sin);
  torch::Tensor a = options_.attention() == CemAttentionKernel::kLinear
                        ? causal_linear_attention(q, c.k, c.v, c.offset)
                        : causal_attention(q, c.k, c.v, c.offset);
  if (rotates() && options_.rope_mode() == CemRopeMode::kExact)
    a = apply_rope(a, c.cos, c.sin, /*inverse=*/true);
  return merge_heads(a);  // (B, N, H d_h)
}

// Without D+LR the step is x <- x + a_t M with M = eta P(W_Q) (H d_h, D): P and eta act on each row
// of the read-out a_t W_Q linearly, so they can be applied to W_Q once. The next queries are then
//     q_(t+1) = x^(t+1) W_Q^T = q_t + a_t G,   G = M W_Q^T  (H d_h, H d_h),
// and the displacement is x^(T) - h = (a_0 + ... + a_(T-1)) M. Each extra step costs one
// (tokens x D x D) matmul plus the attention core instead of two (query and output projections),
// for a one-off D^3 to form G: a saving once (T - 1) * tokens > D. Same function as the direct
// loop; the tests compare the two paths and their gradients in float64.
torch::Tensor CemAttentionImpl::forward_gram(const torch::Tensor& h,
                                             const CemAttentionCondition& c) const {
  const torch::Tensor M = eta_.scale(precond_ ? precond_->apply(w_q) : w_q);  // (H d_h, D)
  // G = eta W_Q W_Q^T is symmetric without a preconditioner: half a matmul through syrk.
  const torch::Tensor G = precond_ ? torch::matmul(M, w_q.t()) : eta_.scale(symmetric_gram(w_q));
  const int64_t B = h.size(0), N = h.size(1), HD = w_q.size(0);
  torch::Tensor q = cemfrac::linear(h, w_q).view({B * N, HD});  // (B N, H d_h)
  torch::Tensor sum;
  const int64_t T = options_.step().steps();
  for (int64_t t = 0; t < T; ++t) {
    const torch::Tensor a = readout(q.view({B, N, HD}), c).reshape({B * N, HD});
    sum = t == 0 ? a : sum + a;
    if (t + 1 < T) q = torch::addmm(q, a, G);  // q + a G in one BLAS call
  }
  return torch::matmul(sum, M).view({B, N, M.size(1)});
}

torch::Tensor CemAttentionImpl::forward(const torch::Tensor& h, const MixerContext& ctx) {
  // A batch with no tokens has nothing to attend: its (empty) output, still on h's graph.
  if (h.numel() == 0) return h * 0;
  const CemAttentionCondition c = condition(h, ctx);  // keys once (step 0's keys under iterate)
  const bool trace = ctx.observer != nullptr && ctx.offset == 0 && ctx.state == nullptr;
  auto report = [&](int64_t t, const torch::Tensor& e) {
    (*ctx.observer)("energy." + std::to_string(t), e.detach());
  };
  if (!trace && uses_gram(h.size(0) * h.size(1))) return forward_gram(h, c);
  // T = 1: the displacement is eta d itself (no h + eta d - h round trip). The proximal term's
  // gradient is 0 at x = h, and step_norm and iterate keys start at the second step, so none of
  // them changes T = 1.
  if (options_.step().steps() == 1 && !trace) return eta_.scale(direction(h, c));
  const bool iterate = options_.recursion_keys() == CemRecursionKeys::kIterate;
  const torch::Tensor rms_h = options_.step().step_norm() ? cem_rms(h) : torch::Tensor();
  torch::Tensor x = h;  // x^(0) = h
  // The energy traced after step t is the one step t descended (its keys: h, or x^(t) under
  // iterate).
  if (trace) report(0, energy(x, h, ctx));
  for (int64_t t = 0; t < options_.step().steps(); ++t) {
    if (t > 0 && rms_h.defined()) x = cem_rescale_to(x, rms_h);  // step_norm
    if (iterate && t > 0) {
      CemAttentionCondition ct = condition(x, ctx, t);  // keys and values from x^(t), causal
      ct.anchor = h;
      const torch::Tensor keys = x;
      x = step(x, ct);
      if (trace) report(t + 1, energy(x, keys, ctx, h));
    } else {
      x = step(x, c);
      if (trace) report(t + 1, energy(x, h, ctx));
    }
  }
  return x - h;  // the displacement the block adds to z
}

torch::Tensor CemAttentionImpl::energy(const torch::Tensor& x, const torch::Tensor& h,
                                       const MixerContext& ctx, const torch::Tensor& anchor) const {
  const int64_t N = x.size(1), H = options_.n_heads(), D = options_.d_model();
  const double beta = 1.0 / std::sqrt(double(head_dim_));
  torch::Tensor q = split_heads(cemfrac::linear(x, w_q), H);  // (B, H, N, d_h)
  torch::Tensor k = split_heads(cemfrac::linear(h, w_k), H);
  if (rotates()) {
    q = apply_rope(q, ctx.rope_cos, ctx.rope_sin);
    k = apply_rope(k, ctx.rope_cos, ctx.rope_sin);
  }
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1));  // (B, H, N, N)
  if (options_.dlr() != CemDiagonal::kNone) {
    const torch::Tensor dk = options_.dlr() == CemDiagonal::kPerHead
                                 ? delta.view({1, H, 1, D})
                                 : delta.view({1, 1, 1, D}).expand({1, H, 1, D});
    const torch::Tensor xs = x.unsqueeze(1), hs = h.unsqueeze(1);  // (B, 1, N, D)
    s = s + torch::matmul(xs * dk, hs.transpose(-2, -1));          // x_i^T diag(delta_k) h_j
    if (options_.dlr_distance()) {
      // -1/2 (x_i - h_j)^T diag(delta_k) (x_i - h_j) = x_i^T diag(delta_k) h_j
      //     - 1/2 x_i^T diag(delta_k) x_i - 1/2 h_j^T diag(delta_k) h_j   (the x-only term stays:
      //     it
      // has a gradient even though the softmax does not see it)
      const torch::Tensor xx = (xs * xs * dk).sum(-1, /*keepdim=*/true);  // (B, H, N, 1)
      const torch::Tensor hh = (hs * hs * dk).sum(-1).unsqueeze(2);       // (B, H, 1, N)
      s = s - 0.5 * xx - 0.5 * hh;
    }
  }
  torch::Tensor e;
  if (options_.attention() == CemAttentionKernel::kLinear) {
    // -1/(2 n_i) sum_k sum_{j<=i} beta s_kij^2 (no D+LR term: the config refuses one)
    const torch::Tensor n_i = torch::arange(1, N + 1, x.options()).view({1, N});  // (1, N)
    e = -(s * s).masked_fill(hidden_mask(N, N, 0, x.device()), 0.0).sum({1, 3}) * (0.5 * beta) /
        n_i;  // (B, N)
  } else {
    s = (s * beta).masked_fill(hidden_mask(N, N, 0, x.device()),
                               -std::numeric_limits<double>::infinity());
    e = -(torch::logsumexp(s, -1).sum(1)) / beta;  // (B, N)
  }
  if (prox_.on) e = e + prox_.energy(x, anchor.defined() ? anchor : h);
  return e;
}

// Counted as the direct loop (the gram path is a cheaper way to the same function; its saving shows
// as speed). Keys W_K h once: 2 D H d_h (again every step t >= 1 with recursion_keys = iterate).
// Per step: queries and W_Q^T 2 D H d_h each, scores and read-out against tied K = V 2 H d_h
// context each, P. D+LR over H_delta diagonals (H per head, 1 shared): delta * x and the read-out's
// delta 2 D H_delta each, the logit term (delta x) h^T and the read-out P h 2 D H_delta context
// each; the distance form adds its key bias 2 D H_delta with every key projection and 2 D per step
// for its query term.
double CemAttentionImpl::forward_flops_per_token(int64_t context) const {
  const double D = double(options_.d_model()), Hd = double(options_.n_heads() * head_dim_);
  const double S = double(context), T = double(options_.step().steps());
  const double Hdelta = options_.dlr() == CemDiagonal::kPerHead  ? double(options_.n_heads())
                        : options_.dlr() == CemDiagonal::kShared ? 1.0
                                                                 : 0.0;
  const bool distance = Hdelta > 0 && options_.dlr_distance();
  const double key_projections = options_.recursion_keys() == CemRecursionKeys::kIterate ? T : 1.0;
  const double keys = 2.0 * D * Hd + (distance ? 2.0 * D * Hdelta : 0.0);
  double per_step = 4.0 * D * Hd + 4.0 * Hd * S +
                    cem_precond_flops_per_token(options_.step(), options_.d_model());
  per_step += Hdelta * (4.0 * D + 4.0 * D * S) + (distance ? 2.0 * D : 0.0);
  return key_projections * keys + T * per_step;
}

}  // namespace cemfrac

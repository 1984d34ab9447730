// LibTorch 1.13 has no public scaled_dot_product_attention (only the private
// at::_scaled_dot_product_attention), so attention is written with explicit matmuls, a causal mask and
// a softmax; this also keeps the masked entries exact zeros, which the bitwise causality test relies on.
//
// Training and full-sequence forwards (offset 0, as many keys as queries) take a fused path instead:
// one custom autograd Function that runs every (batch, head) pair as its own small problem on one thread
// (at::parallel_for over the pairs, OpenBLAS held to one thread meanwhile): scores into a per-thread
// scratch block that stays in cache, the causal mask and the softmax on it, then P V written straight
// into the merged-heads layout (B, N, H d_h). Backward recomputes nothing: it uses the saved P. This
// avoids the batched matmuls' per-call thread fork/join on small matrices, the masked_fill and scale
// passes and four full-size (B, H, N, N) temporaries per layer; masked probabilities stay exact zeros.
#include "cemfrac/layers/base/mha.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <limits>

#include "cemfrac/core/check.h"
#include "cemfrac/layers/base/rope.h"

namespace cemfrac {
namespace {

// Holds OpenBLAS to one thread for its lifetime (each of our threads then runs its own small gemms);
// restores the previous count. A no-op when the BLAS is not OpenBLAS.
class SerialBlasGuard {
 public:
  SerialBlasGuard() {
    using Get = int (*)();
    static const auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    static const auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (get != nullptr && set != nullptr) {
      previous_ = get();
      if (previous_ > 1) {
        set_ = set;
        set_(1);
      }
    }
  }
  ~SerialBlasGuard() {
    if (set_ != nullptr) set_(previous_);
  }
  SerialBlasGuard(const SerialBlasGuard&) = delete;
  SerialBlasGuard& operator=(const SerialBlasGuard&) = delete;

 private:
  using Set = void (*)(int);
  Set set_ = nullptr;
  int previous_ = 1;
};

// From a contiguous (N, N) block of scores s = q k^T to probabilities p (same layout): row n is
// softmax(scale * s[n, 0..n]) followed by exact zeros (the keys after n are hidden from query n).
template <typename scalar_t>
void causal_softmax_rows(const scalar_t* s, scalar_t* p, int64_t n_rows, double scale) {
  for (int64_t n = 0; n < n_rows; ++n) {
    const scalar_t* in = s + n * n_rows;
    scalar_t* out = p + n * n_rows;
    scalar_t top = in[0];
    for (int64_t t = 1; t <= n; ++t) top = std::max(top, in[t]);
    const auto c = static_cast<scalar_t>(scale);
    double total = 0;
    for (int64_t t = 0; t <= n; ++t) {
      out[t] = std::exp((in[t] - top) * c);
      total += out[t];
    }
    const auto inv = static_cast<scalar_t>(1.0 / total);
    for (int64_t t = 0; t <= n; ++t) out[t] *= inv;
    for (int64_t t = n + 1; t < n_rows; ++t) out[t] = 0;
  }
}

// In place on a (N, N) block of scores' gradients dP (leading dimension ld), with P the saved
// probabilities: dS = P * (dP - rowsum(dP * P)); entries above the diagonal become 0.
template <typename scalar_t>
void causal_softmax_backward_rows(scalar_t* dp, const scalar_t* p, int64_t n_rows, int64_t ld) {
  for (int64_t n = 0; n < n_rows; ++n) {
    scalar_t* g = dp + n * ld;
    const scalar_t* pr = p + n * ld;
    double dot = 0;
    for (int64_t t = 0; t <= n; ++t) dot += double(g[t]) * double(pr[t]);
    const auto s = static_cast<scalar_t>(dot);
    for (int64_t t = 0; t <= n; ++t) g[t] = pr[t] * (g[t] - s);
    for (int64_t t = n + 1; t < n_rows; ++t) g[t] = 0;
  }
}

// softmax(scale q k^T + causal mask) v for q (B, H, N, d_h), k, v (B, H_kv, N, d_h), offset 0.
// Returns (B, N, H, d_h) contiguous.
class FusedCausalAttention : public torch::autograd::Function<FusedCausalAttention> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q_in,
                               const torch::Tensor& k_in, const torch::Tensor& v_in) {
    const torch::Tensor q = q_in.detach(), k = k_in.detach(), v = v_in.detach();
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
    const int64_t group = H / k.size(1);
    const double scale = 1.0 / std::sqrt(double(d_h));
    torch::Tensor p = at::empty({B, H, N, N}, q.options());        // probabilities (saved)
    torch::Tensor out = at::empty({B, N, H, d_h}, q.options());    // merged-heads layout
    {
      SerialBlasGuard serial_blas;
      at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        at::NoGradGuard no_grad;
        torch::Tensor scores = at::empty({N, N}, q.options());
        for (int64_t i = begin; i < end; ++i) {
          const int64_t b = i / H, h = i % H, j = h / group;
          // scores = q k^T; then scale, causal mask (key t is hidden from query n when t > n), softmax.
          at::mm_out(scores, q[b][h], k[b][j].t());
          torch::Tensor p_i = p[b][h];
          torch::Tensor out_i = out[b].select(1, h);  // (N, d_h), rows H d_h apart
          AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "causal_softmax", [&] {
            causal_softmax_rows<scalar_t>(scores.data_ptr<scalar_t>(), p_i.data_ptr<scalar_t>(), N, scale);
          });
          at::mm_out(out_i, p_i, v[b][j]);
        }
      });
    }
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["p"] = p;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const torch::Tensor p = ctx->saved_data["p"].toTensor();
    const torch::Tensor d_out = grads[0].contiguous();  // (B, N, H, d_h)
    const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
    const int64_t H_kv = k.size(1), group = H / H_kv;
    const double scale = 1.0 / std::sqrt(double(d_h));
    torch::Tensor dq = at::zeros({B, H, N, d_h}, q.options());
    torch::Tensor dk = at::zeros({B, H_kv, N, d_h}, q.options());
    torch::Tensor dv = at::zeros({B, H_kv, N, d_h}, q.options());
    {
      SerialBlasGuard serial_blas;
      // One (batch, key/value head) per item: the heads of a group add into the same dk, dv.
      at::parallel_for(0, B * H_kv, 1, [&](int64_t begin, int64_t end) {
        at::NoGradGuard no_grad;
        torch::Tensor ds = at::empty({N, N}, q.options());
        for (int64_t i = begin; i < end; ++i) {
          const int64_t b = i / H_kv, j = i % H_kv;
          torch::Tensor dk_j = dk[b][j], dv_j = dv[b][j];
          for (int64_t h = j * group; h < (j + 1) * group; ++h) {
            const torch::Tensor p_i = p[b][h];
            const torch::Tensor do_i = d_out[b].select(1, h);  // (N, d_h)
            at::addmm_out(dv_j, dv_j, p_i.t(), do_i);           // dv += P^T dO
            at::mm_out(ds, do_i, v[b][j].t());                  // dP = dO v^T
            AT_DISPATCH_FLOATING_TYPES(ds.scalar_type(), "causal_softmax_backward", [&] {
              causal_softmax_backward_rows<scalar_t>(ds.data_ptr<scalar_t>(),
                                                     p_i.data_ptr<scalar_t>(), N, N);
            });
            torch::Tensor dq_i = dq[b][h];
            at::addmm_out(dq_i, dq_i, ds, k[b][j], /*beta=*/1, /*alpha=*/scale);      // dq = s dS k
            at::addmm_out(dk_j, dk_j, ds.t(), q[b][h], /*beta=*/1, /*alpha=*/scale);  // dk += s dS^T q
          }
        }
      });
    }
    return {dq, dk, dv};
  }
};

}  // namespace

MhaImpl::MhaImpl(const MhaOptions& options) : options_(options) {
  const int64_t D = options.d_model(), H = options.n_heads();
  n_kv_heads_ = options.n_kv_heads() > 0 ? options.n_kv_heads() : H;
  TORCH_INTERNAL_ASSERT(D % H == 0 && H % n_kv_heads_ == 0, "mha: bad head counts");
  head_dim_ = D / H;
  const int64_t qkv_width = (H + 2 * n_kv_heads_) * head_dim_;
  const torch::Device device = options.device();
  w_qkv = add_parameter("w_qkv", init_normal({qkv_width, D}, options.init_std(), device),
                        ParamKind::kAttention, ParamGroup::kDecay);
  if (options.bias()) {
    b_qkv = add_parameter("b_qkv", init_constant({qkv_width}, 0.0, device), ParamKind::kAttention,
                          ParamGroup::kNoDecay);
  }
  w_o = add_parameter("w_o", init_normal({D, H * head_dim_}, options.out_init_std(), device),
                      ParamKind::kAttention, ParamGroup::kDecay);
  if (options.bias()) {
    b_o = add_parameter("b_o", init_constant({D}, 0.0, device), ParamKind::kAttention,
                        ParamGroup::kNoDecay);
  }
}

std::unique_ptr<MixerState> MhaImpl::new_state() const { return std::make_unique<MhaState>(); }

torch::Tensor MhaImpl::forward(const torch::Tensor& x, const MixerContext& ctx) {
  const int64_t B = x.size(0), N = x.size(1);
  const int64_t H = options_.n_heads(), H_kv = n_kv_heads_, d_h = head_dim_;

  // 1. Queries, keys and values in one projection, split into heads.
  torch::Tensor qkv = torch::linear(x, w_qkv, b_qkv);  // (B, N, (H + 2 H_kv) d_h)
  std::vector<torch::Tensor> parts = qkv.split_with_sizes({H * d_h, H_kv * d_h, H_kv * d_h}, -1);
  torch::Tensor q = parts[0].view({B, N, H, d_h}).transpose(1, 2);     // (B, H, N, d_h)
  torch::Tensor k = parts[1].view({B, N, H_kv, d_h}).transpose(1, 2);  // (B, H_kv, N, d_h)
  torch::Tensor v = parts[2].view({B, N, H_kv, d_h}).transpose(1, 2);  // (B, H_kv, N, d_h)

  // 2. Rotate queries and keys by their absolute positions (Llama).
  if (options_.rope()) {
    q = apply_rope(q, ctx.rope_cos, ctx.rope_sin);
    k = apply_rope(k, ctx.rope_cos, ctx.rope_sin);
  }

  // 3. With a decode state, attend over every earlier position too, and remember this step's K, V.
  if (ctx.state != nullptr) {
    auto* state = static_cast<MhaState*>(ctx.state);
    if (state->k.defined()) {
      CEMFRAC_CHECK(state->k.size(0) == B && state->k.size(2) == ctx.offset,
                    "decode state holds batch {} and {} positions, but the input has batch {} at "
                    "position {}; use one decode state per sequence batch",
                    state->k.size(0), state->k.size(2), B, ctx.offset);
      k = torch::cat({state->k, k}, 2);  // (B, H_kv, T, d_h)
      v = torch::cat({state->v, v}, 2);
    }
    state->k = k;
    state->v = v;
  }

  // 4. Causal attention, then merge the heads and project back to D.
  torch::Tensor y = causal_attention(q, k, v, ctx.offset);  // (B, H, N, d_h)
  y = y.transpose(1, 2).reshape({B, N, H * d_h});            // (B, N, H d_h)
  return torch::linear(y, w_o, b_o);                          // (B, N, D)
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t offset) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), T = k.size(2), group = H / H_kv;
  if (offset == 0 && N == T && q.device().is_cpu() &&
      (q.scalar_type() == torch::kFloat32 || q.scalar_type() == torch::kFloat64)) {
    return FusedCausalAttention::apply(q, k, v).permute({0, 2, 1, 3});  // (B, H, N, d_h) view
  }
  // Query heads h = j * group + r share key/value head j: stack each group's queries along the rows,
  // so one matmul per key/value head serves the whole group (no copies of K or V).
  torch::Tensor q_grouped = q.reshape({B, H_kv, group * N, d_h}) * (1.0 / std::sqrt(double(d_h)));
  torch::Tensor scores = torch::matmul(q_grouped, k.transpose(-2, -1));  // (B, H_kv, group N, T)
  if (N > 1 || offset + N < T) {
    // Row n of every group is query position offset + n; key t is visible when t <= offset + n.
    torch::Tensor hidden =
        torch::ones({N, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
            .triu(offset + 1);  // (N, T)
    if (group > 1) hidden = hidden.repeat({group, 1});  // (group N, T)
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
  torch::Tensor probs = torch::softmax(scores, -1);          // (B, H_kv, group N, T)
  return torch::matmul(probs, v).view({B, H, N, d_h});       // (B, H, N, d_h)
}

}  // namespace cemfrac

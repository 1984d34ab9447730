// Raw fused kernels. Each entry point works on contiguous tensors of one floating dtype and writes
// into tensors its caller allocated; argument checking, dtype promotion and autograd live one level
// up, in cemfrac/ops/. CUDA kernels (kernels/cuda/) have the same signatures with a _cuda suffix,
// declared behind CEMFRAC_WITH_CUDA.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace cemfrac::kernels {

// Continued-fraction ladders, layout (R, d, L): R rows, depth d, L ladders, ladder index fastest.
// The partial denominator a_k of ladder l in row n sits at a[n][k-1][l] (k = 1..d).
// See cemfrac/kernels/cpu/continuant_cpu.cpp for the recurrences and the numerics notes.

// Forward. a: (R, d, L) float or double, contiguous. Writes
//   f: (R, L)  f = K_{d-1} / K̂_d, the fraction 1/(a_1 + 1/(a_2 + ... + 1/a_d)) with the pole guard;
//   r: (R, L)  r = 1 / K̂_d, the one reciprocal, cached for the backward (may be undefined:
//   inference); k_saved:   (R, d, L) K_{d-k} at [n][k-1][l] (may be undefined; only the
//   store-instead-of-recompute
//              variant writes it).
// eps >= 0 is the clamp; eps = 0 is the unguarded map.
void continuant_forward_cpu(const at::Tensor& a, double eps, const at::Tensor& f,
                            const at::Tensor& r, const at::Tensor& k_saved);

// Backward. Writes grad_a (R, d, L) = dLoss/da from grad_f (R, L) = dLoss/df.
//   r: the reciprocal cached by the forward;
//   k_saved: undefined -> continuants recomputed from a (the default); defined -> read from it;
//   exact: false -> Proposition 1 with K̂_d everywhere ("surrogate" inside the clamp, the default);
//          true  -> the exact derivative of the clamped map (inside the clamp K̂_d is constant).
void continuant_backward_cpu(const at::Tensor& a, const at::Tensor& r, const at::Tensor& k_saved,
                             const at::Tensor& grad_f, double eps, bool exact,
                             const at::Tensor& grad_a);

#ifdef CEMFRAC_WITH_CUDA
// The same two kernels on a CUDA device (kernels/cuda/continuant_cuda_aten.cpp; the math is
// kernels/cuda/continuant_cuda_math.h, bitwise the CPU kernel's on the fast path). Tensors on one
// CUDA device; run on its current stream.
void continuant_forward_cuda(const at::Tensor& a, double eps, const at::Tensor& f,
                             const at::Tensor& r, const at::Tensor& k_saved);
void continuant_backward_cuda(const at::Tensor& a, const at::Tensor& r, const at::Tensor& k_saved,
                              const at::Tensor& grad_f, double eps, bool exact,
                              const at::Tensor& grad_a);
#endif

// Which instruction set the ladder loops run with ("avx2" or "baseline": x86-64 SSE2, or the host's
// default elsewhere). Chosen once from CPUID; set_continuant_cpu_isa("baseline" | "avx2" | "auto")
// overrides it for benchmarks and tests (throws cemfrac::Error for "avx2" on a CPU without it).
// Both give bitwise the same results: the loops use no fused multiply-add.
std::string continuant_cpu_isa();
void set_continuant_cpu_isa(const std::string& isa);

// AdamW (Loshchilov & Hutter; torch.optim.AdamW's formulation) as one pass, in p's dtype:
//   p <- p (1 - lr wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with m <- b1 m + (1 - b1) g and v <- b2 v + (1 - b2) g^2 updated in place first. p, g, m, v: same
// shape, contiguous, float or double; step t >= 1 counts this update.
// cemfrac/kernels/cpu/optim_cpu.cpp.
void adamw_step_cpu(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                    const at::Tensor& v, int64_t step, double lr, double beta1, double beta2,
                    double eps, double weight_decay);

// sum(x^2) accumulated in double over fixed chunks added in order: the same bits for any thread
// count. x contiguous, float or double.
double sum_squares_cpu(const at::Tensor& x);

// Causal softmax attention for full sequences (offset 0, as many keys as queries), float or double,
// cemfrac/kernels/cpu/attention_cpu.cpp. Unlike the entry points above, q (B, H, N, d_h) and k, v
// (B, H_kv, N, d_h) may be strided views, as long as each (N, d_h) matrix has unit stride along d_h
// and a row stride of at least d_h: attention_rows_cpu(t) returns t when it qualifies, else a
// contiguous copy. H is a multiple of H_kv.
at::Tensor attention_rows_cpu(const at::Tensor& t);
// Forward. Writes p (B, H, N, N) the probabilities (rows past each query's last key are left
// unwritten beyond the query block; nothing reads them) and out (B, N, H, d_h), contiguous, the
// merged heads.
void causal_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& p, const at::Tensor& out);
// Backward from d_out (B, N, H, d_h) contiguous and the saved p. Writes dq, dk, dv (each in the
// layout of its input, e.g. empty_like); tied (v is k): dv must be dk, which then receives both
// gradients.
void causal_attention_backward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& p, const at::Tensor& d_out, bool tied,
                                   const at::Tensor& dq, const at::Tensor& dk,
                                   const at::Tensor& dv);
// The same attention with one logit bias shared by every head, and the heads' probabilities summed
// and read out once (CEM attention's shared D+LR diagonal; ops/causal_attention.h):
//   P_k = softmax((q_k k_k^T + a b^T) / sqrt(d_h) + causal mask),  out_k = P_k v_k,
//   psum = sum_k P_k,  read = psum r.
// a, b (B, N, E) and r (B, N, F) contiguous. Writes p (B, H, N, N) and psum (B, N, N) (rows past
// each query's last key left unwritten beyond the query block, as above), out (B, N, H, d_h) and
// read (B, N, F), contiguous. Parallel over the batch rows, every head of a row on its thread (so
// the heads' sums come in one fixed order): a batch of fewer rows than threads leaves threads idle
// (training micro-batches are larger; a decode continuation takes the explicit path).
void causal_attention_shared_bias_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const at::Tensor& a,
                                              const at::Tensor& b, const at::Tensor& r,
                                              const at::Tensor& p, const at::Tensor& psum,
                                              const at::Tensor& out, const at::Tensor& read);
// Its backward from d_out (B, N, H, d_h) and d_read (B, N, F), contiguous: dq, dk, dv as above;
// da, db, dr contiguous like a, b, r (b and r may be one tensor: their gradients come separately).
void causal_attention_shared_bias_backward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
    const at::Tensor& b, const at::Tensor& r, const at::Tensor& p, const at::Tensor& psum,
    const at::Tensor& d_out, const at::Tensor& d_read, bool tied, const at::Tensor& dq,
    const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& da, const at::Tensor& db,
    const at::Tensor& dr);
// Attention with a diagonal logit term per head, read out per head (CEM attention's per-head
// bilinear D+LR diagonal; ops/causal_attention.h):
//   P_k = softmax((q_k k_k^T + (delta_k . x) h^T) / sqrt(d_h) + causal mask),  out_k = P_k v_k,
//   R_k = P_k h,  diag = sum_k delta_k . R_k.
// x, h (B, N, D) and delta (H, D) contiguous. Writes p (B, H, N, N) (as above), read (B, H, N, D)
// the R_k (kept for the backward), out (B, N, H, d_h) and diag (B, N, D), contiguous. Parallel over
// the batch rows like the shared-bias kernel, every head of a row on its thread.
void causal_attention_head_diag_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& x,
                                            const at::Tensor& h, const at::Tensor& delta,
                                            const at::Tensor& p, const at::Tensor& read,
                                            const at::Tensor& out, const at::Tensor& diag);
// Its backward from d_out (B, N, H, d_h) and d_diag (B, N, D), contiguous: dq, dk, dv as above; dx,
// dh contiguous like x, h; d_delta_rows (B, H, D): each batch row's share of d delta (the caller
// sums it over the rows, in order).
void causal_attention_head_diag_backward_cpu(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& x,
                                             const at::Tensor& h, const at::Tensor& delta,
                                             const at::Tensor& p, const at::Tensor& read,
                                             const at::Tensor& d_out, const at::Tensor& d_diag,
                                             bool tied, const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv, const at::Tensor& dx,
                                             const at::Tensor& dh, const at::Tensor& d_delta_rows);

// Rotary position embedding, one pass, float or double (cemfrac/kernels/cpu/rope_cpu.cpp):
// y = R x, or R^T x when inverse, with R rotating each pair (x_i, x_{i + d_h/2}) of a head vector
// at position n by the angle whose cos and sin are cos[n][i], sin[n][i]. x (B, h, N, d_h) with unit
// stride along d_h and any other strides; cos, sin (N, d_h/2) contiguous, x's dtype; y: x's shape
// and dtype, unit stride along d_h (e.g. at::empty_like(x), which keeps a dense x's layout), not
// overlapping x.
void rope_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse,
              const at::Tensor& y);

// RMSNorm over the last dimension, float or double (cemfrac/kernels/cpu/rms_norm_cpu.cpp), rows
// x (R, D) contiguous, weight w (D):
//   r_n = 1 / sqrt(mean_i x_ni^2 + eps)  (the row sum in float64),  y_ni = (x_ni r_n) w_i.
// Forward writes y (R, D) and r (R); backward, from gy (R, D) contiguous and the saved r, writes
//   gx_ni = r_n (gy_ni w_i - xh_ni <gy_n w, xh_n> / D),  xh = x r,  and  gw_i = sum_n gy_ni xh_ni,
// gw summed over fixed blocks of rows in a fixed order, so it is the same for any thread count.
void rms_norm_forward_cpu(const at::Tensor& x, const at::Tensor& w, double eps, const at::Tensor& y,
                          const at::Tensor& r);
void rms_norm_backward_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& r,
                           const at::Tensor& gy, const at::Tensor& gx, const at::Tensor& gw);

// The SiLU gate of SwiGLU and of the CEM MLP, elementwise over contiguous tensors of one shape,
// float or double (cemfrac/kernels/cpu/silu_mul_cpu.cpp), with s = 1 / (1 + exp(-a)):
//   forward   y = (a s) b;
//   backward  da = g b s (1 + a (1 - s)),  db = g (a s).
// float32 takes eight lanes at a time with AVX2 + FMA where the CPU has them (vec_exp.h's exp).
void silu_mul_forward_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& y);
void silu_mul_backward_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& g,
                           const at::Tensor& da, const at::Tensor& db);

// A linear map of a few rows (decoding a small batch, one token each): y (R, O) = x (R, I) Wᵀ + b,
// 2 <= R <= kSkinnyMaxRows, x (R, I) and w (O, I) contiguous, b (O) or undefined, y (R, O), one
// floating dtype (cemfrac/kernels/cpu/skinny_linear_cpu.cpp). Each row of W is read once for all
// R inputs (sgemm packs W first; R matrix-vector products read it R times). Forward only. Each
// output is one thread's, in a fixed order: the bits do not depend on the thread count.
constexpr int64_t kSkinnyMaxRows = 8;
void skinny_linear_cpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                       const at::Tensor& y);

}  // namespace cemfrac::kernels

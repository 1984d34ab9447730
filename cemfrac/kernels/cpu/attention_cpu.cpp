// Causal softmax attention on the CPU for full sequences (offset 0, as many keys as queries): the
// loops behind the fused Functions of ops/causal_attention*.cpp. Every (batch, head) pair runs as
// its own small problem on one thread (claimed from a shared counter, OpenBLAS held to one thread
// meanwhile): scores into a per-thread scratch block that stays in cache, the causal mask and the
// softmax on it, then P V written straight into the merged-heads layout (B, N, H d_h). Queries go
// in blocks of 64 rows whose matmuls stop at the block's last visible key, so most of the hidden
// upper triangle is never computed, forward or backward. Backward recomputes nothing: it uses the
// saved P. Masked probabilities stay exact zeros. (Moved from layers/base/mha.cpp unchanged, so
// results are bitwise those of before.)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cemfrac/core/blas.h"
#include "cemfrac/kernels/cpu/vec_exp.h"
#include "cemfrac/kernels/kernels.h"

namespace cemfrac::kernels {
namespace {

// Holds OpenBLAS to one thread for its lifetime (each of our threads then runs its own small
// gemms); restores the previous count. A no-op when the BLAS is not OpenBLAS, and for OpenBLAS's
// OpenMP build: that one already runs serially inside a parallel region, and its
// openblas_set_num_threads calls omp_set_num_threads, which would shrink the team of the very
// parallel_for this guard surrounds.
class SerialBlasGuard {
 public:
  SerialBlasGuard() {
    using Get = int (*)();
    static const auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    static const auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    static const bool openmp = blas_threading() == "OpenMP";
    if (get != nullptr && set != nullptr && !openmp) {
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

// Queries are taken in blocks of this many rows: block [r0, r1) only needs keys 0..r1-1, so the
// matmuls skip the hidden upper triangle beyond the block (at N = 256 they do 10/16 of the square).
constexpr int64_t kQueryBlock = 64;

// The softmax rows' two inner loops for float32 with AVX2 + FMA when the CPU has them (chosen once
// from CPUID): exp of a row with its sum, and the row dot product of the backward. The float64 rows
// and other CPUs run the scalar loops below.
#if defined(__x86_64__) && defined(__GNUC__)
#define CEMFRAC_SOFTMAX_AVX2 1

// out[t] = exp((in[t] - top) * c) for t < count; returns the sum, accumulated in float64.
__attribute__((target("avx2,fma"))) double exp_row_avx2(const float* in, float* out, int64_t count,
                                                        float top, float c) {
  const __m256 vt = _mm256_set1_ps(top), vc = _mm256_set1_ps(c);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t t = 0;
  for (; t + 8 <= count; t += 8) {
    const __m256 e = exp_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(in + t), vt), vc));
    _mm256_storeu_ps(out + t, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  double total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (t < count) {  // the tail through the same exp, one masked vector
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = t; i < count; ++i) buf[i - t] = in[i];
    const __m256 e = exp_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(buf), vt), vc));
    _mm256_store_ps(buf, e);
    for (int64_t i = t; i < count; ++i) {
      out[i] = buf[i - t];
      total += buf[i - t];
    }
  }
  return total;
}

// sum_t g[t] p[t] for t < count, products and sums in float64.
__attribute__((target("avx2,fma"))) double dot_row_avx2(const float* g, const float* p,
                                                        int64_t count) {
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  int64_t t = 0;
  for (; t + 8 <= count; t += 8) {
    const __m256 vg = _mm256_loadu_ps(g + t), vp = _mm256_loadu_ps(p + t);
    a = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vg)),
                        _mm256_cvtps_pd(_mm256_castps256_ps128(vp)), a);
    b = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vg, 1)),
                        _mm256_cvtps_pd(_mm256_extractf128_ps(vp, 1)), b);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a, b));
  double dot = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; t < count; ++t) dot += double(g[t]) * double(p[t]);
  return dot;
}

bool softmax_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
#endif

// exp((in[t] - top) * c) into out for t < count; returns the sum in float64.
template <typename scalar_t>
double exp_row(const scalar_t* in, scalar_t* out, int64_t count, scalar_t top, scalar_t c) {
#ifdef CEMFRAC_SOFTMAX_AVX2
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (softmax_avx2()) return exp_row_avx2(in, out, count, top, c);
  }
#endif
  double total = 0;
  for (int64_t t = 0; t < count; ++t) {
    out[t] = std::exp((in[t] - top) * c);
    total += out[t];
  }
  return total;
}

template <typename scalar_t>
double dot_row(const scalar_t* g, const scalar_t* p, int64_t count) {
#ifdef CEMFRAC_SOFTMAX_AVX2
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (softmax_avx2()) return dot_row_avx2(g, p, count);
  }
#endif
  double dot = 0;
  for (int64_t t = 0; t < count; ++t) dot += double(g[t]) * double(p[t]);
  return dot;
}

// Rows r0..r1-1 of the probabilities from their scores: s holds q[r0:r1] k[0:r1]^T (row i at s + i
// r1), p is the (N, N) probability matrix of the pair (leading dimension N). Row n becomes
// softmax(scale * s[n, 0..n]) followed by exact zeros up to r1 (the keys after n are hidden from
// n). Columns r1.. of these rows are never written: no product of the forward or backward reads
// them.
template <typename scalar_t>
void causal_softmax_rows(const scalar_t* s, scalar_t* p, int64_t r0, int64_t r1, int64_t N,
                         double scale) {
  const auto c = static_cast<scalar_t>(scale);
  for (int64_t n = r0; n < r1; ++n) {
    const scalar_t* in = s + (n - r0) * r1;
    scalar_t* out = p + n * N;
    scalar_t top = in[0];
    for (int64_t t = 1; t <= n; ++t) top = std::max(top, in[t]);
    const double total = exp_row(in, out, n + 1, top, c);
    const auto inv = static_cast<scalar_t>(1.0 / total);
    for (int64_t t = 0; t <= n; ++t) out[t] *= inv;
    for (int64_t t = n + 1; t < r1; ++t) out[t] = 0;
  }
}

// In place on the rows r0..r1-1 of the probabilities' gradients dP (row i at dp + i r1, keys
// 0..r1-1), with P the saved probabilities (leading dimension N): dS = scale * P * (dP - rowsum(dP
// * P)), the gradient of the unscaled scores q k^T; entries above the diagonal become 0.
template <typename scalar_t>
void causal_softmax_backward_rows(scalar_t* dp, const scalar_t* p, int64_t r0, int64_t r1,
                                  int64_t N, double scale) {
  const auto c = static_cast<scalar_t>(scale);
  for (int64_t n = r0; n < r1; ++n) {
    scalar_t* g = dp + (n - r0) * r1;
    const scalar_t* pr = p + n * N;
    const auto s = static_cast<scalar_t>(dot_row(g, pr, n + 1));
    for (int64_t t = 0; t <= n; ++t) g[t] = pr[t] * (g[t] - s) * c;
    for (int64_t t = n + 1; t < r1; ++t) g[t] = 0;
  }
}

// Row-major C = op(A) op(B) + beta C (beta 0 or 1; C is never read when beta is 0). The inner loops
// below run hundreds of small products per call, so they go straight to the BLAS's CBLAS entry
// point when the loaded library exports one (OpenBLAS, MKL), looked up once; otherwise through ATen
// on tensors wrapped around the same memory. Either way no tensor object is made per product.
enum CblasConst { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
template <typename T>
using CblasGemm = void (*)(int, int, int, int, int, int, T, const T*, int, const T*, int, T, T*,
                           int);

template <typename T>
CblasGemm<T> cblas_gemm() {
  static const auto fn = reinterpret_cast<CblasGemm<T>>(
      dlsym(RTLD_DEFAULT, std::is_same_v<T, float> ? "cblas_sgemm" : "cblas_dgemm"));
  return fn;
}

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  if (const auto fn = cblas_gemm<T>()) {
    fn(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(M), int(N), int(K), T(1), A,
       int(lda), B, int(ldb), beta, C, int(ldc));
    return;
  }
  const auto o = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto wrap = [&](const T* x, int64_t rows, int64_t cols, int64_t ld, bool t) {
    at::Tensor m = at::from_blob(const_cast<T*>(x), {t ? cols : rows, t ? rows : cols}, {ld, 1}, o);
    return t ? m.t() : m;
  };
  at::Tensor c = at::from_blob(C, {M, N}, {ldc, 1}, o);
  if (beta == T(0)) {
    at::mm_out(c, wrap(A, M, K, lda, ta), wrap(B, K, N, ldb, tb));
  } else {
    c.addmm_(wrap(A, M, K, lda, ta), wrap(B, K, N, ldb, tb));
  }
}

// The (batch, head) items are claimed one at a time from a shared counter by one worker per
// intra-op thread: a static split waits for its slower half, which on a shared machine is whichever
// thread was descheduled. Every item is computed the same way by whichever thread takes it, so
// results do not depend on the schedule. Run inline (in a parallel region already, or one thread) a
// worker takes all.
int64_t claimers(int64_t items) {
  return std::max<int64_t>(1, std::min<int64_t>(items, at::get_num_threads()));
}

// The leading dimension the gemms get for a (B, H, N, d_h) tensor's (N, d_h) matrices: the row
// stride, or d_h when there is a single row (a size-1 dimension's stride means nothing, but BLAS
// checks it).
int64_t row_stride(const at::Tensor& t) {
  return t.size(2) > 1 ? t.stride(2) : t.size(3);
}

}  // namespace

at::Tensor attention_rows_cpu(const at::Tensor& t) {
  return (t.stride(3) == 1 || t.size(3) == 1) && row_stride(t) >= t.size(3) ? t : t.contiguous();
}

void causal_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& p, const at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t group = H / k.size(1);
  const double scale = 1.0 / std::sqrt(double(d_h));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), ldo = H * d_h;
    SerialBlasGuard serial_blas;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B * H), 1, [&](int64_t, int64_t) {
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[std::min(N, kQueryBlock) * N]);
      for (int64_t i = next++; i < B * H; i = next++) {
        const int64_t b = i / H, h = i % H, j = h / group;
        const scalar_t* q_i = qp + b * q.stride(0) + h * q.stride(1);
        const scalar_t* k_j = kp + b * k.stride(0) + j * k.stride(1);
        const scalar_t* v_j = vp + b * v.stride(0) + j * v.stride(1);
        scalar_t* p_i = pp + i * N * N;
        scalar_t* out_i = op + b * N * H * d_h + h * d_h;  // (N, d_h), rows H d_h apart
        for (int64_t r0 = 0; r0 < N; r0 += kQueryBlock) {
          const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
          // scores = q k^T over the keys this block can see; then scale, causal mask, softmax.
          gemm<scalar_t>(false, true, rows, r1, d_h, q_i + r0 * ldq, ldq, k_j, ldk, 0,
                         scratch.get(), r1);
          causal_softmax_rows<scalar_t>(scratch.get(), p_i, r0, r1, N, scale);
          gemm<scalar_t>(false, false, rows, d_h, r1, p_i + r0 * N, N, v_j, ldv, 0,
                         out_i + r0 * ldo, ldo);
        }
      }
    });
  });
}

void causal_attention_backward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& p, const at::Tensor& d_out, bool tied,
                                   const at::Tensor& dq, const at::Tensor& dk,
                                   const at::Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), group = H / H_kv;
  const double scale = 1.0 / std::sqrt(double(d_h));
  // Every block of dq, dk and dv is first written with beta = 0 (no zero fill), then accumulated:
  // the query blocks run last to first, so the first one (keys 0..N-1) covers every row of dk and
  // dv. Tied, dv is dk: its P^T dO term is written first and the dS^T q term added to it. The
  // gradients take their inputs' memory layout (a transposed view of (B, N, H, d_h) from
  // split_heads stays one), so the view and reshape backward of the projections need no copy.
  const int64_t last_r0 = ((N - 1) / kQueryBlock) * kQueryBlock;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_backward", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* dop = d_out.data_ptr<scalar_t>();
    scalar_t* dqp = dq.data_ptr<scalar_t>();
    scalar_t* dkp = dk.data_ptr<scalar_t>();
    scalar_t* dvp = dv.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), lddo = H * d_h;
    const int64_t lddq = row_stride(dq), lddk = row_stride(dk), lddv = row_stride(dv);
    SerialBlasGuard serial_blas;
    // One (batch, key/value head) per item: the heads of a group add into the same dk, dv.
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B * H_kv), 1, [&](int64_t, int64_t) {
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[std::min(N, kQueryBlock) * N]);
      scalar_t* ds = scratch.get();
      for (int64_t i = next++; i < B * H_kv; i = next++) {
        const int64_t b = i / H_kv, j = i % H_kv;
        const scalar_t* k_j = kp + b * k.stride(0) + j * k.stride(1);
        const scalar_t* v_j = vp + b * v.stride(0) + j * v.stride(1);
        scalar_t* dk_j = dkp + b * dk.stride(0) + j * dk.stride(1);
        scalar_t* dv_j = dvp + b * dv.stride(0) + j * dv.stride(1);
        for (int64_t h = j * group; h < (j + 1) * group; ++h) {
          const scalar_t* p_i = pp + (b * H + h) * N * N;
          const scalar_t* q_i = qp + b * q.stride(0) + h * q.stride(1);
          const scalar_t* do_i = dop + b * N * H * d_h + h * d_h;  // (N, d_h), rows H d_h apart
          scalar_t* dq_i = dqp + b * dq.stride(0) + h * dq.stride(1);
          for (int64_t r0 = last_r0; r0 >= 0; r0 -= kQueryBlock) {
            const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
            const bool first = h == j * group && r1 == N;
            const scalar_t* p_blk = p_i + r0 * N;       // (rows, r1), leading dimension N
            const scalar_t* do_blk = do_i + r0 * lddo;  // (rows, d_h)
            // dv (+)= P^T dO
            gemm<scalar_t>(true, false, r1, d_h, rows, p_blk, N, do_blk, lddo, first ? 0 : 1, dv_j,
                           lddv);
            // dP = dO v^T, then dS in place
            gemm<scalar_t>(false, true, rows, r1, d_h, do_blk, lddo, v_j, ldv, 0, ds, r1);
            causal_softmax_backward_rows<scalar_t>(ds, p_i, r0, r1, N, scale);
            // dq = dS k;  dk (+)= dS^T q (tied: always added, onto the P^T dO just written)
            gemm<scalar_t>(false, false, rows, d_h, r1, ds, r1, k_j, ldk, 0, dq_i + r0 * lddq,
                           lddq);
            gemm<scalar_t>(true, false, r1, d_h, rows, ds, r1, q_i + r0 * ldq, ldq,
                           first && !tied ? 0 : 1, dk_j, lddk);
          }
        }
      }
    });
  });
}

}  // namespace cemfrac::kernels

// ---------------------------------------------------------------------------------------------------
// Causal attention with one logit bias shared by every head (CEM's shared D+LR diagonal, see
// kernels.h). One item per batch row, its heads in order inside it: the bias block a b^T is
// computed once per query block and added to every head's scores, and the heads' probabilities are
// summed into psum in a fixed order (the same bits for any thread count), then read out once
// against r. Like the plain kernel, query blocks stop at their last visible key, in the D-wide
// products too.

namespace cemfrac::kernels {

void causal_attention_shared_bias_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& v, const at::Tensor& a,
                                              const at::Tensor& b, const at::Tensor& r,
                                              const at::Tensor& p, const at::Tensor& psum,
                                              const at::Tensor& out, const at::Tensor& read) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t group = H / k.size(1), E = a.size(2), F = r.size(2);
  const double scale = 1.0 / std::sqrt(double(d_h));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_shared_bias", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    const scalar_t* rp = r.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    scalar_t* psp = psum.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* rdp = read.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), ldo = H * d_h;
    SerialBlasGuard serial_blas;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B), 1, [&](int64_t, int64_t) {
      const int64_t block = std::min(N, kQueryBlock);
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[2 * block * N]);
      scalar_t* s = scratch.get();
      scalar_t* bias = s + block * N;
      for (int64_t bi = next++; bi < B; bi = next++) {
        const scalar_t* a_b = ap + bi * N * E;
        const scalar_t* b_b = bp + bi * N * E;
        const scalar_t* r_b = rp + bi * N * F;
        scalar_t* ps_b = psp + bi * N * N;
        for (int64_t r0 = 0; r0 < N; r0 += kQueryBlock) {
          const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
          gemm<scalar_t>(false, true, rows, r1, E, a_b + r0 * E, E, b_b, E, 0, bias, r1);
          for (int64_t h = 0; h < H; ++h) {
            const int64_t j = h / group;
            const scalar_t* q_i = qp + bi * q.stride(0) + h * q.stride(1);
            const scalar_t* k_j = kp + bi * k.stride(0) + j * k.stride(1);
            const scalar_t* v_j = vp + bi * v.stride(0) + j * v.stride(1);
            scalar_t* p_i = pp + (bi * H + h) * N * N;
            scalar_t* out_i = op + bi * N * H * d_h + h * d_h;
            std::copy(bias, bias + rows * r1, s);
            gemm<scalar_t>(false, true, rows, r1, d_h, q_i + r0 * ldq, ldq, k_j, ldk, 1, s, r1);
            causal_softmax_rows<scalar_t>(s, p_i, r0, r1, N, scale);
            gemm<scalar_t>(false, false, rows, d_h, r1, p_i + r0 * N, N, v_j, ldv, 0,
                           out_i + r0 * ldo, ldo);
            for (int64_t n = r0; n < r1; ++n) {
              const scalar_t* pr = p_i + n * N;
              scalar_t* sr = ps_b + n * N;
              if (h == 0) {
                std::copy(pr, pr + r1, sr);
              } else {
                for (int64_t t = 0; t < r1; ++t) sr[t] += pr[t];
              }
            }
          }
          // read = psum r over the keys the block sees.
          gemm<scalar_t>(false, false, rows, F, r1, ps_b + r0 * N, N, r_b, F, 0,
                         rdp + (bi * N + r0) * F, F);
        }
      }
    });
  });
}

// Longer than ~80 lines on purpose: one parallel pass per (batch, key/value head) over query
// blocks, whose loop bodies share a dozen raw pointers, block bounds and the first-block beta = 0
// rule; split into functions they would pass all of them, and the write-then-accumulate order
// that makes the gradients deterministic would no longer be visible in one place.
void causal_attention_shared_bias_backward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& a,
    const at::Tensor& b, const at::Tensor& r, const at::Tensor& p, const at::Tensor& psum,
    const at::Tensor& d_out, const at::Tensor& d_read, bool tied, const at::Tensor& dq,
    const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& da, const at::Tensor& db,
    const at::Tensor& dr) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), group = H / H_kv, E = a.size(2), F = r.size(2);
  const double scale = 1.0 / std::sqrt(double(d_h));
  // As in the plain backward, every block is first written with beta = 0 and then accumulated:
  // the query blocks run last to first, so the first one (keys 0..N-1) covers every row of the
  // key-side gradients (dk, dv, db, dr).
  const int64_t last_r0 = ((N - 1) / kQueryBlock) * kQueryBlock;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_shared_bias_backward", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    const scalar_t* rp = r.data_ptr<scalar_t>();
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* psp = psum.data_ptr<scalar_t>();
    const scalar_t* dop = d_out.data_ptr<scalar_t>();
    const scalar_t* drdp = d_read.data_ptr<scalar_t>();
    scalar_t* dqp = dq.data_ptr<scalar_t>();
    scalar_t* dkp = dk.data_ptr<scalar_t>();
    scalar_t* dvp = dv.data_ptr<scalar_t>();
    scalar_t* dap = da.data_ptr<scalar_t>();
    scalar_t* dbp = db.data_ptr<scalar_t>();
    scalar_t* drp = dr.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), lddo = H * d_h;
    const int64_t lddq = row_stride(dq), lddk = row_stride(dk), lddv = row_stride(dv);
    SerialBlasGuard serial_blas;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B), 1, [&](int64_t, int64_t) {
      const int64_t block = std::min(N, kQueryBlock);
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[3 * block * N]);
      scalar_t* ds = scratch.get();
      scalar_t* dps = ds + block * N;     // d psum of the block
      scalar_t* dbias = dps + block * N;  // sum over heads of dS
      for (int64_t bi = next++; bi < B; bi = next++) {
        const scalar_t* a_b = ap + bi * N * E;
        const scalar_t* b_b = bp + bi * N * E;
        const scalar_t* r_b = rp + bi * N * F;
        const scalar_t* ps_b = psp + bi * N * N;
        const scalar_t* drd_b = drdp + bi * N * F;
        scalar_t* da_b = dap + bi * N * E;
        scalar_t* db_b = dbp + bi * N * E;
        scalar_t* dr_b = drp + bi * N * F;
        for (int64_t r0 = last_r0; r0 >= 0; r0 -= kQueryBlock) {
          const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
          const bool first_block = r1 == N;
          // The read-out: dpsum = d_read r^T; dr (+)= psum^T d_read.
          gemm<scalar_t>(false, true, rows, r1, F, drd_b + r0 * F, F, r_b, F, 0, dps, r1);
          gemm<scalar_t>(true, false, r1, F, rows, ps_b + r0 * N, N, drd_b + r0 * F, F,
                         first_block ? 0 : 1, dr_b, F);
          for (int64_t h = 0; h < H; ++h) {
            const int64_t j = h / group;
            const scalar_t* k_j = kp + bi * k.stride(0) + j * k.stride(1);
            const scalar_t* v_j = vp + bi * v.stride(0) + j * v.stride(1);
            scalar_t* dk_j = dkp + bi * dk.stride(0) + j * dk.stride(1);
            scalar_t* dv_j = dvp + bi * dv.stride(0) + j * dv.stride(1);
            const scalar_t* p_i = pp + (bi * H + h) * N * N;
            const scalar_t* q_i = qp + bi * q.stride(0) + h * q.stride(1);
            const scalar_t* do_i = dop + bi * N * H * d_h + h * d_h;
            scalar_t* dq_i = dqp + bi * dq.stride(0) + h * dq.stride(1);
            const bool first = h == j * group && first_block;
            const scalar_t* p_blk = p_i + r0 * N;
            const scalar_t* do_blk = do_i + r0 * lddo;
            gemm<scalar_t>(true, false, r1, d_h, rows, p_blk, N, do_blk, lddo, first ? 0 : 1, dv_j,
                           lddv);
            // dP = dpsum + dO v^T, then dS in place.
            std::copy(dps, dps + rows * r1, ds);
            gemm<scalar_t>(false, true, rows, r1, d_h, do_blk, lddo, v_j, ldv, 1, ds, r1);
            causal_softmax_backward_rows<scalar_t>(ds, p_i, r0, r1, N, scale);
            gemm<scalar_t>(false, false, rows, d_h, r1, ds, r1, k_j, ldk, 0, dq_i + r0 * lddq,
                           lddq);
            gemm<scalar_t>(true, false, r1, d_h, rows, ds, r1, q_i + r0 * ldq, ldq,
                           first && !tied ? 0 : 1, dk_j, lddk);
            if (h == 0) {
              std::copy(ds, ds + rows * r1, dbias);
            } else {
              for (int64_t t = 0; t < rows * r1; ++t) dbias[t] += ds[t];
            }
          }
          // The bias a b^T: da = dbias b; db (+)= dbias^T a.
          gemm<scalar_t>(false, false, rows, E, r1, dbias, r1, b_b, E, 0, da_b + r0 * E, E);
          gemm<scalar_t>(true, false, r1, E, rows, dbias, r1, a_b + r0 * E, E, first_block ? 0 : 1,
                         db_b, E);
        }
      }
    });
  });
}

}  // namespace cemfrac::kernels

// ---- Per-head diagonal: CEM attention's per-head bilinear D+LR (kernels.h). One item per batch
// row, its heads in order inside it, as in the shared-bias kernel: head k's bias (delta_k . x) h^T
// is made per query block from a scaled copy of the block's x rows, and the diagonal read-out
// sum_k delta_k . (P_k h) is summed over the heads in a fixed order, so the bits do not depend on
// the thread count. The key-side products stop at the block's last visible key.

namespace cemfrac::kernels {

void causal_attention_head_diag_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& x,
                                            const at::Tensor& h, const at::Tensor& delta,
                                            const at::Tensor& p, const at::Tensor& read,
                                            const at::Tensor& out, const at::Tensor& diag) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t group = H / k.size(1), D = x.size(2);
  const double scale = 1.0 / std::sqrt(double(d_h));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_head_diag", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* dlp = delta.data_ptr<scalar_t>();
    scalar_t* pp = p.data_ptr<scalar_t>();
    scalar_t* rdp = read.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* dgp = diag.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), ldo = H * d_h;
    SerialBlasGuard serial_blas;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B), 1, [&](int64_t, int64_t) {
      const int64_t block = std::min(N, kQueryBlock);
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[block * N + block * D]);
      scalar_t* s = scratch.get();
      scalar_t* xa = s + block * N;  // the block's x rows scaled by delta_k
      for (int64_t bi = next++; bi < B; bi = next++) {
        const scalar_t* x_b = xp + bi * N * D;
        const scalar_t* h_b = hp + bi * N * D;
        scalar_t* dg_b = dgp + bi * N * D;
        for (int64_t r0 = 0; r0 < N; r0 += kQueryBlock) {
          const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
          for (int64_t hd = 0; hd < H; ++hd) {
            const int64_t j = hd / group;
            const scalar_t* dl = dlp + hd * D;
            const scalar_t* q_i = qp + bi * q.stride(0) + hd * q.stride(1);
            const scalar_t* k_j = kp + bi * k.stride(0) + j * k.stride(1);
            const scalar_t* v_j = vp + bi * v.stride(0) + j * v.stride(1);
            scalar_t* p_i = pp + (bi * H + hd) * N * N;
            scalar_t* rd_i = rdp + (bi * H + hd) * N * D;
            scalar_t* out_i = op + bi * N * H * d_h + hd * d_h;
            for (int64_t n = 0; n < rows; ++n) {
              const scalar_t* xr = x_b + (r0 + n) * D;
              scalar_t* ar = xa + n * D;
              for (int64_t c = 0; c < D; ++c) ar[c] = xr[c] * dl[c];
            }
            // Scores: (delta_k . x) h^T, then + q k^T.
            gemm<scalar_t>(false, true, rows, r1, D, xa, D, h_b, D, 0, s, r1);
            gemm<scalar_t>(false, true, rows, r1, d_h, q_i + r0 * ldq, ldq, k_j, ldk, 1, s, r1);
            causal_softmax_rows<scalar_t>(s, p_i, r0, r1, N, scale);
            gemm<scalar_t>(false, false, rows, d_h, r1, p_i + r0 * N, N, v_j, ldv, 0,
                           out_i + r0 * ldo, ldo);
            // This head's read-out P_k h (kept for the backward), then delta_k . it into diag.
            gemm<scalar_t>(false, false, rows, D, r1, p_i + r0 * N, N, h_b, D, 0, rd_i + r0 * D, D);
            for (int64_t n = r0; n < r1; ++n) {
              const scalar_t* rr = rd_i + n * D;
              scalar_t* dr = dg_b + n * D;
              if (hd == 0) {
                for (int64_t c = 0; c < D; ++c) dr[c] = dl[c] * rr[c];
              } else {
                for (int64_t c = 0; c < D; ++c) dr[c] += dl[c] * rr[c];
              }
            }
          }
        }
      }
    });
  });
}

// Longer than ~80 lines for the reason the shared-bias backward above is: one parallel pass per
// (batch, key/value head) whose query-block loop shares its pointers, bounds and write-then-
// accumulate order; the per-head diagonal only adds its own terms to that pass.
void causal_attention_head_diag_backward_cpu(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& x,
                                             const at::Tensor& h, const at::Tensor& delta,
                                             const at::Tensor& p, const at::Tensor& read,
                                             const at::Tensor& d_out, const at::Tensor& d_diag,
                                             bool tied, const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv, const at::Tensor& dx,
                                             const at::Tensor& dh, const at::Tensor& d_delta_rows) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d_h = q.size(3);
  const int64_t H_kv = k.size(1), group = H / H_kv, D = x.size(2);
  const double scale = 1.0 / std::sqrt(double(d_h));
  // As in the other backwards: the query blocks run last to first, so the first one (keys
  // 0..N-1) writes every row of the key-side gradients (dk, dv, dh) with beta = 0.
  const int64_t last_r0 = ((N - 1) / kQueryBlock) * kQueryBlock;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_head_diag_backward", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* dlp = delta.data_ptr<scalar_t>();
    const scalar_t* pp = p.data_ptr<scalar_t>();
    const scalar_t* rdp = read.data_ptr<scalar_t>();
    const scalar_t* dop = d_out.data_ptr<scalar_t>();
    const scalar_t* ddp = d_diag.data_ptr<scalar_t>();
    scalar_t* dqp = dq.data_ptr<scalar_t>();
    scalar_t* dkp = dk.data_ptr<scalar_t>();
    scalar_t* dvp = dv.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    scalar_t* dhp = dh.data_ptr<scalar_t>();
    scalar_t* ddlp = d_delta_rows.data_ptr<scalar_t>();
    const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v), lddo = H * d_h;
    const int64_t lddq = row_stride(dq), lddk = row_stride(dk), lddv = row_stride(dv);
    SerialBlasGuard serial_blas;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, claimers(B), 1, [&](int64_t, int64_t) {
      const int64_t block = std::min(N, kQueryBlock);
      const std::unique_ptr<scalar_t[]> scratch(new scalar_t[block * N + 3 * block * D]);
      scalar_t* ds = scratch.get();
      scalar_t* xa = ds + block * N;   // delta_k . x of the block's rows
      scalar_t* dr = xa + block * D;   // delta_k . d_diag: the gradient of the head's read-out
      scalar_t* dxa = dr + block * D;  // dS h: the gradient of delta_k . x
      for (int64_t bi = next++; bi < B; bi = next++) {
        const scalar_t* x_b = xp + bi * N * D;
        const scalar_t* h_b = hp + bi * N * D;
        const scalar_t* dd_b = ddp + bi * N * D;
        scalar_t* dx_b = dxp + bi * N * D;
        scalar_t* dh_b = dhp + bi * N * D;
        scalar_t* ddl_b = ddlp + bi * H * D;  // this batch row's share of d delta
        std::fill(ddl_b, ddl_b + H * D, scalar_t(0));
        for (int64_t r0 = last_r0; r0 >= 0; r0 -= kQueryBlock) {
          const int64_t r1 = std::min(N, r0 + kQueryBlock), rows = r1 - r0;
          const bool first_block = r1 == N;
          for (int64_t hd = 0; hd < H; ++hd) {
            const int64_t j = hd / group;
            const scalar_t* dl = dlp + hd * D;
            scalar_t* ddl = ddl_b + hd * D;
            const scalar_t* k_j = kp + bi * k.stride(0) + j * k.stride(1);
            const scalar_t* v_j = vp + bi * v.stride(0) + j * v.stride(1);
            scalar_t* dk_j = dkp + bi * dk.stride(0) + j * dk.stride(1);
            scalar_t* dv_j = dvp + bi * dv.stride(0) + j * dv.stride(1);
            const scalar_t* p_i = pp + (bi * H + hd) * N * N;
            const scalar_t* rd_i = rdp + (bi * H + hd) * N * D;
            const scalar_t* q_i = qp + bi * q.stride(0) + hd * q.stride(1);
            const scalar_t* do_i = dop + bi * N * H * d_h + hd * d_h;
            scalar_t* dq_i = dqp + bi * dq.stride(0) + hd * dq.stride(1);
            const bool first = hd == j * group && first_block;
            const scalar_t* p_blk = p_i + r0 * N;
            const scalar_t* do_blk = do_i + r0 * lddo;
            // The read-out: dR = delta_k . d_diag; d delta_k += sum_rows d_diag . R_k.
            for (int64_t n = 0; n < rows; ++n) {
              const scalar_t* g = dd_b + (r0 + n) * D;
              const scalar_t* rr = rd_i + (r0 + n) * D;
              const scalar_t* xr = x_b + (r0 + n) * D;
              scalar_t* o = dr + n * D;
              scalar_t* a = xa + n * D;
              for (int64_t c = 0; c < D; ++c) {
                o[c] = dl[c] * g[c];
                ddl[c] += g[c] * rr[c];
                a[c] = xr[c] * dl[c];
              }
            }
            // dh (+)= P^T dR; dv (+)= P^T dO.
            gemm<scalar_t>(true, false, r1, D, rows, p_blk, N, dr, D,
                           first_block && hd == 0 ? 0 : 1, dh_b, D);
            gemm<scalar_t>(true, false, r1, d_h, rows, p_blk, N, do_blk, lddo, first ? 0 : 1, dv_j,
                           lddv);
            // dP = dR h^T + dO v^T, then dS in place.
            gemm<scalar_t>(false, true, rows, r1, D, dr, D, h_b, D, 0, ds, r1);
            gemm<scalar_t>(false, true, rows, r1, d_h, do_blk, lddo, v_j, ldv, 1, ds, r1);
            causal_softmax_backward_rows<scalar_t>(ds, p_i, r0, r1, N, scale);
            gemm<scalar_t>(false, false, rows, d_h, r1, ds, r1, k_j, ldk, 0, dq_i + r0 * lddq,
                           lddq);
            gemm<scalar_t>(true, false, r1, d_h, rows, ds, r1, q_i + r0 * ldq, ldq,
                           first && !tied ? 0 : 1, dk_j, lddk);
            // The bias (delta_k . x) h^T: dh += dS^T (delta_k . x); dxa = dS h, which gives
            // dx (+)= delta_k . dxa and d delta_k += sum_rows x . dxa.
            gemm<scalar_t>(true, false, r1, D, rows, ds, r1, xa, D, 1, dh_b, D);
            gemm<scalar_t>(false, false, rows, D, r1, ds, r1, h_b, D, 0, dxa, D);
            for (int64_t n = 0; n < rows; ++n) {
              const scalar_t* g = dxa + n * D;
              const scalar_t* xr = x_b + (r0 + n) * D;
              scalar_t* o = dx_b + (r0 + n) * D;
              if (hd == 0) {
                for (int64_t c = 0; c < D; ++c) o[c] = dl[c] * g[c];
              } else {
                for (int64_t c = 0; c < D; ++c) o[c] += dl[c] * g[c];
              }
              for (int64_t c = 0; c < D; ++c) ddl[c] += xr[c] * g[c];
            }
          }
        }
      }
    });
  });
}

}  // namespace cemfrac::kernels

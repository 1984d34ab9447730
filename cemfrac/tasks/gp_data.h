// The data of the synthetic Gaussian-process task (CEM spec §5.3; docs/gp.md). Per
// sequence:
//     f ~ GP(0, k),  k(t, t') = exp(-(t - t')^2 / (2 l^2)),  l ~ LogUniform[l_min, l_max],
//     t_n ~ U[-1, 1],  y_n = f(t_n) + e_n,  e_n ~ N(0, s^2),  n = 0..N-1,
// turned into N - 1 tokens [t_n, y_n, t_{n+1}] whose target is y_{n+1}; and the oracle, the exact
// posterior mean of y_{n+1} given y_0..y_n under the true l and s.
//
// y is drawn directly from its marginal N(0, K + s^2 I) (the same law as f(t) + e, without a jitter
// on the often near-singular K), as y = C xi with C = chol(K + s^2 I), xi ~ N(0, I). The same
// factor gives every prefix's posterior mean at once (gp_posterior_means); all of it in float64.
#pragma once
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>

namespace cemfrac {

struct GpTaskOptions {
  int64_t n_points = 64;         // N observations per sequence (N - 1 tokens)
  double lengthscale_min = 0.1;  // l ~ LogUniform[lengthscale_min, lengthscale_max]
  double lengthscale_max = 1.0;
  double noise_std = 0.1;  // s

  // Every field once (a GP training's settings: a resume on another task is refused).
  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("n_points", n_points, "Observations N per sequence (N - 1 tokens)");
    v("lengthscale_min", lengthscale_min, "Smallest kernel lengthscale (log-uniform)");
    v("lengthscale_max", lengthscale_max, "Largest kernel lengthscale");
    v("noise_std", noise_std, "Observation noise standard deviation");
  }
};

// One batch of sequences. Row b holds one function.
struct GpBatch {
  torch::Tensor t;            // (B, N) float64 inputs
  torch::Tensor y;            // (B, N) float64 noisy observations
  torch::Tensor lengthscale;  // (B) float64
  torch::Tensor tokens;       // (B, N - 1, 3) float32: token n = [t_n, y_n, t_{n+1}]
  torch::Tensor targets;      // (B, N - 1) float32: y_{n+1}
  // (B, N - 1) float64: the oracle E[y_{n+1} | y_0..y_n]; undefined unless asked for.
  torch::Tensor posterior_mean;
};

// k(a_i, b_j) = exp(-(a_i - b_j)^2 / (2 l^2)). a (B, N), b (B, M), lengthscale (B) -> (B, N, M), in
// a's dtype.
torch::Tensor rbf_kernel(const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& lengthscale);

// y ~ N(0, K(t) + s^2 I) for given inputs, drawn as y = C xi with C C^T = K + s^2 I and xi ~ N(0,
// I) from `generator`. t (B, N) float64, lengthscale (B) float64 -> y (B, N) float64.
torch::Tensor sample_gp_observations(const torch::Tensor& t, const torch::Tensor& lengthscale,
                                     double noise_std, at::Generator& generator);

// Draws `batch` sequences from `generator` (a CPU generator; the draws, in order: lengthscales,
// inputs, the standard normals). The same generator state gives the same batch. with_oracle also
// fills posterior_mean (gp_posterior_means).
GpBatch sample_gp_batch(int64_t batch, const GpTaskOptions& options, at::Generator& generator,
                        bool with_oracle);

// The oracle for given observations: out[b, m-1] = E[y_m | y_0..y_{m-1}] = k_m^T (K_m + s^2 I)^-1
// y_<m for m = 1..N-1, with K_m the kernel over t_0..t_{m-1} and k_m = k(t_<m, t_m).
// t, y (B, N) float64 -> (B, N - 1) float64.
// Fast path: one Cholesky C C^T = K + s^2 I over all N points. The factor of a leading block is the
// leading block of C, and row m of C below the diagonal is (C_m^-1 k_m)^T, so with z = C^-1 y
// (forward substitution, whose prefixes depend only on prefixes):
//     E[y_m | y_<m] = (C_m^-1 k_m)^T (C_m^-1 y_<m) = sum_{j<m} C[m, j] z[j].
torch::Tensor gp_posterior_means(const torch::Tensor& t, const torch::Tensor& y,
                                 const torch::Tensor& lengthscale, double noise_std);

// The slow, obviously-correct twin: for every m a separate linear solve with the m x m matrix.
torch::Tensor gp_posterior_means_reference(const torch::Tensor& t, const torch::Tensor& y,
                                           const torch::Tensor& lengthscale, double noise_std);

}  // namespace cemfrac

#include "cemfrac/tasks/gp_data.h"

#include <torch/types.h>

#include <cmath>

#include "cemfrac/core/check.h"

namespace cemfrac {

namespace {

// K + s^2 I over the inputs t (B, N) -> (B, N, N) float64.
torch::Tensor noisy_covariance(const torch::Tensor& t, const torch::Tensor& lengthscale,
                               double noise_std) {
  const int64_t N = t.size(1);
  torch::Tensor eye = torch::eye(N, t.options());
  return rbf_kernel(t, t, lengthscale) + (noise_std * noise_std) * eye;  // (B, N, N)
}

void check_observations(const torch::Tensor& t, const torch::Tensor& y,
                        const torch::Tensor& lengthscale) {
  TORCH_INTERNAL_ASSERT(t.dim() == 2 && y.sizes() == t.sizes() && t.size(1) >= 2,
                        "GP inputs and observations must both be (B, N >= 2)");
  TORCH_INTERNAL_ASSERT(lengthscale.dim() == 1 && lengthscale.size(0) == t.size(0));
  TORCH_INTERNAL_ASSERT(t.scalar_type() == torch::kFloat64 && y.scalar_type() == torch::kFloat64,
                        "the GP oracle works in float64");
}

// Posterior means from the factor C (B, N, N) of K + s^2 I and y (B, N); see the header.
torch::Tensor posterior_means_from_factor(const torch::Tensor& chol, const torch::Tensor& y) {
  // z = C^-1 y (B, N, 1)
  torch::Tensor z = at::linalg_solve_triangular(chol, y.unsqueeze(-1), /*upper=*/false);
  // mean[m] = sum_{j<m} C[m, j] z[j]: the strictly lower triangle of C times z, rows 1..N-1.
  torch::Tensor mean = torch::matmul(torch::tril(chol, -1), z).squeeze(-1);  // (B, N)
  return mean.narrow(1, 1, y.size(1) - 1).contiguous();                      // (B, N - 1)
}

}  // namespace

torch::Tensor rbf_kernel(const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& lengthscale) {
  torch::Tensor diff = a.unsqueeze(2) - b.unsqueeze(1);                // (B, N, M)
  torch::Tensor l = lengthscale.to(a.scalar_type()).view({-1, 1, 1});  // (B, 1, 1)
  return torch::exp(-(diff * diff) / (2.0 * l * l));
}

GpBatch sample_gp_batch(int64_t batch, const GpTaskOptions& options, at::Generator& generator,
                        bool with_oracle) {
  CEMFRAC_CHECK(batch >= 1, "GP batch size {} must be at least 1", batch);
  CEMFRAC_CHECK(options.n_points >= 2, "GP sequences need at least 2 points, got {}",
                options.n_points);
  CEMFRAC_CHECK(options.lengthscale_min > 0 && options.lengthscale_max >= options.lengthscale_min,
                "GP lengthscale range [{}, {}] must be positive and ordered",
                options.lengthscale_min, options.lengthscale_max);
  CEMFRAC_CHECK(options.noise_std > 0, "GP noise standard deviation {} must be positive",
                options.noise_std);
  const int64_t B = batch, N = options.n_points;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);

  // 1. l = exp(U[log l_min, log l_max]) (B); t ~ U[-1, 1] (B, N).
  const double log_lo = std::log(options.lengthscale_min);
  const double log_hi = std::log(options.lengthscale_max);
  GpBatch out;
  out.lengthscale = torch::exp(log_lo + (log_hi - log_lo) * torch::rand({B}, generator, f64));
  out.t = 2.0 * torch::rand({B, N}, generator, f64) - 1.0;

  // 2. y ~ N(0, K + s^2 I), the law of f(t) + noise.
  out.y = sample_gp_observations(out.t, out.lengthscale, options.noise_std, generator);  // (B, N)

  // 3. Tokens [t_n, y_n, t_{n+1}] and targets y_{n+1}, n = 0..N-2.
  torch::Tensor t_now = out.t.narrow(1, 0, N - 1), t_next = out.t.narrow(1, 1, N - 1);
  torch::Tensor y_now = out.y.narrow(1, 0, N - 1);
  out.tokens = torch::stack({t_now, y_now, t_next}, -1).to(torch::kFloat32);  // (B, N - 1, 3)
  out.targets = out.y.narrow(1, 1, N - 1).to(torch::kFloat32).contiguous();   // (B, N - 1)
  if (with_oracle) {
    out.posterior_mean = gp_posterior_means(out.t, out.y, out.lengthscale, options.noise_std);
  }
  return out;
}

torch::Tensor sample_gp_observations(const torch::Tensor& t, const torch::Tensor& lengthscale,
                                     double noise_std, at::Generator& generator) {
  TORCH_INTERNAL_ASSERT(t.dim() == 2 && t.scalar_type() == torch::kFloat64);
  TORCH_INTERNAL_ASSERT(lengthscale.dim() == 1 && lengthscale.size(0) == t.size(0));
  torch::Tensor xi = torch::randn({t.size(0), t.size(1), 1}, generator, t.options());  // (B, N, 1)
  torch::Tensor chol = at::linalg_cholesky(noisy_covariance(t, lengthscale, noise_std));
  return torch::matmul(chol, xi).squeeze(-1);  // (B, N)
}

torch::Tensor gp_posterior_means(const torch::Tensor& t, const torch::Tensor& y,
                                 const torch::Tensor& lengthscale, double noise_std) {
  check_observations(t, y, lengthscale);
  torch::Tensor chol = at::linalg_cholesky(noisy_covariance(t, lengthscale, noise_std));
  return posterior_means_from_factor(chol, y);
}

torch::Tensor gp_posterior_means_reference(const torch::Tensor& t, const torch::Tensor& y,
                                           const torch::Tensor& lengthscale, double noise_std) {
  check_observations(t, y, lengthscale);
  const int64_t B = t.size(0), N = t.size(1);
  torch::Tensor out = torch::empty({B, N - 1}, t.options());
  for (int64_t b = 0; b < B; ++b) {
    torch::Tensor tb = t[b], yb = y[b], lb = lengthscale.narrow(0, b, 1);
    for (int64_t m = 1; m < N; ++m) {
      torch::Tensor seen = tb.narrow(0, 0, m).unsqueeze(0);   // (1, m)
      torch::Tensor query = tb.narrow(0, m, 1).unsqueeze(0);  // (1, 1)
      torch::Tensor k_mm =
          rbf_kernel(seen, seen, lb)[0] + noise_std * noise_std * torch::eye(m, t.options());
      torch::Tensor k_m = rbf_kernel(seen, query, lb)[0];  // (m, 1)
      torch::Tensor alpha =
          at::linalg_solve(k_mm, yb.narrow(0, 0, m).unsqueeze(1), /*left=*/true);  // (m, 1)
      out[b][m - 1] = (k_m * alpha).sum();
    }
  }
  return out;
}

}  // namespace cemfrac

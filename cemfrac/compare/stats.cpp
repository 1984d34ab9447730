#include "cemfrac/compare/stats.h"

#include <cmath>

#include "cemfrac/core/check.h"

namespace cemfrac {
namespace {

// Continued fraction of the incomplete beta function (modified Lentz), for x < (a + 1) / (a + b +
// 2).
double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double m2 = 2.0 * m;
    double num = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + num * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1 + num / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    h *= d * c;
    num = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + num * d;
    if (std::fabs(d) < tiny) d = tiny;
    c = 1 + num / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < 1e-15) break;
  }
  return h;
}

// I_x(a, b), the regularised incomplete beta function.
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double log_front =
      std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1) / (a + b + 2)) return std::exp(log_front) * beta_fraction(a, b, x) / a;
  return 1 - std::exp(log_front) * beta_fraction(b, a, 1 - x) / b;
}

}  // namespace

MeanSd mean_sd(const std::vector<double>& x) {
  MeanSd r;
  r.n = static_cast<int64_t>(x.size());
  if (x.empty()) return r;
  double sum = 0;
  for (double v : x) sum += v;
  r.mean = sum / static_cast<double>(x.size());
  if (x.size() >= 2) {
    double ss = 0;
    for (double v : x) ss += (v - r.mean) * (v - r.mean);
    r.sd = std::sqrt(ss / static_cast<double>(x.size() - 1));
  }
  return r;
}

double student_t_cdf(double t, double df) {
  CEMFRAC_CHECK(df > 0, "student_t_cdf: df = {} must be > 0", df);
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t));
  return t >= 0 ? 1 - tail : tail;
}

double student_t_quantile(double p, double df) {
  CEMFRAC_CHECK(p > 0 && p < 1 && df > 0, "student_t_quantile: p = {} df = {}", p, df);
  double lo = -1e4, hi = 1e4;  // t_{0.9995, 1} is about 637
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

PairedDiff paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  CEMFRAC_CHECK(a.size() == b.size(), "paired_difference: {} values against {}", a.size(),
                b.size());
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  PairedDiff r;
  r.diff = mean_sd(d);
  r.lo = r.hi = r.diff.mean;
  if (r.diff.n >= 2) {
    const double half = student_t_quantile(0.975, static_cast<double>(r.diff.n - 1)) * r.diff.sd /
                        std::sqrt(static_cast<double>(r.diff.n));
    r.lo = r.diff.mean - half;
    r.hi = r.diff.mean + half;
    r.has_interval = true;
  }
  return r;
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::kSupported: return "supported";
    case Verdict::kContradicted: return "contradicted";
    case Verdict::kInconclusive: return "inconclusive";
  }
  return "?";
}

Verdict verdict(const PairedDiff& d, ClaimTest test, double margin) {
  if (!d.has_interval) return Verdict::kInconclusive;
  const double bound = test == ClaimTest::kNotWorse ? margin : 0.0;
  if (d.hi < bound) return Verdict::kSupported;
  if (d.lo > bound) return Verdict::kContradicted;
  return Verdict::kInconclusive;
}

Verdict combine(const std::vector<Verdict>& pairs) {
  bool all = !pairs.empty();
  for (Verdict v : pairs) {
    if (v == Verdict::kContradicted) return Verdict::kContradicted;
    all = all && v == Verdict::kSupported;
  }
  return all ? Verdict::kSupported : Verdict::kInconclusive;
}

}  // namespace cemfrac

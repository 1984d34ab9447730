// The statistics of `cemfrac compare`: mean and standard deviation over seeds, the Student t
// quantile, the paired difference of two rows with its 95% interval, and the verdict of a claim.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/core/fields.h"

namespace cemfrac {

struct MeanSd {
  double mean = 0;
  double sd = 0;  // sample standard deviation (n - 1); 0 when n < 2
  int64_t n = 0;
};
MeanSd mean_sd(const std::vector<double>& x);

// P(T <= t) for Student's t with `df` > 0 degrees of freedom (regularised incomplete beta).
double student_t_cdf(double t, double df);
// The p-quantile (0 < p < 1) of Student's t with `df` degrees of freedom (bisection on the cdf).
double student_t_quantile(double p, double df);

// d_i = a_i - b_i over paired seeds: mean, sd, n, and the two-sided 95% interval
// mean +- t_{0.975, n-1} sd / sqrt(n). With n < 2 the interval is undefined (lo = hi = mean,
// has_interval false).
struct PairedDiff {
  MeanSd diff;
  double lo = 0;
  double hi = 0;
  bool has_interval = false;
};
PairedDiff paired_difference(const std::vector<double>& a, const std::vector<double>& b);

enum class Verdict { kSupported, kContradicted, kInconclusive };
const char* to_string(Verdict v);

// A claim's test (suite files: test = "better" | "not_worse").
enum class ClaimTest { kBetter, kNotWorse };
template <>
struct EnumNames<ClaimTest> {
  static constexpr std::array<std::pair<ClaimTest, const char*>, 2> kNames = {
      {{ClaimTest::kBetter, "better"}, {ClaimTest::kNotWorse, "not_worse"}}};
};

// A claim on a lower-is-better metric, d = a - b:
//   better:    supported when the interval lies below 0, contradicted when it lies above 0;
//   not_worse: supported when it lies below +margin, contradicted when it lies above +margin;
// otherwise (or without an interval) inconclusive.
Verdict verdict(const PairedDiff& d, ClaimTest test, double margin);
// A claim over several pairs: supported when every pair is, contradicted when any pair is, else
// inconclusive.
Verdict combine(const std::vector<Verdict>& pairs);

}  // namespace cemfrac

#include "cemfrac/eval/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include "cemfrac/core/check.h"

namespace cemfrac {

MeanStderr mean_stderr(const std::vector<double>& values) {
  MeanStderr r;
  const size_t n = values.size();
  if (n == 0) return r;
  double sum = 0;
  for (double v : values) sum += v;
  r.mean = sum / static_cast<double>(n);
  if (n < 2) return r;
  double ss = 0;
  for (double v : values) ss += (v - r.mean) * (v - r.mean);
  const double sample_sd = std::sqrt(ss / static_cast<double>(n - 1));
  r.stderr_ = sample_sd / std::sqrt(static_cast<double>(n));
  return r;
}

double weighted_perplexity(double sum_loglik, double sum_weight) {
  CEMFRAC_CHECK(sum_weight > 0, "perplexity: the weights sum to {}, need > 0", sum_weight);
  return std::exp(-sum_loglik / sum_weight);
}

double bits_per_byte(double sum_loglik, double bytes) {
  CEMFRAC_CHECK(bytes > 0, "bits per byte: {} bytes, need > 0", bytes);
  return -sum_loglik / bytes / std::log(2.0);
}

int64_t utf8_characters(std::string_view text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

int64_t harness_word_count(std::string_view text) {
  // Python's \s in a str pattern: Unicode whitespace; for the ASCII range it is " \t\n\r\f\v" and
  // the separators 0x1c..0x1f. Non-ASCII whitespace (U+00A0, U+2003, ...) is not split here; the
  // difference is documented in docs/evaluation.md.
  auto is_space = [](unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
  };
  int64_t pieces = 1;
  for (size_t i = 0; i < text.size();) {
    if (is_space(static_cast<unsigned char>(text[i]))) {
      ++pieces;
      while (i < text.size() && is_space(static_cast<unsigned char>(text[i]))) ++i;
    } else {
      ++i;
    }
  }
  return pieces;
}

Confusion confusion(const std::vector<int64_t>& predicted, const std::vector<int64_t>& gold) {
  CEMFRAC_CHECK(predicted.size() == gold.size(), "confusion: {} predictions for {} labels",
                predicted.size(), gold.size());
  Confusion c;
  for (size_t i = 0; i < gold.size(); ++i) {
    CEMFRAC_CHECK((gold[i] == 0 || gold[i] == 1) && (predicted[i] == 0 || predicted[i] == 1),
                  "confusion: labels must be 0 or 1, got predicted {} gold {}", predicted[i],
                  gold[i]);
    if (predicted[i] == 1) {
      (gold[i] == 1 ? c.tp : c.fp) += 1;
    } else {
      (gold[i] == 1 ? c.fn : c.tn) += 1;
    }
  }
  return c;
}

double accuracy(const std::vector<int64_t>& predicted, const std::vector<int64_t>& gold) {
  CEMFRAC_CHECK(predicted.size() == gold.size() && !gold.empty(),
                "accuracy: {} predictions for {} labels", predicted.size(), gold.size());
  int64_t right = 0;
  for (size_t i = 0; i < gold.size(); ++i) right += predicted[i] == gold[i];
  return static_cast<double>(right) / static_cast<double>(gold.size());
}

double f1_score(const Confusion& c) {
  const double denom = 2.0 * c.tp + c.fp + c.fn;
  return denom > 0 ? 2.0 * c.tp / denom : 0.0;
}

double matthews_corrcoef(const Confusion& c) {
  const double tp = c.tp, fp = c.fp, fn = c.fn, tn = c.tn;
  const double denom = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn);
  if (denom == 0) return 0.0;
  return (tp * tn - fp * fn) / std::sqrt(denom);
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  CEMFRAC_CHECK(x.size() == y.size() && x.size() >= 2, "pearson: {} and {} values (need >= 2)",
                x.size(), y.size());
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0) return 0.0;
  return sxy / std::sqrt(sxx * syy);
}

std::vector<double> average_ranks(const std::vector<double>& x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> ranks(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    const double rank = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = rank;
    i = j + 1;
  }
  return ranks;
}

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  return pearson(average_ranks(x), average_ranks(y));
}

}  // namespace cemfrac

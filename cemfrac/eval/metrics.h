// The scores downstream evaluation reports, each defined as the reference that fixed it defines it:
//   lm-evaluation-harness: mean and its standard error over examples (`mean_stderr`: the sample
//     standard deviation, n - 1 in the denominator, over sqrt(n)); the weighted perplexity of a
//     rolling task, exp(-sum of log-likelihoods / sum of weights) with words or bytes as weights;
//     bits per byte, -sum of log-likelihoods / sum of bytes / ln 2.
//   GLUE (its scorer, after scikit-learn and scipy): accuracy; F1 of the positive class (label 1);
//     Matthews correlation from the 2 x 2 confusion matrix (0 when a marginal is empty, as
//     scikit-learn returns); Pearson's r; Spearman's rho as Pearson's r of the ranks, ties given
//     their average rank (scipy.stats.spearmanr).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cemfrac {

// The mean of `values` and its standard error (0 for fewer than 2 values).
struct MeanStderr {
  double mean = 0;
  double stderr_ = 0;
};
MeanStderr mean_stderr(const std::vector<double>& values);

// exp(-sum(loglik) / sum(weight)).
double weighted_perplexity(double sum_loglik, double sum_weight);
// -sum(loglik) / bytes / ln 2.
double bits_per_byte(double sum_loglik, double bytes);
// Characters as Python's len(str) counts them: the code points of valid UTF-8 (its bytes that are
// not continuation bytes 10xxxxxx). The harness's acc_norm divides by this.
int64_t utf8_characters(std::string_view text);
// Words as the harness counts them for WikiText: the pieces re.split(r"\s+", text) gives (so a
// text that starts or ends with whitespace counts one more, empty, piece at that end).
int64_t harness_word_count(std::string_view text);

// Binary classification counts; labels are 0 / 1, 1 the positive class.
struct Confusion {
  int64_t tp = 0, fp = 0, fn = 0, tn = 0;
};
Confusion confusion(const std::vector<int64_t>& predicted, const std::vector<int64_t>& gold);

double accuracy(const std::vector<int64_t>& predicted, const std::vector<int64_t>& gold);
// 2 tp / (2 tp + fp + fn); 0 when there is no positive prediction or gold label.
double f1_score(const Confusion& c);
// (tp tn - fp fn) / sqrt((tp + fp)(tp + fn)(tn + fp)(tn + fn)); 0 when a factor is 0.
double matthews_corrcoef(const Confusion& c);
// Pearson's r; 0 when either side is constant.
double pearson(const std::vector<double>& x, const std::vector<double>& y);
// Ranks 1..n, tied values sharing their average rank.
std::vector<double> average_ranks(const std::vector<double>& x);
double spearman(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace cemfrac

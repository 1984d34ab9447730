#include "cemfrac/data/split.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "cemfrac/core/check.h"

namespace cemfrac {

SplitFractions parse_split_fractions(const std::string& text) {
  std::vector<double> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    CEMFRAC_CHECK(!item.empty() && end == item.c_str() + item.size() && std::isfinite(v) && v >= 0,
                  "--split {}: '{}' is not a non-negative number; write train,val,test such as "
                  "90,5,5",
                  text, item);
    values.push_back(v);
  }
  CEMFRAC_CHECK(values.size() == 3 && text.back() != ',',
                "--split {}: expected three numbers train,val,test such as 90,5,5", text);
  CEMFRAC_CHECK(values[0] > 0, "--split {}: the train part must be positive", text);
  const double sum = values[0] + values[1] + values[2];
  return SplitFractions{values[0] / sum, values[1] / sum, values[2] / sum};
}

std::string to_string(const SplitFractions& f) {
  return fmt::format("{:g},{:g},{:g}", f.train * 100, f.val * 100, f.test * 100);
}

DocumentSplit split_documents(size_t n_documents, const SplitFractions& fractions, uint64_t seed) {
  const double f[kNumSplits] = {fractions.train, fractions.val, fractions.test};
  CEMFRAC_CHECK(f[0] > 0 && f[1] >= 0 && f[2] >= 0,
                "split fractions {} are invalid: train must be "
                "positive, val and test non-negative",
                to_string(fractions));
  const double sum = f[0] + f[1] + f[2];
  size_t needed = 0;
  for (double x : f) needed += x > 0;
  CEMFRAC_CHECK(n_documents >= needed,
                "{} document{} cannot be split {} by document (each non-empty split needs one): "
                "use more documents (a directory of .txt files) or --split 100,0,0",
                n_documents, n_documents == 1 ? "" : "s", to_string(fractions));

  const auto n = static_cast<double>(n_documents);
  size_t count[kNumSplits] = {0, 0, 0};
  for (int s = 1; s < kNumSplits; ++s) {
    if (f[s] <= 0) continue;
    count[s] = std::max<size_t>(1, static_cast<size_t>(std::llround(n * f[s] / sum)));
  }
  // Train keeps at least one document: take from the larger of val / test, never below one.
  while (count[1] + count[2] > n_documents - 1) {
    const int s = count[1] >= count[2] ? 1 : 2;
    // Cannot fail: n_documents >= `needed` leaves room for one document in each non-empty split.
    CEMFRAC_CHECK(count[s] > 1, "internal error: split sizes for {} documents", n_documents);
    --count[s];
  }
  count[0] = n_documents - count[1] - count[2];

  const std::vector<size_t> order = seeded_permutation(n_documents, seed);
  DocumentSplit split;
  size_t begin = 0;
  for (int s = 0; s < kNumSplits; ++s) {
    split.indices[s].assign(order.begin() + static_cast<std::ptrdiff_t>(begin),
                            order.begin() + static_cast<std::ptrdiff_t>(begin + count[s]));
    std::sort(split.indices[s].begin(), split.indices[s].end());
    begin += count[s];
  }
  return split;
}

DocumentSplit split_documents_by_group(const std::vector<size_t>& group_of,
                                       const SplitFractions& fractions, uint64_t seed) {
  std::vector<std::vector<size_t>> members;
  for (size_t i = 0; i < group_of.size(); ++i) {
    if (group_of[i] >= members.size()) members.resize(group_of[i] + 1);
    members[group_of[i]].push_back(i);
  }
  DocumentSplit split;
  for (const std::vector<size_t>& group : members) {
    if (group.empty()) continue;
    const DocumentSplit part = split_documents(group.size(), fractions, seed);
    for (int s = 0; s < kNumSplits; ++s)
      for (size_t k : part.indices[s]) split.indices[s].push_back(group[k]);
  }
  for (auto& indices : split.indices) std::sort(indices.begin(), indices.end());
  return split;
}

}  // namespace cemfrac

// Deterministic, seeded, document-level train / val / test split.
//
// The documents are permuted by seeded_permutation(n, seed) (core/random.h: our own splitmix64 and
// Fisher-Yates, so the permutation is the same with every compiler and standard library), the first
// n_train of the permutation go to train, the next n_val to val, the rest to test; inside each
// split documents keep their input order. Sizes: n_val = round(n * f_val) and n_test = round(n *
// f_test), each raised to 1 when its fraction is positive, then lowered (largest first, never below
// 1) until train keeps at least one document; train gets the rest. A split whose fraction is 0 is
// empty. With fewer documents than splits of positive fraction there is no such split, and
// split_documents throws (the message suggests --split 100,0,0 or more documents).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cemfrac/core/random.h"  // SplitMix64, seeded_permutation

namespace cemfrac {

struct SplitFractions {
  double train = 0.90;
  double val = 0.05;
  double test = 0.05;
};

// "90,5,5" or "0.9,0.05,0.05": three non-negative numbers, train > 0, normalised to sum 1. Throws a
// cemfrac::Error naming the flag value otherwise.
SplitFractions parse_split_fractions(const std::string& text);
std::string to_string(const SplitFractions& fractions);  // "90,5,5" style, in percent

inline constexpr int kNumSplits = 3;
inline constexpr const char* kSplitNames[kNumSplits] = {"train", "val", "test"};

// Document indices per split, each ascending: [0] train, [1] val, [2] test.
struct DocumentSplit {
  std::vector<size_t> indices[kNumSplits];
};

DocumentSplit split_documents(size_t n_documents, const SplitFractions& fractions, uint64_t seed);

// Each group split on its own by split_documents (same fractions and seed), so that every split
// holds each group in proportion: document i belongs to group group_of[i]. A group with fewer
// documents than non-empty splits throws as split_documents does.
DocumentSplit split_documents_by_group(const std::vector<size_t>& group_of,
                                       const SplitFractions& fractions, uint64_t seed);

}  // namespace cemfrac

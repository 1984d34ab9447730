// The ladder function's implementation and backward choices (ops/continuant.h), apart from the
// op so that config structs (layers/cofrgenet/cofrgenet_config.h) can hold them without torch.
#pragma once
#include <array>
#include <utility>

#include "cemfrac/core/fields.h"

namespace cemfrac {

enum class ContinuantImpl { kFused, kReference, kLiteral };

enum class ContinuantBackward {
  kSurrogate,  // Proposition 1 with K̂_d in place of K_d everywhere (the paper's cached reciprocal)
  kExact,      // the derivative of the clamped map: inside the clamp K̂_d is a constant
};

template <>
struct EnumNames<ContinuantImpl> {
  static constexpr std::array<std::pair<ContinuantImpl, const char*>, 3> kNames = {
      {{ContinuantImpl::kFused, "fused"},
       {ContinuantImpl::kReference, "reference"},
       {ContinuantImpl::kLiteral, "literal"}}};
};
template <>
struct EnumNames<ContinuantBackward> {
  static constexpr std::array<std::pair<ContinuantBackward, const char*>, 2> kNames = {
      {{ContinuantBackward::kSurrogate, "surrogate"}, {ContinuantBackward::kExact, "exact"}}};
};

}  // namespace cemfrac

// Frequency scaling of RoPE for long contexts, as a nested table of the model config
// (`model.rope_scaling = { type = "llama3", factor = 32.0, ... }`). "llama3" is the scheme of
// Meta's Llama 3.1 / 3.2 releases: with wavelength lambda_i = 2 pi / w_i of each rotary
// frequency w_i,
//   lambda_i < C / high_freq_factor   ->  w_i unchanged            (short wavelengths: local order)
//   lambda_i > C / low_freq_factor    ->  w_i / factor             (long wavelengths: stretched)
//   otherwise                         ->  (1 - s) w_i / factor + s w_i,
//                                         s = (C / lambda_i - low_freq_factor) / (high_freq_factor
//                                         - low_freq_factor)
// where C = original_context, the context the frequencies were first trained for.
#pragma once
#include <array>
#include <cstdint>
#include <utility>

#include "cemfrac/core/fields.h"

namespace cemfrac {

enum class RopeScalingType { kNone, kLlama3 };
template <>
struct EnumNames<RopeScalingType> {
  static constexpr std::array<std::pair<RopeScalingType, const char*>, 2> kNames = {
      {{RopeScalingType::kNone, "none"}, {RopeScalingType::kLlama3, "llama3"}}};
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;

  template <typename Visitor>
  void visit_fields(Visitor& v) {
    v("type", type, "none | llama3");
    v("factor", factor, "llama3: divisor of the long-wavelength frequencies");
    v("low_freq_factor", low_freq_factor,
      "llama3: wavelengths above original_context / this are divided");
    v("high_freq_factor", high_freq_factor,
      "llama3: wavelengths below original_context / this are kept");
    v("original_context", original_context,
      "llama3: context the unscaled frequencies were trained for");
  }
};

}  // namespace cemfrac

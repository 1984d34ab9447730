// Small text helpers shared by tables and reports (the CLI's printers, the suite report).
#pragma once
#include <cstdint>
#include <string>

namespace cemfrac {

// 124439808 -> "124,439,808"; -1234 -> "-1,234" (the sign outside the groups; INT64_MIN too).
inline std::string with_commas(int64_t n) {
  // The magnitude in unsigned arithmetic: -INT64_MIN does not fit an int64_t.
  const uint64_t magnitude = n < 0 ? ~static_cast<uint64_t>(n) + 1 : static_cast<uint64_t>(n);
  const std::string digits = std::to_string(magnitude);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace cemfrac

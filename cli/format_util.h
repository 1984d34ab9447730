// Small text helpers shared by the CLI's table printers.
#pragma once
#include <cstdint>
#include <string>

namespace cemfrac::cli {

// 124439808 -> "124,439,808"
inline std::string with_commas(int64_t n) {
  const bool negative = n < 0;
  const std::string digits = std::to_string(negative ? -n : n);
  std::string out = negative ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace cemfrac::cli

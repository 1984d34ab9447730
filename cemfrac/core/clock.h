// Elapsed time and its display, for progress lines and reports; the median of repeated timings.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace cemfrac {

// Seconds of the monotonic clock since `start` (a std::chrono::steady_clock::now()).
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A duration or ETA for people, rounded to the second: 42 -> "42s", 754 -> "12m34s",
// 7380 -> "2h03m"; negative or non-finite (nothing measured yet) -> "?".
inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// The wall-clock time now, UTC, in a strftime `format`; by default ISO 8601 to the second:
// "2026-12-04T01:23:45Z" (reports print "%Y-%m-%d %H:%M UTC").
inline std::string utc_now(const char* format = "%Y-%m-%dT%H:%M:%SZ") {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

// The median of a list (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace cemfrac

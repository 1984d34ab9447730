// What the `cemfrac bench` areas share: the heap policy and the timing loop.
#pragma once
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

namespace cemfrac::cli {

// Keep freed memory in the heap: without this glibc serves large tensors from fresh mmaps and every
// timed call pays their page faults. Benchmarks call it unless --malloc-default.
inline void keep_heap() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

struct Timing {
  double best_ms = 0;
  double median_ms = 0;
};

// Best and median of a list of times (of any unit; {0, 0} when empty).
inline Timing summarize_times(std::vector<double> ms) {
  if (ms.empty()) return {};
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {ms.front(), median};
}

// One warm-up call, then `reps` timed calls; best and median.
template <typename Fn>
Timing time_it(Fn&& fn, int reps) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return summarize_times(std::move(ms));
}

}  // namespace cemfrac::cli

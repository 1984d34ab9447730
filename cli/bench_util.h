// What the `cemfrac bench` areas share: the heap policy, the timing loop (and the device sync it
// needs on CUDA) and integer-list flags.
#pragma once
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"

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
  return {*std::min_element(ms.begin(), ms.end()), median(ms)};
}

// A comma-separated list of integers in [1, max] given to `flag` ("1,8"; empty items are skipped).
// `what` names one value in the error ("a batch size"); `example` is a valid list; the default max
// means no upper bound. Throws one line.
inline std::vector<int64_t> parse_int_list(const std::string& text, const char* flag,
                                           const char* what, const char* example,
                                           int64_t max = std::numeric_limits<int64_t>::max()) {
  const std::string range =
      max == std::numeric_limits<int64_t>::max() ? "an integer >= 1" : fmt::format("in 1..{}", max);
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CEMFRAC_CHECK(used == item.size() && v >= 1 && v <= max, "{}: '{}' is not {} ({}; e.g. {} {})",
                  flag, item, what, range, flag, example);
    out.push_back(v);
  }
  CEMFRAC_CHECK(!out.empty(), "{} needs at least one value (e.g. {} {})", flag, flag, example);
  return out;
}

// Waits for the device's queued work before a clock is read (CUDA kernels run asynchronously);
// nothing on the CPU.
inline void sync_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One warm-up call, then `reps` timed calls; best and median. `device` is where fn's work runs:
// on CUDA each call is timed from a synchronised device to a synchronised device.
template <typename Fn>
Timing time_it(Fn&& fn, int reps, const c10::Device& device = c10::Device(c10::kCPU)) {
  fn();
  sync_device(device);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync_device(device);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return summarize_times(std::move(ms));
}

}  // namespace cemfrac::cli

// Where the time of one training step goes: LibTorch's autograd profiler (CPU events) around a
// call, aggregated by op name into self and total time (`cemfrac bench train --profile`).
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cemfrac::cli {

struct OpTime {
  std::string name;     // ATen op ("aten::mm"), autograd node ("MmBackward0") or a cemfrac scope
  int64_t calls = 0;    // ranges of this name
  double self_ms = 0;   // inside the range and outside every range nested in it
  double total_ms = 0;  // inside the range (an op that nests in itself counts once per range)
};

struct StepProfile {
  double wall_ms = 0;        // the profiled call, wall clock, profiler overhead included
  double attributed_ms = 0;  // the sum of self_ms: the rest ran outside any recorded range
  std::vector<OpTime> ops;   // by self_ms, largest first
};

// Runs `fn` once with the profiler on. Only the calling thread's ranges (and those of the threads
// the profiler propagates to, such as autograd's) are seen; the worker threads of an op's parallel
// loop run inside that op's range, so their time is the op's.
StepProfile profile_call(const std::function<void()>& fn);

// The `top` rows by self time, then one row for the rest.
nlohmann::json profile_to_json(const StepProfile& p, std::size_t top);
std::string profile_table(const StepProfile& p, std::size_t top);

}  // namespace cemfrac::cli

#include "cli/step_profile.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>

#include "cemfrac/core/clock.h"

namespace cemfrac::cli {

namespace prof = torch::autograd::profiler;

namespace {

struct Open {
  const prof::LegacyEvent* push;
  double child_us = 0;  // total time of the ranges directly nested in this one
};

// One thread's events, in the order they were recorded: a pop closes the innermost open range
// with the same handle (ranges of one thread nest; the search tolerates a pop without its push).
std::string display_name(std::string name);

void accumulate(const std::vector<prof::LegacyEvent>& events,
                std::map<std::string, OpTime>& by_name) {
  std::vector<Open> stack;
  for (const prof::LegacyEvent& e : events) {
    if (e.kind() == prof::EventKind::PushRange) {
      stack.push_back({&e});
    } else if (e.kind() == prof::EventKind::PopRange) {
      auto it = std::find_if(stack.rbegin(), stack.rend(),
                             [&](const Open& o) { return o.push->handle() == e.handle(); });
      if (it == stack.rend()) continue;
      const size_t at = static_cast<size_t>(stack.rend() - it) - 1;
      stack.resize(at + 1);  // ranges left open inside it end with it
      const Open o = stack.back();
      stack.pop_back();
      const double total_us = o.push->cpuElapsedUs(e);
      const std::string name = display_name(o.push->name());
      OpTime& row = by_name[name];
      row.name = name;
      row.calls += 1;
      row.total_ms += total_us / 1e3;
      row.self_ms += (total_us - o.child_us) / 1e3;
      if (!stack.empty()) stack.back().child_us += total_us;
    }
  }
}

// Shorter names for the table: a custom autograd Function's backward node reads
// "torch::autograd::CppNode<cemfrac::(anonymous namespace)::FusedCausalAttention>".
std::string display_name(std::string name) {
  auto strip = [&](const std::string& what) {
    for (size_t at; (at = name.find(what)) != std::string::npos;) name.erase(at, what.size());
  };
  const std::string node = "torch::autograd::CppNode<";
  if (name.rfind(node, 0) == 0 && name.back() == '>') {
    name = name.substr(node.size(), name.size() - node.size() - 1) + " (backward)";
  }
  strip("(anonymous namespace)::");
  const std::string eval = "autograd::engine::evaluate_function: ";
  if (name.rfind(eval, 0) == 0) name = "autograd: " + name.substr(eval.size());
  return name;
}

}  // namespace

StepProfile profile_call(const std::function<void()>& fn) {
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::CPU);
  prof::enableProfilerLegacy(config);
  const auto t0 = std::chrono::steady_clock::now();
  prof::thread_event_lists lists;
  try {
    RECORD_FUNCTION("cemfrac::step (outside any op)", std::vector<c10::IValue>());
    fn();
  } catch (...) {
    prof::disableProfilerLegacy();
    throw;
  }
  StepProfile out;
  out.wall_ms = seconds_since(t0) * 1e3;
  lists = prof::disableProfilerLegacy();
  std::map<std::string, OpTime> by_name;
  for (const auto& events : lists) accumulate(events, by_name);
  for (auto& [name, row] : by_name) {
    out.attributed_ms += row.self_ms;
    out.ops.push_back(row);
  }
  std::sort(out.ops.begin(), out.ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return out;
}

nlohmann::json profile_to_json(const StepProfile& p, std::size_t top) {
  nlohmann::json rows = nlohmann::json::array();
  double rest = 0;
  int64_t rest_calls = 0;
  for (std::size_t i = 0; i < p.ops.size(); ++i) {
    if (i < top) {
      rows.push_back({{"name", p.ops[i].name},
                      {"calls", p.ops[i].calls},
                      {"self_ms", p.ops[i].self_ms},
                      {"total_ms", p.ops[i].total_ms},
                      {"self_share", p.ops[i].self_ms / p.wall_ms}});
    } else {
      rest += p.ops[i].self_ms;
      rest_calls += p.ops[i].calls;
    }
  }
  if (rest_calls > 0)
    rows.push_back({{"name", fmt::format("({} other names)", p.ops.size() - top)},
                    {"calls", rest_calls},
                    {"self_ms", rest},
                    {"total_ms", nullptr},
                    {"self_share", rest / p.wall_ms}});
  return {{"wall_ms", p.wall_ms}, {"attributed_ms", p.attributed_ms}, {"ops", rows}};
}

std::string profile_table(const StepProfile& p, std::size_t top) {
  std::string s = fmt::format(
      "one profiled step: {:.1f} ms wall ({:.1f} ms inside recorded ranges; the profiler adds "
      "its own overhead)\n{:<48} {:>7} {:>10} {:>7} {:>10}\n",
      p.wall_ms, p.attributed_ms, "op (self time: outside the ranges nested in it)", "calls",
      "self ms", "self %", "total ms");
  const nlohmann::json j = profile_to_json(p, top);
  for (const auto& r : j["ops"]) {
    const std::string total =
        r["total_ms"].is_null() ? std::string("-") : fmt::format("{:.1f}", r["total_ms"].get<double>());
    std::string name = r["name"].get<std::string>();
    if (name.size() > 48) name = name.substr(0, 45) + "...";
    s += fmt::format("{:<48} {:>7} {:>10.1f} {:>6.1f}% {:>10}\n", name, r["calls"].get<int64_t>(),
                     r["self_ms"].get<double>(), 100 * r["self_share"].get<double>(), total);
  }
  return s;
}

}  // namespace cemfrac::cli

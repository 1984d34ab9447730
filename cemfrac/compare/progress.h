// The suite runner's time left in a phase (cemfrac compare's progress line).
#pragma once
#include <algorithm>
#include <cstddef>

namespace cemfrac {

// Seconds left in a phase whose jobs were estimated at `total_est` job-seconds, of which `done`
// are done (finished jobs plus the running ones' share) after `elapsed` seconds, with `at_once`
// jobs running at a time.
//
// The measured rate, left * elapsed / done, is what holds over a phase; early on it rests on one or
// two coarse reports (a GP job logs every 10% of its steps) and swings by 25x and more: a minute
// into a resumed suite it read 67h against a plan of 2h44m. So the plan's figure (left spread over
// the jobs at once) is blended into it linearly until `done` reaches 10% of the phase or ten
// minutes of work per job slot, whichever comes first; from there on it is the measured rate alone.
inline double phase_eta_seconds(double total_est, double done, double elapsed, size_t at_once) {
  const double left = std::max(0.0, total_est - done);
  const double planned = left / static_cast<double>(std::max<size_t>(1, at_once));
  if (done <= 0 || elapsed <= 0) return planned;
  const double measured = left * elapsed / done;
  const double trust_at = std::min(0.1 * total_est, 600.0 * static_cast<double>(at_once));
  const double w = trust_at > 0 ? std::min(1.0, done / trust_at) : 1.0;
  return w * measured + (1 - w) * planned;
}

}  // namespace cemfrac

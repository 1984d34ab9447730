// SIGINT/SIGTERM as a request to stop cleanly (a training saves a checkpoint after its current
// step): while a ScopedStopSignals lives, both signals run `handler` (which should only set a
// lock-free atomic flag: async-signal-safe); the previous handlers come back when it is destroyed.
// SA_RESETHAND: a second signal gets the default action, so a stuck step can still be killed.
#pragma once
#include <csignal>

namespace cemfrac {

class ScopedStopSignals {
 public:
  ScopedStopSignals(bool enable, void (*handler)(int)) : enabled_(enable) {
    if (!enabled_) return;
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~ScopedStopSignals() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  ScopedStopSignals(const ScopedStopSignals&) = delete;
  ScopedStopSignals& operator=(const ScopedStopSignals&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace cemfrac

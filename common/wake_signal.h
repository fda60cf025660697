// A counter threads wait on with a monotonic timeout, timed by an
// injected Clock (common/clock.h) or the system's.
//
// Why not absl::Mutex::AwaitWithTimeout: the Abseil of Debian 12 waits
// until an absolute CLOCK_REALTIME time (FUTEX_CLOCK_REALTIME), so a wall
// clock stepped back by an hour holds every timed wait up by an hour. This
// waits on std::condition_variable over steady_clock (pthread_cond_clockwait
// on CLOCK_MONOTONIC): a step of the wall clock neither delays nor hastens
// it.
//
// Use: read generation() while the state the waiter checks cannot change
// unseen (under the caller's own lock), then WaitFor(seen, ...); whoever
// changes that state calls Notify() after the change.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"
#include "common/clock.h"

namespace trainctl {

class WakeSignal {
 public:
  // Wakes every waiter.
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
    }
    cv_.notify_all();
  }

  uint64_t generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }

  // Waits until generation() != `seen` or Mono() of `clock` reaches
  // `deadline` (absl::InfiniteFuture(): no deadline). True when woken by a
  // Notify. The system clock waits on the steady clock; a FakeClock until
  // it is advanced past the deadline (common/clock.h).
  bool WaitUntil(uint64_t seen, absl::Time deadline, const Clock& clock) {
    std::unique_lock<std::mutex> lock(mu_);
    return clock.WaitUntil(cv_, lock, deadline, [&] { return generation_ != seen; });
  }

  // Waits until generation() != `seen` or `timeout` has passed on the
  // monotonic clock (forever for absl::InfiniteDuration()). True when
  // woken by a Notify.
  bool WaitFor(uint64_t seen, absl::Duration timeout) {
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : MonotonicNow() + timeout;
    return WaitUntil(seen, deadline, *SystemClock::Get());
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

}  // namespace trainctl

// A counter threads wait on with a monotonic timeout.
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

  // Waits until generation() != `seen` or `timeout` has passed on the
  // monotonic clock (forever for absl::InfiniteDuration()). True when
  // woken by a Notify.
  bool WaitFor(uint64_t seen, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto changed = [&] { return generation_ != seen; };
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock, changed);
      return true;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(absl::ToInt64Nanoseconds(timeout));
    return cv_.wait_until(lock, deadline, changed);
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

}  // namespace trainctl

// Time source, injected so that leases, hang detection and timeouts can be
// tested with a fake clock (LevelDB's Env habit).
//
// SystemClock is stateless; FakeClock is thread-safe.
#pragma once

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {

// Monotonic time as an absl::Time: the wall time when first asked plus the
// steady clock's time since. It never jumps when the wall clock is stepped
// (NTP, an admin, a VM resumed): for deadlines and intervals (leases, loop
// timers, waits). Timestamps shown to people use the wall clock.
inline absl::Time MonotonicNow() {
  static const std::chrono::steady_clock::time_point start_steady = std::chrono::steady_clock::now();
  static const absl::Time start_wall = absl::Now();
  return start_wall + absl::FromChrono(std::chrono::steady_clock::now() - start_steady);
}

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall time: timestamps.
  virtual absl::Time Now() const = 0;
  // Monotonic time (MonotonicNow): deadlines. A fake clock's is its Now.
  virtual absl::Time Mono() const { return Now(); }
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  absl::Time Mono() const override { return MonotonicNow(); }
  static SystemClock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// Only moves when told to: Advance moves both clocks, StepWall only the
// wall clock (as NTP or an admin stepping it would).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1700000000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_ + wall_step_;
  }
  absl::Time Mono() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void StepWall(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    wall_step_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration wall_step_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainctl

// Time source, injected so that leases, hang detection and timeouts can be
// tested with a fake clock (LevelDB's Env habit).
//
// A clock also times blocking waits (WaitUntil): the system clock waits on
// the steady clock, a fake clock until it is advanced past the deadline, so
// a test drives a daemon's heartbeats, backoffs and timeouts by advancing
// its clock rather than by waiting.
//
// SystemClock is stateless; FakeClock is thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {

// Monotonic time as an absl::Time: the wall time when first asked plus the
// steady clock's time since. It never jumps when the wall clock is stepped
// (NTP, an admin, a VM resumed): for deadlines and intervals (leases, loop
// timers, waits). Timestamps shown to people use the wall clock.
inline absl::Time MonotonicNow() {
  static const std::chrono::steady_clock::time_point start_steady =
      std::chrono::steady_clock::now();
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
  // Waits on `cv` (`lock` held on entry and on return; released while
  // waiting) until `ready()` (called with `lock` held) or until Mono()
  // reaches `deadline` (absl::InfiniteFuture(): no deadline). Returns
  // ready(). Whoever makes ready() true notifies `cv` after the change,
  // holding `lock`'s mutex or having released it.
  virtual bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         absl::Time deadline, absl::FunctionRef<bool()> ready) const = 0;
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  absl::Time Mono() const override { return MonotonicNow(); }
  // On the steady clock (pthread_cond_clockwait on CLOCK_MONOTONIC): a step
  // of the wall clock neither delays nor hastens it.
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 absl::Time deadline, absl::FunctionRef<bool()> ready) const override {
    if (deadline == absl::InfiniteFuture()) {
      cv.wait(lock, [&] { return ready(); });
      return true;
    }
    // In waits of at most a year: a deadline centuries away (as a far
    // finite one a caller computes) would overflow the steady clock's
    // int64 nanoseconds and end the wait at once.
    constexpr absl::Duration kLongestWait = absl::Hours(24 * 365);
    for (;;) {
      const absl::Duration left = deadline - MonotonicNow();
      if (left <= absl::ZeroDuration()) return ready();
      const auto until =
          std::chrono::steady_clock::now() +
          std::chrono::nanoseconds(absl::ToInt64Nanoseconds(std::min(left, kLongestWait)));
      if (cv.wait_until(lock, until, [&] { return ready(); })) return true;
    }
  }
  static SystemClock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// Only moves when told to: Advance moves both clocks, StepWall only the
// wall clock (as NTP or an admin stepping it would). A WaitUntil on it ends
// when ready() or when Advance has moved Mono() to its deadline; real time
// passing does not end it.
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
  // Then wakes every WaitUntil, which sees the new time.
  void Advance(absl::Duration d) {
    {
      absl::MutexLock lock(&mu_);
      now_ += d;
    }
    // Each waiter's own mutex is taken before its cv is notified: a waiter
    // that read the old time is then inside its wait and is woken.
    std::lock_guard<std::mutex> waiters(waiters_mu_);
    for (const Waiter& w : waiters_) {
      std::lock_guard<std::mutex> lock(*w.mu);
      w.cv->notify_all();
    }
  }
  void StepWall(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    wall_step_ += d;
  }

  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 absl::Time deadline, absl::FunctionRef<bool()> ready) const override {
    // Registered with `lock` released (Advance takes waiters_mu_, then the
    // waiter's mutex); ready() and the time are read after, so neither a
    // change nor an Advance in between is missed.
    lock.unlock();
    {
      std::lock_guard<std::mutex> waiters(waiters_mu_);
      waiters_.push_back({lock.mutex(), &cv});
    }
    waiters_cv_.notify_all();
    lock.lock();
    while (!ready() && Mono() < deadline) cv.wait(lock);
    lock.unlock();
    {
      std::lock_guard<std::mutex> waiters(waiters_mu_);
      auto it = std::find_if(waiters_.begin(), waiters_.end(),
                             [&](const Waiter& w) { return w.cv == &cv; });
      waiters_.erase(it);
    }
    lock.lock();
    return ready();
  }

  // For tests: waits, at most `real_timeout` of real time, until at least
  // `n` threads are inside WaitUntil (their deadlines taken); whether they are.
  bool AwaitWaiters(size_t n, absl::Duration real_timeout) const {
    std::unique_lock<std::mutex> waiters(waiters_mu_);
    return waiters_cv_.wait_for(waiters, absl::ToChronoNanoseconds(real_timeout),
                                [&] { return waiters_.size() >= n; });
  }

 private:
  struct Waiter {
    std::mutex* mu;
    std::condition_variable* cv;
  };
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration wall_step_ ABSL_GUARDED_BY(mu_);
  // Threads inside WaitUntil. Lock order: waiters_mu_, then a waiter's mutex.
  mutable std::mutex waiters_mu_;
  mutable std::condition_variable waiters_cv_;
  mutable std::vector<Waiter> waiters_;
};

}  // namespace trainctl

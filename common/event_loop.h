// A single-threaded event loop: the coordinator's control plane and the
// worker daemon each run their state on one.
//
// Every manager (WorkerRegistry, JobManager, MetricsHub) is "not
// thread-safe; runs on the loop": gRPC handlers Post() a closure that calls
// the managers and completes the RPC, and periodic checks (leases, hangs,
// rendezvous timeouts) run as timers on the same thread. One thread keeps
// every transition ordered without lock juggling between managers; the
// work per call is small (memory + one SQLite transaction).
//
// Thread-safe: Post/Every/Stop may be called from any thread.
//
// "On the loop" is also a capability clang's thread-safety analysis
// understands (as Chromium's sequence checkers are): state only the loop may
// touch is ABSL_GUARDED_BY(loop_), functions that run only on it are
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_), and an entry point that other
// threads reach only through Post first calls loop_.CheckInLoop(...), which
// checks it at run time (in release builds too) and tells the analysis.
// Owners that call into one another (the coordinator's) cannot each name
// their own `loop_`: the analysis would see as many capabilities; they name
// one instead (coordinator/core/on_loop.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/prometheus.h"
#include "common/wake_signal.h"

namespace trainctl {

class ABSL_LOCKABLE EventLoop {
 public:
  // Timers, waits and the task histograms run on `clock`'s monotonic time
  // (Clock::Mono; a FakeClock's timers fire when it is advanced). Null:
  // SystemClock.
  explicit EventLoop(const Clock* clock = SystemClock::Get());
  // Stops and joins the thread; closures already queued still run.
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Queues fn to run on the loop thread, after everything posted before.
  void Post(std::function<void()> fn);

  // Runs fn every `period` on the loop thread (first run one period from
  // now). Wakes the loop, so a waiting loop is never late for it.
  void Every(absl::Duration period, std::function<void()> fn);

  // Runs fn once on the loop thread, `delay` from now (the clock's monotonic time).
  void After(absl::Duration delay, std::function<void()> fn);

  // Runs fn on the loop and waits for it. Must not be called on the loop.
  void RunSync(const std::function<void()>& fn);

  // Finishes the closure in progress, then stops. Idempotent.
  void Stop();

  // Stop(), then waits until the loop thread has run what was queued and
  // exited (unless called on the loop itself). Call this before destroying
  // anything a queued closure may touch: after it returns, nothing runs.
  void StopAndJoin();

  // True on the loop thread.
  bool InLoop() const {
    return std::this_thread::get_id() == loop_id_.load(std::memory_order_acquire);
  }

  // The check every loop-only entry point makes, in release builds too (one
  // thread-id compare): called off the loop thread while the loop runs, it
  // prints `what` and aborts, rather than let two threads touch state that
  // only the loop may. Once the loop has exited (shutdown, one thread left)
  // any thread may call.
  // Asserts the loop capability for the analysis (see the top).
  void CheckInLoop(const char* what) const ABSL_ASSERT_EXCLUSIVE_LOCK();

  // Where the loop's time goes (thread-safe to read; /metrics writes them):
  // how long each task waited before it ran (a posted closure: from Post;
  // a timer: past its due time) and how long it ran, by kind. A long wait
  // with short runs is a loop that is busy; a long run is one task that
  // stalls everything behind it.
  enum class TaskKind { kPosted = 0, kTimer = 1 };
  const LatencyHistogram& task_wait(TaskKind kind) const { return wait_[static_cast<int>(kind)]; }
  const LatencyHistogram& task_run(TaskKind kind) const { return run_[static_cast<int>(kind)]; }

 private:
  struct Timer {
    absl::Duration period;
    absl::Time next;
    std::function<void()> fn;
    bool once = false;  // After: runs once, then goes
  };
  struct Posted {
    std::function<void()> fn;
    absl::Time posted;  // monotonic
  };
  void Run();

  const Clock* const clock_;
  absl::Mutex mu_;
  std::deque<Posted> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Timer> timers_ ABSL_GUARDED_BY(mu_);
  // What the idle loop sleeps on (monotonic; see wake_signal.h): Post,
  // RunSync, Every, After and Stop notify it after their change.
  WakeSignal wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The loop thread's id while Run() runs; the default id once it returned.
  std::atomic<std::thread::id> loop_id_{};
  LatencyHistogram wait_[2];
  LatencyHistogram run_[2];
  std::thread thread_;
};

}  // namespace trainctl

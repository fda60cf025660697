#include "common/event_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/clock.h"

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace trainctl {

EventLoop::EventLoop(const Clock* clock)
    : clock_(clock != nullptr ? clock : SystemClock::Get()), thread_([this] { Run(); }) {}

EventLoop::~EventLoop() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void EventLoop::Post(std::function<void()> fn) {
  const absl::Time posted = clock_->Mono();
  // Notified under mu_: once Stop() (which takes mu_) has returned, no
  // Post still touches wake_, so the destructor may destroy it (a gRPC
  // reactor's OnDone posting while the server is torn down raced it).
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  queue_.push_back(Posted{std::move(fn), posted});
  wake_.Notify();
}

void EventLoop::Every(absl::Duration period, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  timers_.push_back(Timer{period, clock_->Mono() + period, std::move(fn)});
  wake_.Notify();  // the waiting loop recomputes its deadline (under mu_: see Post)
}

void EventLoop::After(absl::Duration delay, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  timers_.push_back(Timer{delay, clock_->Mono() + delay, std::move(fn), /*once=*/true});
  wake_.Notify();
}

void EventLoop::RunSync(const std::function<void()>& fn) {
  absl::Notification done;
  bool posted = false;
  const absl::Time when = clock_->Mono();
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(Posted{[&] {
                                fn();
                                done.Notify();
                              },
                              when});
      posted = true;
      wake_.Notify();  // under mu_: see Post
    }
  }
  if (posted) done.WaitForNotification();
}

void EventLoop::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  wake_.Notify();
}

void EventLoop::StopAndJoin() {
  Stop();
  if (!InLoop() && thread_.joinable()) thread_.join();
}

void EventLoop::CheckInLoop(const char* what) const {
  const std::thread::id loop = loop_id_.load(std::memory_order_acquire);
  if (loop == std::thread::id() || loop == std::this_thread::get_id()) return;
  std::fprintf(stderr,
               "trainctl: %s called off its event loop's thread while the loop runs; aborting\n",
               what);
  std::abort();
}

void EventLoop::Run() {
  loop_id_.store(std::this_thread::get_id(), std::memory_order_release);
  struct Exited {
    std::atomic<std::thread::id>* id;
    ~Exited() { id->store(std::thread::id(), std::memory_order_release); }
  } exited{&loop_id_};
  while (true) {
    std::function<void()> next;
    TaskKind kind = TaskKind::kPosted;
    absl::Time due;  // posted, or the timer's due time
    {
      absl::MutexLock lock(&mu_);
      // Sleep until new work, stop, a timer added (its deadline may be
      // sooner) or the next timer; nothing else wakes an idle loop. The
      // generation is read under mu_, so whatever changes after it is seen
      // (WakeSignal); the wait runs on the monotonic clock, so a wall clock
      // stepped back does not hold timers up, nor does one stepped forward
      // fire them early.
      while (!stopping_ && queue_.empty()) {
        absl::Time deadline = absl::InfiniteFuture();
        for (const Timer& t : timers_) deadline = std::min(deadline, t.next);
        const absl::Time now = clock_->Mono();
        if (deadline <= now) break;
        const uint64_t seen = wake_.generation();
        mu_.Unlock();
        wake_.WaitUntil(seen, deadline, *clock_);
        mu_.Lock();
      }
      if (stopping_) {
        // Run what RunSync callers wait for? They are notified by their own
        // closure; drop the queue and release them by running nothing:
        // RunSync refuses new work once stopping_ is set, and anything queued
        // before is executed below so no waiter hangs.
        while (!queue_.empty()) {
          std::function<void()> fn = std::move(queue_.front().fn);
          queue_.pop_front();
          mu_.Unlock();
          fn();
          mu_.Lock();
        }
        return;
      }
      // A due timer goes first: lease expiry and hang detection must not
      // wait for a flood of posted work to drain.
      absl::Time now = clock_->Mono();
      for (auto it = timers_.begin(); it != timers_.end(); ++it) {
        if (it->next > now) continue;
        kind = TaskKind::kTimer;
        due = it->next;
        if (it->once) {
          next = std::move(it->fn);
          timers_.erase(it);
        } else {
          it->next = now + it->period;
          next = it->fn;
        }
        break;
      }
      if (!next && !queue_.empty()) {
        next = std::move(queue_.front().fn);
        due = queue_.front().posted;
        queue_.pop_front();
      }
    }
    if (next) {
      const absl::Time start = clock_->Mono();
      next();
      const int k = static_cast<int>(kind);
      wait_[k].Observe(std::max(absl::ZeroDuration(), start - due));
      run_[k].Observe(clock_->Mono() - start);
    }
  }
}

}  // namespace trainctl

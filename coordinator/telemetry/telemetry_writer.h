// A thread of its own for the telemetry group commit's store transaction
// (TelemetryTables::AppendGroup), so that the coordinator's loop does not
// wait while it commits: on SQLite the commit is an fsync, on PostgreSQL a
// few network round trips and the server's fsync, and measured at 1,000
// ranks of telemetry beside 10,000 heartbeating workers the loop spent
// that time blocked, with every heartbeat behind it (bench/RESULTS.md,
// "Coordinator at scale"). The telemetry batcher (coordinator/api/
// telemetry_batcher.h) hands it one group at a time and hears how it went
// on the loop, after the commit: acknowledgement still follows durability.
//
// One write at a time: Start when !busy(). When the write returns, its
// `done` runs on the loop (posted there), or at once inside Wait, for a
// caller on the loop that must know the outcome before it goes on.
//
// Threading: Start, Wait and busy are loop-only (kLoop); the writer's
// thread runs only the write; the two meet under mu_. The loop must be
// stopped (EventLoop::StopAndJoin) before the writer is destroyed: a done
// posted to a running loop refers to it.
#pragma once

#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "coordinator/core/on_loop.h"

namespace trainctl::coordinator {

class TelemetryWriter {
 public:
  using Write = std::function<absl::Status()>;
  using Done = std::function<void(const absl::Status&)>;

  // `loop` (null in unit tests: only Wait runs a done) is where each done runs.
  explicit TelemetryWriter(EventLoop* loop);
  // Finishes the write in progress (its done does not run), then joins.
  ~TelemetryWriter();
  TelemetryWriter(const TelemetryWriter&) = delete;
  TelemetryWriter& operator=(const TelemetryWriter&) = delete;

  // Runs `write` on the writer's thread; then `done` with its status, on
  // the loop. Requires !busy().
  void Start(Write write, Done done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A write was started and its done has not run yet.
  bool busy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return busy_; }
  // Waits for the write in progress and runs its done now (nothing when
  // none is). Blocks the loop for the rest of one commit.
  void Wait() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  void Run();
  // Runs the finished write's done (nothing when it has not finished, or
  // Wait ran it already).
  void Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return write_ != nullptr || stopping_; }
  bool Finished() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return result_.has_value(); }

  EventLoop* const loop_;
  bool busy_ ABSL_GUARDED_BY(kLoop) = false;
  Done done_ ABSL_GUARDED_BY(kLoop);

  mutable absl::Mutex mu_;
  // Set by Start, taken by the thread when it begins the write.
  Write write_ ABSL_GUARDED_BY(mu_);
  // Set by the thread when the write returned; taken by Complete.
  std::optional<absl::Status> result_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the fields above exist
};

}  // namespace trainctl::coordinator

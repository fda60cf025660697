// Group commit of the sequenced metrics and logs that worker sessions
// receive (see TelemetryBatcher below). WorkerServiceImpl owns one; every
// WorkerSession queues into it.
//
// Threading: loop only (Queue, Drain, and the TelemetrySession callbacks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/api/services.h"
#include "coordinator/core/on_loop.h"

namespace trainctl::coordinator {

// What a session must hear once its queued telemetry is applied or not.
class TelemetrySession {
 public:
  virtual ~TelemetrySession() = default;
  // Committed: acknowledge the worker's applied seq.
  virtual void TelemetryApplied() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // Not applied (a store failure): `msgs` are the session's messages of the
  // failed batch, in the order it sent them; the session holds them and
  // retries (WorkerSession::Hold), the worker keeps them unacknowledged.
  virtual void TelemetryNotApplied(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

// Group commit of sequenced metric and log messages. Applying each in its
// own transaction costs one fsync per message on the loop thread, and at a
// thousand ranks the loop spends its time waiting on the disk (heartbeats
// answered seconds late). Instead a session queues them here; one drain
// closure applies every queued message, of every worker, in one store group
// (TelemetryLedger::ApplyBatch) and acknowledges each session after the one
// commit. Acknowledgement still follows durability. Whatever else a session
// handles (any other report, registration, its end) drains first, so each
// worker's messages are applied in the order it sent them.
//
// Loop only.
class TelemetryBatcher {
 public:
  explicit TelemetryBatcher(ServiceContext ctx) : ctx_(ctx) {}

  void Queue(TelemetrySession* session, const std::string& worker_id, v1::WorkerMessage msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    ctx_.loop->CheckInLoop("TelemetryBatcher");
    queue_.push_back({session, worker_id, std::move(msg)});
    if (!drain_posted_) {
      drain_posted_ = true;
      ctx_.loop->Post([this] {
        AssertOnLoop(ctx_.loop, "TelemetryBatcher");
        Drain();
      });
    }
  }
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  struct Queued {
    TelemetrySession* session;
    std::string worker_id;
    v1::WorkerMessage msg;
  };
  ServiceContext ctx_;
  std::vector<Queued> queue_ ABSL_GUARDED_BY(kLoop);
  bool drain_posted_ ABSL_GUARDED_BY(kLoop) = false;
};

}  // namespace trainctl::coordinator

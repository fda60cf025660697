// Fetches in flight (trainctl fetch): which worker's FileChunk answers which
// client stream. The coordinator asks a worker for one piece at a time
// (ReadFile on its Session) and asks for the next only after the client took
// the last one, so a fetch holds at most one piece in memory and a slow
// client slows only its own fetch.
//
// Called by the FetchArtifact stream (artifact_fetch_service.cc), the Session streams
// (answers, a worker's end) and the coordinator's periodic check (answers
// that never come). Not thread-safe: runs on the coordinator's EventLoop.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/workers/worker_registry.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

// The client side of a fetch. Loop only.
class FetchSink {
 public:
  virtual ~FetchSink() = default;
  // The worker's answer to this sink's request.
  virtual void OnPiece(const v1::FileChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // No answer will come (the worker left, or did not answer in time).
  virtual void OnFailed(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

class ArtifactFetches {
 public:
  ArtifactFetches(WorkerRegistry* registry, const Clock* clock, absl::Duration answer_timeout)
      : registry_(registry), clock_(clock), answer_timeout_(answer_timeout) {}

  // Sends `worker` a ReadFile for `sink` (one request per sink at a time).
  // Unavailable when the worker has no open session.
  absl::Status Request(const std::string& worker, v1::ReadFile req, FetchSink* sink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // A worker's answer: to its sink, if the request is still open and was
  // sent to that worker (anything else is dropped).
  void OnChunk(const std::string& worker, const v1::FileChunk& chunk)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The worker's session ended: its open requests fail (Unavailable).
  void WorkerGone(const std::string& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Requests unanswered past answer_timeout fail (DeadlineExceeded).
  void Expire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Forgets `sink`'s open request (its stream ended).
  void Cancel(FetchSink* sink) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  size_t open() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return open_.size(); }

 private:
  struct Open {
    std::string worker;
    FetchSink* sink;
    absl::Time deadline;
  };
  WorkerRegistry* const registry_;
  const Clock* const clock_;
  const absl::Duration answer_timeout_;
  int64_t next_id_ ABSL_GUARDED_BY(kLoop) = 1;
  absl::flat_hash_map<int64_t, Open> open_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator

// Fans job updates (state snapshots, events, metric batches) and log chunks
// out to every WatchJob / GetLogs(follow) stream of that job.
//
// Subscribers are the stream reactors; Offer() must never block (each keeps
// a bounded queue and skips ahead when its reader is slow), so a slow
// watcher can never stall ingestion or the other watchers. History comes
// from the StateStore; the service sends it and subscribes in the same loop
// turn, with every committed telemetry group published
// (TelemetryBatcher::ReadPublished), so a watcher sees no gap and no
// duplicate.
//
// Not thread-safe: runs on the coordinator's EventLoop. Subscribers must
// Unsubscribe (on the loop) before they are destroyed.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "coordinator/core/on_loop.h"
#include "trainctl/v1/job_service.pb.h"
#include "trainctl/v1/metrics.pb.h"

namespace trainctl::coordinator {

class JobSubscriber {
 public:
  virtual ~JobSubscriber() = default;
  // Non-blocking hand-off of one update.
  virtual void Offer(const v1::JobUpdate& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // The job ended: send what is queued, then close the stream.
  virtual void JobEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

class LogSubscriber {
 public:
  virtual ~LogSubscriber() = default;
  // Non-blocking; the subscriber filters by rank/attempt itself.
  virtual void Offer(const v1::LogChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  virtual void JobEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

class MetricsHub {
 public:
  void Subscribe(const std::string& job_id, JobSubscriber* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    jobs_[job_id].push_back(s);
  }
  void Unsubscribe(const std::string& job_id, JobSubscriber* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void SubscribeLogs(const std::string& job_id, LogSubscriber* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    logs_[job_id].push_back(s);
  }
  void UnsubscribeLogs(const std::string& job_id, LogSubscriber* s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  void Publish(const std::string& job_id, const v1::JobUpdate& update)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  void PublishLogs(const v1::LogChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Tells every subscriber of the job that it ended and forgets them.
  void JobEnded(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  size_t watcher_count(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  absl::flat_hash_map<std::string, std::vector<JobSubscriber*>> jobs_ ABSL_GUARDED_BY(kLoop);
  absl::flat_hash_map<std::string, std::vector<LogSubscriber*>> logs_ ABSL_GUARDED_BY(kLoop);
};

}  // namespace trainctl::coordinator

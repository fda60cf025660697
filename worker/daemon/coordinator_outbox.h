// The daemon's one way to the coordinator, as its rank table sees it: a
// DaemonSession in the daemon, a recording fake in the rank table's tests.
#pragma once

#include <cstdint>
#include <string>

#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::worker {

class CoordinatorOutbox {
 public:
  virtual ~CoordinatorOutbox() = default;
  // Queues a message for the coordinator; any thread. Heartbeats, goodbyes
  // and file chunks go once (dropped while disconnected unless `critical`);
  // every other kind is sequenced telemetry, kept until the coordinator
  // acknowledges it and resent after a reconnect, whatever `critical` says.
  // False when the message was dropped.
  virtual bool Send(v1::WorkerMessage msg, bool critical) = 0;
  // The id the coordinator knows this worker by ("" until registered once).
  virtual std::string worker_id() = 0;
};

// Names the rank a report is about (job, attempt, rank): RankStatus,
// RankProgress, CheckpointReport, FinalModelReport, LogChunk.
template <typename Report>
Report* AboutRank(Report* report, const std::string& job_id, int32_t attempt, int32_t rank) {
  report->set_job_id(job_id);
  report->set_attempt(attempt);
  report->set_rank(rank);
  return report;
}

}  // namespace trainctl::worker

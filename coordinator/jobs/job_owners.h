// The job owners, built and wired in one place: the coordinator
// (server/coordinator_server.cc) and the JobManager tests
// (job_manager_fixture.h) both build them here, so what the tests run is
// what the coordinator runs (docs/architecture.md, "Wiring").
//
//   JobBook         ← store, hub, clock
//   OwnerNumbers    ← store
//   JobManager      ← the owners below it uses (JobManagerParts)
//   AttemptStarter  ← book, registry, manager (its JobActions), owner numbers
//   JobPlacer       ← book, registry, starter, store
//   TelemetryIngest ← book, store, hub
//   JobHealth       ← book, registry, manager (its JobActions)
//   JobQueries      ← book, registry, placer, health, store
//
// Callers use each owner directly: the services and the dashboard get the
// ones they call through their contexts. Not thread-safe: every owner runs
// on the coordinator's EventLoop (BindToLoop).
#pragma once

#include "common/clock.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/jobs/attempt_starter.h"
#include "coordinator/jobs/job_book.h"
#include "coordinator/jobs/job_health.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_placer.h"
#include "coordinator/jobs/job_queries.h"
#include "coordinator/jobs/owner_numbers.h"
#include "coordinator/jobs/telemetry_ingest.h"
#include "coordinator/store/state_store.h"
#include "coordinator/telemetry/metrics_hub.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {

struct JobOwners {
  // `store`, `registry`, `hub` and `clock` outlive the owners.
  JobOwners(StateStore* store, WorkerRegistry* registry, MetricsHub* hub, const Clock* clock,
            const JobManagerOptions& options);
  JobOwners(const JobOwners&) = delete;
  JobOwners& operator=(const JobOwners&) = delete;

  // Every call must then come from `loop` (checked at run time, in every build).
  void BindToLoop(const EventLoop* loop) { book.BindToLoop(loop); }
  // A snapshot for /metrics (O(jobs + attempts)): JobQueries' gauges with
  // the JobManager's count of stale reports refused.
  JobGauges Gauges() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  // In the order they are built (each takes those above it; the JobManager
  // also takes pointers to those below it, used only once they are built).
  JobBook book;
  OwnerNumbers owner_numbers;
  JobManager manager;
  AttemptStarter starter;
  JobPlacer placer;
  TelemetryIngest ingest;
  JobHealth health;
  JobQueries queries;
};

}  // namespace trainctl::coordinator

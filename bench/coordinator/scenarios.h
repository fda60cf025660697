// The scenarios of trainctl-bench-coordinator, one per --mode (main.cc
// dispatches on it): each runs against the coordinator at --target, reports
// its results with Put and returns the process's exit status.
#pragma once

namespace trainctl::bench {

int RunHeartbeat();     // scenario_heartbeat.cc
int RunJobs();          // scenario_jobs.cc
int RunFailure();       // scenario_failure.cc
int RunTelemetry();     // scenario_telemetry.cc
int RunSingleWorker();  // scenario_single_worker.cc

}  // namespace trainctl::bench

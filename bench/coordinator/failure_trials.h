// Failure-detection trials, run by --mode=failure and under the load of
// --mode=heartbeat: workers running a job die, either in-process (stream
// cancelled) or as SIGKILLed child processes (--mode=single_worker), and the
// time until the coordinator fails the job's attempt is measured.
#pragma once

#include <string>

#include "bench/coordinator/bench_support.h"
#include "bench/coordinator/hub.h"

namespace trainctl::bench {

struct FailureStats {
  Dist from_cut, from_last_hb;
  int failed = 0, restarting = 0, undetected = 0, not_running = 0;
  std::string sample_reason;
};

// Runs `count` trials, `batch` at a time. process=true: SIGKILLed child
// processes; false: in-process streams cancelled.
void RunFailureTrials(Hub& hub, int count, int batch, bool process, bool cuda,
                      const std::string& tag, FailureStats& st);

// Reports the trials' latencies and outcomes under `key`.
void ReportFailure(const std::string& key, FailureStats& st);

}  // namespace trainctl::bench

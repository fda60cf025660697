// --mode=failure: time from a worker's death to its job's attempt failing,
// (a) session streams cancelled, (b) single_worker processes SIGKILLed.
#include "absl/flags/flag.h"
#include "bench/coordinator/failure_trials.h"
#include "bench/coordinator/hub.h"
#include "bench/coordinator/scenarios.h"

namespace trainctl::bench {

int RunFailure() {
  const int64_t hb_ns = int64_t{absl::GetFlag(FLAGS_heartbeat_ms)} * 1000000;
  Hub hub(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_channels), hb_ns);
  const int batch = absl::GetFlag(FLAGS_batch);
  FailureStats cut, killed;
  RunFailureTrials(hub, absl::GetFlag(FLAGS_trials_cut), batch, false, false, "cut", cut);
  ReportFailure("stream_cut", cut);
  RunFailureTrials(hub, absl::GetFlag(FLAGS_trials_kill), batch, true, false, "kill", killed);
  ReportFailure("sigkill", killed);
  hub.StopTicker();
  return 0;
}

}  // namespace trainctl::bench

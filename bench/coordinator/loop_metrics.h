// The coordinator's loop-stall histograms (/metrics:
// trainctl_loop_task_wait_seconds and trainctl_loop_task_run_seconds, each
// by kind, posted | timer), read over HTTP at the start and the end of a
// scenario's steady window: where the loop's time goes before anything is
// changed (issue #49 item 3).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainctl::bench {

// Cumulative bucket counts by histogram ("posted.wait", "timer.run", ...):
// (upper bound in seconds, count), bounds ascending, +Inf last.
using LoopHists = std::map<std::string, std::vector<std::pair<double, double>>>;

// The histograms now; empty when --metrics_address is unset or the page
// cannot be read (said once on stderr).
LoopHists SnapLoopHists();

// Parses the histograms out of a /metrics page.
LoopHists ParseLoopHists(const std::string& page);

// For each histogram, what was added from `a` to `b`, as
// `loop.<kind>.<wait|run>.{n,p50_ms,p99_ms,p999_ms}`: the count and each
// quantile as the upper bound of the bucket it falls in (ms; -1 past the
// last finite bound).
void ReportLoopHists(const LoopHists& a, const LoopHists& b);

}  // namespace trainctl::bench

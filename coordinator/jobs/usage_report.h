// Accounting (docs/queues.md, `trainctl usage`): the slot-seconds the jobs'
// attempts held, summed per queue, owner and slot kind. Derived from the
// attempts every job already records (start and end time, ranks and their
// slots), so it needs no table of its own and survives a coordinator
// restart with the jobs.
//
// An attempt holds its ranks' slots from its start_time to its end_time
// (or `until` while it runs). start_time is set when the attempt is placed,
// so the time its ranks take to start counts too (the slots were taken
// from everyone else then), also for an attempt whose ranks never ran. An
// attempt without a start_time or ranks (none is recorded so) counts
// nothing. Only the part within [since, until] counts.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::coordinator {

struct UsageFilter {
  // Empty: every queue / owner.
  std::string queue;
  std::string owner;
  absl::Time since = absl::InfinitePast();
  // The end of the window: attempts still running count up to it (the
  // caller passes now).
  absl::Time until;
};

struct UsageRow {
  std::string queue;
  std::string owner;
  // "gpu" or "cpu".
  std::string kind;
  double slot_seconds = 0;
  // Attempts and jobs that contributed (some time within the window).
  int attempts = 0;
  int jobs = 0;
};

// A report over the window [since, until] (JobQueries::Usage, GetUsage).
struct UsageReport {
  std::vector<UsageRow> rows;
  absl::Time since = absl::InfinitePast();
  absl::Time until;
};

// Rows ordered by queue, owner, kind; only rows with an attempt in the window.
std::vector<UsageRow> SumUsage(const std::vector<const v1::Job*>& jobs, const UsageFilter& filter);

}  // namespace trainctl::coordinator

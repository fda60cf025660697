// Accounting (docs/queues.md, docs/operator.md "billing", `trainctl
// usage`): per attempt, the billing record (v1.AttemptUsage), and the
// records summed per queue, owner, slot kind or job.
//
// An attempt holds its ranks' slots from its start_time (set when it is
// placed, so the time its ranks take to start counts too: the slots were
// taken from everyone else then) until its last rank exited: the grace a
// preempted or cancelled attempt's ranks take to stop is charged, as the
// scheduler keeps their slots taken until then. Once an ended attempt's
// last rank exited the JobBook stores its record (StateStore
// attempt_usage, with the ranks' cgroup CPU time and peak memory); an
// attempt still running, or still stopping, is computed from the job and
// counts up to `until`. An attempt that ended before the table existed
// (no stored record) ends at its end_time. An attempt without a start_time
// or ranks counts nothing. Sums count only the part within [since, until].
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/queue.pb.h"

namespace trainctl::coordinator {

struct UsageFilter {
  // Empty: every queue / owner.
  std::string queue;
  std::string owner;
  absl::Time since = absl::InfinitePast();
  // The end of the window: attempts still running count up to it (the
  // caller passes now).
  absl::Time until = absl::InfiniteFuture();
  // How rows are grouped (UsageGrouping: default queue, owner and kind).
  v1::UsageGrouping by = v1::USAGE_GROUPING_UNSPECIFIED;
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
  // USAGE_GROUPING_JOB only.
  std::string job_id;
  // slot_seconds of GPU slots; the attempts' wall time within the window.
  double gpu_seconds = 0;
  double wall_seconds = 0;
  // Summed / highest over the attempts that reported them (whole attempts,
  // not clipped to the window); 0 = none did.
  double cpu_seconds = 0;
  int64_t peak_memory_bytes = 0;
};

// One rank's figures from its exit report (RankStatus.cpu_seconds,
// peak_memory_bytes); 0 = unknown.
struct RankFigures {
  double cpu_seconds = 0;
  int64_t peak_memory_bytes = 0;
};

// A report over the window [since, until] (JobQueries::Usage, GetUsage).
struct UsageReport {
  std::vector<UsageRow> rows;
  // USAGE_GROUPING_ATTEMPT: every attempt with time in the window (rows
  // empty then).
  std::vector<v1::AttemptUsage> attempts;
  absl::Time since = absl::InfinitePast();
  absl::Time until;
};

// Whether `a` ended (it has an end_time) and every rank of it exited: its
// record is final.
bool AttemptSettled(const v1::Attempt& a);

// The record of attempt `a` of `job`. Settled: it ends at `end` (when its
// last rank's exit was applied); `figures` are per rank index (shorter or
// empty: unknown). Not settled: it runs to `end` (the caller's until) and
// end_time stays unset.
v1::AttemptUsage AttemptUsageOf(const v1::Job& job, const v1::Attempt& a, absl::Time end,
                                bool settled, const std::vector<RankFigures>& figures);

// Every attempt whose time overlaps the window and matches the filter's
// queue and owner, ordered by start time, job id, attempt: the `stored`
// records, and for each attempt of `jobs` without one a record computed
// from the job (AttemptUsageOf; running ones up to `until`).
std::vector<v1::AttemptUsage> CollectAttempts(const std::vector<const v1::Job*>& jobs,
                                              const std::vector<v1::AttemptUsage>& stored,
                                              const UsageFilter& filter);

// `attempts` (CollectAttempts) summed per filter.by (not ATTEMPT), their
// slot, GPU and wall time clipped to the window. Ordered by queue, owner,
// kind (by job: job id, kind); only rows with time in the window.
std::vector<UsageRow> SumAttempts(const std::vector<v1::AttemptUsage>& attempts,
                                  const UsageFilter& filter);

// SumAttempts(CollectAttempts(jobs, {}, filter), filter).
std::vector<UsageRow> SumUsage(const std::vector<const v1::Job*>& jobs, const UsageFilter& filter);

}  // namespace trainctl::coordinator

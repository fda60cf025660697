#include "coordinator/jobs/attempt_failure.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/time_util.h"
#include "coordinator/artifacts/checkpoint_records.h"

namespace trainctl::coordinator {
namespace {

constexpr int kMaxLogLinesInReason = 5;

// Kinds that fail the job at once: a restart would meet the same problem.
struct NotRestarted {
  v1::FailureKind kind;
  const char* reason_note;  // appended to the job's reason, in parentheses
  const char* event;        // the `failed` event's message
};
constexpr NotRestarted kNotRestarted[] = {
    {v1::FAILURE_KIND_OUT_OF_MEMORY,
     "out of memory: not restarted; the same batch needs the same memory",
     "out of memory; lower data.batch_size"},
    {v1::FAILURE_KIND_PROCESS_LIMIT,
     "process limit: not restarted; the same program starts as many processes",
     "process limit reached; raise resources.pids"},
    {v1::FAILURE_KIND_DATA, "a data error: not restarted", "data error; restarting cannot help"},
    {v1::FAILURE_KIND_PREFLIGHT, "pre-flight: not restarted",
     "pre-flight failed; fix what it names and submit again"},
    {v1::FAILURE_KIND_CONFIG, "a configuration or data error: not restarted",
     "configuration or data error; restarting cannot help"},
};

void FailJob(v1::Job& next, std::vector<JobEvent>& events, int32_t attempt, std::string reason,
             std::string event) {
  next.set_state(v1::JOB_STATE_FAILED);
  next.set_state_reason(std::move(reason));
  events.push_back({"failed", std::move(event), attempt});
}

// NaN/Inf: a rollback to the newest checkpoint that skips the bad step, on
// its own budget (health.max_rollbacks), not restart.max_restarts.
void ApplyNanPolicy(v1::Job& next, std::vector<JobEvent>& events, const v1::Attempt& a,
                    const std::string& reason, int failed_rank) {
  const v1::HealthSpec& health = next.spec().health();
  const int32_t max_rollbacks = health.max_rollbacks();
  const int64_t nan_step = NanStep(a);
  int32_t used = 0;
  for (const v1::Attempt& x : next.attempts()) {
    if (&x != &a && x.failure_kind() == v1::FAILURE_KIND_NAN) ++used;
  }
  if (health.on_nan() == v1::HealthSpec::ON_NAN_FAIL) {
    FailJob(next, events, a.number(), absl::StrCat(reason, "\n(health.on_nan: fail)"),
            absl::StrCat("NaN/Inf at step ", nan_step, "; health.on_nan: fail"));
    return;
  }
  if (used >= max_rollbacks) {
    FailJob(next, events, a.number(),
            absl::StrCat(reason, "\n(no rollbacks left: ", used, " of ", max_rollbacks, " used)"),
            absl::StrCat("NaN/Inf at step ", nan_step,
                         "; no rollbacks left (health.max_rollbacks: ", max_rollbacks, ")"));
    return;
  }
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_state_reason(absl::StrCat("rolling back after: ", reason));
  const std::vector<const v1::CheckpointRecord*> newest_records = NewestRecords(next);
  const v1::CheckpointRecord* newest = newest_records.empty() ? nullptr : newest_records.front();
  events.push_back(
      {"rollback",
       absl::StrCat(
           "NaN/Inf at step ", nan_step, ": rolling back to ",
           newest != nullptr ? absl::StrCat("the checkpoint at step ", newest->global_step())
                             : std::string("the start (no checkpoint recorded yet)"),
           " and skipping step ", nan_step, " (rollback ", used + 1, " of ", max_rollbacks, ")"),
       a.number(), failed_rank});
}

// The checkpoint the attempt resumed from could not be read: forget that
// record and go on from the next older one, or from scratch; not counted as
// a restart (each fallback forgets a record, so it ends). A checkpoint of
// another job (resume_from) is what the user asked for: the job fails.
void ApplyResumeFallback(v1::Job& next, std::vector<JobEvent>& events, const v1::Attempt& a,
                         const std::string& reason) {
  if (!a.has_resume() || a.resume().job_id() != next.id()) {
    FailJob(next, events, a.number(),
            absl::StrCat(reason, "\n(the checkpoint it resumes from",
                         a.has_resume() ? absl::StrCat(", of job ", a.resume().job_id(), ",")
                                        : std::string(),
                         " cannot be read: not restarted)"),
            "the checkpoint to resume from cannot be read; restarting cannot help");
    return;
  }
  const v1::CheckpointRecord bad = a.resume();
  google::protobuf::RepeatedPtrField<v1::CheckpointRecord> kept;
  for (const v1::CheckpointRecord& r : next.checkpoints()) {
    if (!SameCopy(r, bad)) *kept.Add() = r;
  }
  *next.mutable_checkpoints() = std::move(kept);
  const std::vector<const v1::CheckpointRecord*> newest_records = NewestRecords(next);
  const v1::CheckpointRecord* newest = newest_records.empty() ? nullptr : newest_records.front();
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_state_reason(absl::StrCat("falling back after: ", reason));
  events.push_back(
      {"resume_fallback",
       absl::StrCat(DescribeRecord(bad), " (", bad.path(), ") could not be read; forgotten: ",
                    newest != nullptr
                        ? absl::StrCat("the next attempt resumes from the checkpoint at step ",
                                       newest->global_step())
                        : std::string("the next attempt starts from scratch (no older checkpoint)"),
                    " (not counted as a restart)"),
       a.number()});
}

// Every other kind: fail the job when the kind or the budget says so, else
// restart it.
void ApplyRestartPolicy(v1::Job& next, std::vector<JobEvent>& events, int32_t attempt,
                        v1::FailureKind kind, const std::string& reason,
                        absl::Duration first_backoff, absl::Time now) {
  // What to do next, when the job has a checkpoint to go on from: `resume`
  // (a new submit would start from scratch).
  const std::string resume = next.checkpoints_size() > 0
                                 ? absl::StrCat("; then `trainctl resume ", next.id(),
                                                "` goes on from its newest checkpoint")
                                 : "";
  for (const NotRestarted& n : kNotRestarted) {
    if (n.kind != kind) continue;
    std::string event = n.event;
    if (kind == v1::FAILURE_KIND_PREFLIGHT && !resume.empty()) {
      event = absl::StrCat("pre-flight failed; fix what it names", resume);
    }
    return FailJob(next, events, attempt, absl::StrCat(reason, "\n(", n.reason_note, ")"),
                   std::move(event));
  }
  // A full disk waits for space: space comes back by itself (a cleanup, a
  // quota raised, another job's checkpoints pruned). Restarted after a
  // backoff (DiskFullBackoff), not counted as a restart, until the first
  // DISK_FULL of the run ended restart.disk_full_wait_s ago; with no wait,
  // the same failure twice in a row fails the job.
  const int n = next.attempts_size();
  if (kind == v1::FAILURE_KIND_DISK_FULL) {
    const int32_t wait_s = next.spec().restart().has_disk_full_wait_s()
                               ? next.spec().restart().disk_full_wait_s()
                               : kDefaultDiskFullWaitS;
    int first = n - 1;
    while (first > 0 && next.attempts(first - 1).failure_kind() == v1::FAILURE_KIND_DISK_FULL)
      --first;
    const absl::Duration waited = now - FromTimestamp(next.attempts(first).end_time());
    if (wait_s == 0 ? first < n - 1 : waited >= absl::Seconds(wait_s)) {
      const std::string how =
          wait_s == 0
              ? std::string(
                    "the disk was full in the previous attempt too (restart.disk_full_wait_s: 0)")
              : absl::StrCat("no space for ",
                             absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))),
                             " (restart.disk_full_wait_s: ", wait_s, ")");
      return FailJob(
          next, events, attempt,
          absl::StrCat(reason, "\n(", how, ": not restarted again", resume, ")"),
          absl::StrCat("disk full: ", how, "; free space or change checkpoint.dir", resume));
    }
    if (wait_s > 0) {
      next.set_state(v1::JOB_STATE_RESTARTING);
      next.set_state_reason(absl::StrCat("waiting for space after: ", reason));
      events.push_back(
          {"waiting_for_space",
           absl::StrCat("disk full: the next attempt in ",
                        absl::FormatDuration(DiskFullBackoff(n - first)), " (",
                        absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))), " of ", wait_s,
                        " s waited; restart.disk_full_wait_s), not counted as a restart"),
           attempt});
      return;
    }
  }
  if (kind == v1::FAILURE_KIND_HANG && next.spec().restart().on_hang() == v1::HANG_POLICY_FAIL) {
    return FailJob(next, events, attempt, absl::StrCat(reason, "\n(restart.on_hang: fail)"),
                   "hung, and restart.on_hang is fail");
  }
  const int32_t max_restarts = next.spec().restart().max_restarts();
  if (next.restarts() >= max_restarts) {
    return FailJob(next, events, attempt,
                   absl::StrCat(reason, "\n(no restarts left: ", next.restarts(), " of ",
                                max_restarts, " used)"),
                   absl::StrCat("no restarts left (max_restarts: ", max_restarts, ")"));
  }
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_restarts(next.restarts() + 1);
  next.set_state_reason(absl::StrCat("restarting after: ", reason));
  events.push_back(
      {"restarting",
       absl::StrCat("restart ", next.restarts(), " of ", max_restarts,
                    first_backoff > absl::ZeroDuration()
                        ? absl::StrCat(" in ", absl::FormatDuration(
                                                   RestartBackoff(next.restarts(), first_backoff)))
                        : std::string(),
                    next.checkpoints_size() > 0 ? ", from the newest checkpoint it can reach"
                                                : ", from scratch (no checkpoint recorded yet)"),
       attempt});
}

}  // namespace

std::string DescribeExit(const v1::RankAssignment& r, const v1::ExitInfo& exit,
                         const std::string& cause) {
  std::string how;
  if (!cause.empty()) {
    how = "then failed";
  } else if (exit.signal() != 0) {
    how = absl::StrCat("was killed by signal ", exit.signal());
  } else if (exit.kind() == v1::FAILURE_KIND_WORKER_LOST) {
    how = "was lost with its worker";
  } else {
    how = absl::StrCat("exited with code ", exit.exit_code());
  }
  std::string out = absl::StrCat(cause, cause.empty() ? "" : "; ", "rank ", r.rank(), " on ",
                                 r.host(), " (worker ", r.worker_id(), ") ", how);
  // The worker's message may say again which rank and how it ended ("rank 1
  // exited with code 1: ValueError"): each is said once.
  absl::string_view message = exit.message();
  const bool names_rank = absl::ConsumePrefix(&message, absl::StrCat("rank ", r.rank(), " "));
  bool repeated = false;
  if (cause.empty()) {
    for (const std::string& said : {absl::StrCat("exited with code ", exit.exit_code()),
                                    absl::StrCat("killed by signal ", exit.signal())}) {
      absl::string_view rest = message;
      if (absl::ConsumePrefix(&rest, said) &&
          (rest.empty() || absl::StartsWith(rest, ": ") || absl::StartsWith(rest, " ("))) {
        message = rest;
        repeated = true;
        break;
      }
    }
  }
  if (repeated) {
    absl::StrAppend(&out, message);  // ": ValueError", " (Killed)", or nothing
  } else if (!exit.message().empty()) {
    absl::StrAppend(&out, ": ", names_rank ? absl::string_view(exit.message()) : message);
  }
  if (exit.last_log_lines_size() > 0) {
    int from = std::max(0, exit.last_log_lines_size() - kMaxLogLinesInReason);
    std::vector<std::string> lines(exit.last_log_lines().begin() + from,
                                   exit.last_log_lines().end());
    absl::StrAppend(&out, "\n  last log lines:\n    ", absl::StrJoin(lines, "\n    "));
  }
  return out;
}

absl::Duration RestartBackoff(int32_t restarts, absl::Duration first) {
  const absl::Duration cap = std::max(first, absl::Seconds(30));
  absl::Duration d = first;
  for (int32_t i = 1; i < restarts && d < cap; ++i) d *= 2;
  return std::min(d, cap);
}

absl::Duration WaitForSpaceBackoff(const v1::Job& job) {
  const int n = job.attempts_size();
  if (job.state() != v1::JOB_STATE_RESTARTING || n == 0 ||
      job.attempts(n - 1).failure_kind() != v1::FAILURE_KIND_DISK_FULL) {
    return absl::ZeroDuration();
  }
  int run = 1;
  while (run < n && job.attempts(n - 1 - run).failure_kind() == v1::FAILURE_KIND_DISK_FULL) ++run;
  return DiskFullBackoff(run);
}

int64_t NanStep(const v1::Attempt& a) {
  int64_t step = -1;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.exit().kind() == v1::FAILURE_KIND_NAN && (step < 0 || r.exit().step() < step))
      step = r.exit().step();
  }
  return step;
}

std::vector<int64_t> RollbackSkipSteps(const v1::Job& job) {
  std::vector<int64_t> steps;
  for (const v1::Attempt& a : job.attempts()) {
    steps.insert(steps.end(), a.skip_steps().begin(), a.skip_steps().end());
    if (a.failure_kind() != v1::FAILURE_KIND_NAN) continue;
    if (int64_t s = NanStep(a); s >= 0) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

RanksByWorker BuildAttemptFailure(v1::Job& next, std::vector<JobEvent>& events, absl::Time now,
                                  v1::FailureKind kind, const std::string& reason, int failed_rank,
                                  absl::Duration first_backoff) {
  v1::Attempt* a = CurrentAttempt(next);
  if (a == nullptr || AttemptEnded(a->state()) || IsTerminal(next.state())) return {};
  a->set_state(v1::ATTEMPT_STATE_FAILED);
  a->set_reason(reason);
  a->set_failure_kind(kind);
  SetTimestamp(now, a->mutable_end_time());
  RanksByWorker to_stop = LiveRanksByWorker(*a);
  events.push_back({"attempt_failed", reason, a->number(), failed_rank});
  if (kind == v1::FAILURE_KIND_NAN) {
    ApplyNanPolicy(next, events, *a, reason, failed_rank);
  } else if (kind == v1::FAILURE_KIND_RESUME) {
    ApplyResumeFallback(next, events, *a, reason);
  } else {
    ApplyRestartPolicy(next, events, a->number(), kind, reason, first_backoff, now);
  }
  return to_stop;
}

}  // namespace trainctl::coordinator

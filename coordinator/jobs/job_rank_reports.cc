// JobManager's reports from the ranks (see job_manager.h): a failed
// attempt, rank ends (held for a lost peer, replayed when due), the final
// model and checkpoint reports, and the checkpoint files dropped with them.
#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/artifacts/checkpoint_records.h"
#include "coordinator/core/retry_log.h"
#include "coordinator/jobs/attempt_failure.h"
#include "coordinator/jobs/job_manager.h"

namespace trainctl::coordinator {
namespace {

absl::Status ValidateRankStatus(const v1::RankStatus& st) {
  if (!v1::RankState_IsValid(st.state()) || st.state() == v1::RANK_STATE_UNSPECIFIED ||
      st.state() == v1::RANK_STATE_ASSIGNED) {
    return absl::InvalidArgumentError(
        "rank_status.state: must be STARTING, RUNNING or an end state");
  }
  if (!v1::FailureKind_IsValid(st.exit().kind())) {
    return absl::InvalidArgumentError("rank_status.exit.kind: unknown failure kind");
  }
  if (!std::isfinite(st.cpu_seconds()) || st.cpu_seconds() < 0) {
    return absl::InvalidArgumentError("rank_status.cpu_seconds: must be a finite number >= 0");
  }
  if (st.peak_memory_bytes() < 0)
    return absl::InvalidArgumentError("rank_status.peak_memory_bytes: must be >= 0");
  return absl::OkStatus();
}

absl::Status ValidateFinalModel(const v1::FinalModelReport& rep) {
  if (rep.path().empty() || rep.path()[0] != '/' || rep.path().size() > 4096 ||
      rep.path().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        "final_model.path: must be an absolute path of at most 4096 bytes");
  }
  if (rep.rank() != 0)
    return absl::InvalidArgumentError("final_model.rank: only rank 0 reports the final model");
  return absl::OkStatus();
}

// The attempt of `next` SUCCEEDED: the job with it.
void MarkSucceeded(v1::Job& next, v1::Attempt& a, absl::Time now) {
  a.set_state(v1::ATTEMPT_STATE_SUCCEEDED);
  SetTimestamp(now, a.mutable_end_time());
  next.set_state(v1::JOB_STATE_SUCCEEDED);
  next.set_state_reason("");
  next.mutable_progress()->set_eta_seconds(0);
}

}  // namespace

// --- failures and rank ends ----------------------------------------------------

absl::Status JobManager::FailAttempt(JobEntry& e, v1::Job next, std::vector<JobEvent> events,
                                     v1::FailureKind kind, const std::string& reason,
                                     int failed_rank) {
  const int32_t restarts_before = next.restarts();
  RanksByWorker to_stop = BuildAttemptFailure(next, events, clock_->Now(), kind, reason,
                                              failed_rank, options_.restart_backoff);
  const int32_t restarts = next.restarts();
  TRAINCTL_RETURN_IF_ERROR(book_->Commit(e, std::move(next), std::move(events)));
  // A counted restart waits its backoff (a rollback, a resume fallback or an
  // elastic resize does not).
  if (restarts > restarts_before && options_.restart_backoff > absl::ZeroDuration()) {
    e.restart_not_before = clock_->Mono() + RestartBackoff(restarts, options_.restart_backoff);
  }
  // Waiting for space: each new attempt (and its pre-flight) after a backoff.
  if (absl::Duration wait = WaitForSpaceBackoff(e.job); wait > absl::ZeroDuration()) {
    e.restart_not_before = clock_->Mono() + wait;
  }
  // A hung script's ranks write their Python stacks to their logs first
  // (docs/failures.md#hangs): a second is plenty for faulthandler.
  StopHow how;
  if (kind == v1::FAILURE_KIND_HANG && e.job.spec().has_command())
    how.stack_dump = absl::Seconds(1);
  starter_->StopAll(e.job.id(), CurrentAttempt(e.job)->number(), to_stop, "a peer rank failed",
                    how);
  return absl::OkStatus();
}

bool JobManager::SettleEndedAttempt(JobEntry& e) {
  if (!Unsettled(e.job)) return true;
  v1::Job next = e.job;
  v1::Attempt* a = CurrentAttempt(next);
  const v1::RankAssignment* failed = nullptr;
  for (const v1::RankAssignment& r : a->ranks()) {
    if (r.state() == v1::RANK_STATE_FAILED) {
      failed = &r;
      break;
    }
    if (r.state() != v1::RANK_STATE_SUCCEEDED && failed == nullptr) failed = &r;
  }
  absl::Status s;
  if (failed == nullptr) {
    MarkSucceeded(next, *a, clock_->Now());
    int32_t number = a->number();
    s = book_->Commit(e, std::move(next), {{"succeeded", "every rank finished training", number}});
  } else {
    std::string reason = DescribeExit(*failed, failed->exit());
    s = FailAttempt(e, std::move(next), {}, failed->exit().kind(), reason, failed->rank());
  }
  if (!s.ok()) {
    LogDeferred(s, "retried at the next tick");
    return false;
  }
  RequestSchedule();
  return true;
}

absl::Status JobManager::OnRankStatus(const std::string& worker_id, const v1::RankStatus& st) {
  absl::Status s = ApplyRankStatus(worker_id, st, /*may_hold=*/true);
  // UNAVAILABLE only comes from a failed write: memory is untouched, and the
  // worker will not send this again, so Tick replays it until it is stored.
  if (s.code() == absl::StatusCode::kUnavailable) HoldReport(worker_id, st, clock_->Now());
  return s;
}

void JobManager::HoldReport(const std::string& worker_id, const v1::RankStatus& st,
                            absl::Time due) {
  held_reports_[ReportKey(st.job_id(), st.attempt(), st.rank())] = HeldReport{worker_id, st, due};
}

std::optional<std::string> JobManager::LostPeer(const v1::Attempt& a,
                                                const std::string& except) const {
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.worker_id() == except || registry_->Connected(r.worker_id())) continue;
    const v1::Worker* w = registry_->Find(r.worker_id());
    return absl::StrCat("worker ", r.worker_id(), " (host ",
                        w != nullptr ? w->hostname() : r.host(), ") was lost");
  }
  return std::nullopt;
}

absl::Status JobManager::ApplyRankStatus(const std::string& worker_id, const v1::RankStatus& st,
                                         bool may_hold) {
  TRAINCTL_RETURN_IF_ERROR(ValidateRankStatus(st));
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e,
                            book_->ForWorker(worker_id, st.job_id(), st.attempt(), st.rank(),
                                             IsTerminal(st.state()), &a_mem));
  const bool current = st.attempt() == e->job.attempts_size();
  const v1::RankAssignment& r_mem = a_mem->ranks(st.rank());
  if (IsTerminal(r_mem.state())) return absl::OkStatus();  // Already ended (e.g. worker lost).
  // A report older than what is known (STARTING after RUNNING) changes nothing.
  if (!RankTransitionAllowed(r_mem.state(), st.state())) return absl::OkStatus();
  if (IsTerminal(st.state()) && (st.cpu_seconds() > 0 || st.peak_memory_bytes() > 0)) {
    // For the attempt's usage record (JobBook::Commit stores it).
    e->rank_figures[{st.attempt(), st.rank()}] =
        RankFigures{st.cpu_seconds(), st.peak_memory_bytes()};
  }
  v1::Job next = e->job;
  if (!current || IsTerminal(next.state()) || AttemptEnded(a_mem->state())) {
    return ApplyEndOfEndedAttempt(worker_id, st, *e, std::move(next));
  }
  const absl::Time now = clock_->Now();
  v1::RankAssignment* r = next.mutable_attempts(st.attempt() - 1)->mutable_ranks(st.rank());
  r->set_state(st.state());
  SetTimestamp(now, r->mutable_last_progress_time());
  e->progress_mono[st.rank()] = clock_->Mono();
  if (IsTerminal(st.state())) *r->mutable_exit() = st.exit();
  switch (st.state()) {
    case v1::RANK_STATE_STARTING:
      return book_->Commit(*e, std::move(next), {});
    case v1::RANK_STATE_RUNNING:
      return ApplyRankRunning(*e, std::move(next), now);
    case v1::RANK_STATE_SUCCEEDED:
      return ApplyRankSucceeded(*e, std::move(next), now);
    case v1::RANK_STATE_FAILED:
    case v1::RANK_STATE_STOPPED:
      return ApplyRankFailed(worker_id, st, *e, std::move(next), may_hold, now);
    default:
      return absl::InvalidArgumentError("rank_status.state: unexpected");
  }
}

absl::Status JobManager::ApplyEndOfEndedAttempt(const std::string& worker_id,
                                                const v1::RankStatus& st, JobEntry& e,
                                                v1::Job next) {
  if (!IsTerminal(st.state())) {
    starter_->Stop(worker_id, st.job_id(), st.attempt(), {st.rank()}, "attempt already ended");
    return absl::AbortedError(
        absl::StrCat("attempt ", st.attempt(), " of job ", st.job_id(), " ended"));
  }
  v1::RankAssignment* r = next.mutable_attempts(st.attempt() - 1)->mutable_ranks(st.rank());
  r->set_state(st.state() == v1::RANK_STATE_SUCCEEDED ? v1::RANK_STATE_SUCCEEDED
                                                      : v1::RANK_STATE_STOPPED);
  *r->mutable_exit() = st.exit();
  // A hung script's rank: the stacks it dumped as it was stopped (its log
  // lines went before its end) become an event beside the `hang` one.
  std::vector<JobEvent> events;
  if (std::vector<std::string> stacks =
          ingest_->TakeStackDump(st.job_id(), st.attempt(), st.rank());
      !stacks.empty()) {
    events.push_back(
        {"stacks",
         absl::StrCat("rank ", st.rank(), "'s Python stacks when the hang was found:\n",
                      absl::StrJoin(stacks, "\n")),
         st.attempt(), st.rank()});
  }
  TRAINCTL_RETURN_IF_ERROR(book_->Commit(e, std::move(next), std::move(events)));
  RequestSchedule();
  return absl::OkStatus();
}

absl::Status JobManager::ApplyRankRunning(JobEntry& e, v1::Job next, absl::Time now) {
  v1::Attempt* a = CurrentAttempt(next);
  const bool all =
      std::all_of(a->ranks().begin(), a->ranks().end(), [](const v1::RankAssignment& x) {
        return x.state() == v1::RANK_STATE_RUNNING || x.state() == v1::RANK_STATE_SUCCEEDED;
      });
  std::vector<JobEvent> events;
  if (all && a->state() == v1::ATTEMPT_STATE_STARTING) {
    a->set_state(v1::ATTEMPT_STATE_RUNNING);
    next.set_state(v1::JOB_STATE_RUNNING);
    next.set_state_reason("");
    // Hang detection counts from here for every rank.
    const absl::Time mono = clock_->Mono();
    for (v1::RankAssignment& x : *a->mutable_ranks()) {
      SetTimestamp(now, x.mutable_last_progress_time());
      e.progress_mono[x.rank()] = mono;
    }
    events.push_back(
        {"running", absl::StrCat("all ", a->ranks_size(), " ranks ready"), a->number()});
  }
  return book_->Commit(e, std::move(next), std::move(events));
}

absl::Status JobManager::ApplyRankSucceeded(JobEntry& e, v1::Job next, absl::Time now) {
  v1::Attempt* a = CurrentAttempt(next);
  const bool all = std::all_of(
      a->ranks().begin(), a->ranks().end(),
      [](const v1::RankAssignment& x) { return x.state() == v1::RANK_STATE_SUCCEEDED; });
  std::vector<JobEvent> events;
  if (all) {
    MarkSucceeded(next, *a, now);
    events.push_back({"succeeded", "every rank finished training", a->number()});
  }
  TRAINCTL_RETURN_IF_ERROR(book_->Commit(e, std::move(next), std::move(events)));
  if (all) RequestSchedule();
  return absl::OkStatus();
}

absl::Status JobManager::ApplyRankFailed(const std::string& worker_id, const v1::RankStatus& st,
                                         JobEntry& e, v1::Job next, bool may_hold, absl::Time now) {
  // The rank's end and the attempt's failure, in one write.
  const v1::Attempt& a = *CurrentAttempt(next);
  const v1::RankAssignment& r = a.ranks(st.rank());
  v1::FailureKind kind = st.exit().kind();
  std::string reason = DescribeExit(r, st.exit());
  if (st.state() == v1::RANK_STATE_FAILED &&
      (kind == v1::FAILURE_KIND_COLLECTIVE || kind == v1::FAILURE_KIND_RENDEZVOUS)) {
    if (std::optional<std::string> lost = LostPeer(a, worker_id)) {
      // A peer's death is the cause; this rank's error is its echo.
      reason = DescribeExit(r, st.exit(), *lost);
      kind = v1::FAILURE_KIND_WORKER_LOST;
    } else if (may_hold && options_.lost_worker_wait > absl::ZeroDuration() &&
               AttemptWorkers(a).size() > 1) {
      HoldReport(worker_id, st, now + options_.lost_worker_wait);
      return absl::OkStatus();
    }
  }
  TRAINCTL_RETURN_IF_ERROR(FailAttempt(e, std::move(next), {}, kind, reason, st.rank()));
  RequestSchedule();
  return absl::OkStatus();
}

// --- artifacts -------------------------------------------------------------------

absl::Status JobManager::RefuseIfStale(const absl::Status& s, const std::string& worker_id,
                                       const char* what, const std::string& job_id,
                                       int32_t attempt) {
  if (!absl::IsAborted(s)) return s;
  // Fencing: a report of an attempt that is not the job's current one (its
  // ranks ran on while their worker was cut off) never becomes a record.
  ++stale_reports_refused_;
  LogEvent(LogLevel::kWarn, "coordinator", "stale_report_refused",
           {{"worker_id", worker_id},
            {"what", what},
            {"job_id", job_id},
            {"attempt", absl::StrCat(attempt)},
            {"reason", std::string(s.message())}});
  return s;
}

absl::Status JobManager::OnFinalModel(const std::string& worker_id,
                                      const v1::FinalModelReport& rep) {
  TRAINCTL_RETURN_IF_ERROR(ValidateFinalModel(rep));
  v1::Attempt* a = nullptr;
  absl::StatusOr<JobEntry*> found = book_->ForWorker(worker_id, rep.job_id(), rep.attempt(),
                                                     rep.rank(), /*allow_stale=*/false, &a);
  if (!found.ok())
    return RefuseIfStale(found.status(), worker_id, "final_model", rep.job_id(), rep.attempt());
  JobEntry* e = *found;
  TRAINCTL_RETURN_IF_ERROR(
      CheckArtifactPath(e->job, rep.path(), /*final_model=*/true, "final_model.path"));
  e->final_model = rep;
  e->final_model_worker = worker_id;
  return absl::OkStatus();
}

absl::Status JobManager::OnCheckpoint(const std::string& worker_id,
                                      const v1::CheckpointReport& rep) {
  TRAINCTL_RETURN_IF_ERROR(ValidateReportedCheckpoint(rep.record()));
  v1::Attempt* a_mem = nullptr;
  absl::StatusOr<JobEntry*> found = book_->ForWorker(worker_id, rep.job_id(), rep.attempt(),
                                                     rep.rank(), /*allow_stale=*/false, &a_mem);
  if (!found.ok())
    return RefuseIfStale(found.status(), worker_id, "checkpoint", rep.job_id(), rep.attempt());
  JobEntry* e = *found;
  TRAINCTL_RETURN_IF_ERROR(CheckArtifactPath(e->job, rep.record().path(), /*final_model=*/false,
                                             "checkpoint.record.path"));
  v1::Job next = e->job;
  const bool shared = next.spec().checkpoint().shared();
  v1::CheckpointRecord r = rep.record();
  r.set_job_id(next.id());
  r.set_attempt(rep.attempt());
  r.set_world_size(a_mem->ranks_size());
  r.set_shared(shared);
  r.set_worker_id(shared ? "" : worker_id);
  r.set_reported_by(worker_id);  // a fetch asks this worker only
  r.set_spec_hash(CheckpointSpecHash(next.spec()));
  SetTimestamp(clock_->Now(), r.mutable_time());
  std::vector<v1::CheckpointRecord> dropped;
  std::string msg = AddCheckpointRecord(next, r, &dropped);
  TRAINCTL_RETURN_IF_ERROR(
      book_->Commit(*e, std::move(next), {{"checkpoint", msg, rep.attempt(), rep.rank()}}));
  // The files of the records checkpoint.keep no longer keeps go, deleted by
  // the worker that reported each (ranks delete none: fencing). A command
  // job's program owns its own files. Ordered only once the record that
  // makes them obsolete is stored (inside a telemetry group: after its
  // commit, never when it rolls back), so that a crash at any moment leaves
  // the newest stored checkpoint's files on disk.
  if (!e->job.spec().has_command() && !dropped.empty()) {
    book_->AfterCommit(
        [this, id = e->job.id(), dropped = std::move(dropped)]()
            ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { DropCheckpointFiles(id, dropped); });
  }
  placer_->MaybeGrow(*e, r);
  return absl::OkStatus();
}

void JobManager::DropCheckpointFiles(const std::string& job_id,
                                     const std::vector<v1::CheckpointRecord>& dropped) {
  std::map<std::string, v1::CoordinatorMessage> by_worker;
  for (const v1::CheckpointRecord& d : dropped) {
    const std::string& w = d.reported_by().empty() ? d.worker_id() : d.reported_by();
    if (w.empty()) continue;
    v1::DropCheckpoints* m = by_worker[w].mutable_drop_checkpoints();
    m->set_job_id(job_id);
    m->add_paths(d.path());
  }
  for (const auto& [w, msg] : by_worker) {
    if (registry_->Send(w, msg)) continue;
    std::deque<v1::CoordinatorMessage>& q = pending_drops_[w];
    q.push_back(msg);
    if (q.size() > kMaxPendingDrops) q.pop_front();
  }
}

}  // namespace trainctl::coordinator

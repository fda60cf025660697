#include "coordinator/jobs/job_manager.h"
#include "coordinator/core/retry_log.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/artifacts/checkpoint_records.h"
#include "coordinator/jobs/attempt_failure.h"

namespace trainctl::coordinator {
std::string JobManager::ReportKey(const std::string& job_id, int32_t attempt, int32_t rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

JobManager::JobManager(StateStore* store, WorkerRegistry* registry, const Clock* clock,
                       JobManagerOptions options, JobManagerParts parts)
    : clock_(clock),
      store_(store),
      options_(options),
      registry_(registry),
      book_(parts.book),
      owners_(parts.owners),
      starter_(parts.starter),
      placer_(parts.placer),
      ingest_(parts.ingest),
      health_(parts.health) {}

absl::Status JobManager::Recover(const StoreSnapshot& snapshot) {
  book_->Recover(snapshot);
  for (const auto& [id, e] : book_->entries()) RememberRequest(e.job);
  // Fair share's usage (docs/queues.md). A row that does not parse costs the
  // shares, not the start: usage is soft state that rebuilds within a
  // half-life.
  absl::StatusOr<v1::FairShareSnapshot> usage = store_->queues().LoadFairShare();
  if (absl::IsDataLoss(usage.status())) {
    LogEvent(LogLevel::kWarn, "coordinator", "fair_share_dropped",
             {{"error", std::string(usage.status().message())}});
    return absl::OkStatus();
  }
  if (!usage.ok()) return usage.status();
  placer_->RestoreUsage(*usage);
  return absl::OkStatus();
}

namespace {

std::string RequestKey(const std::string& owner, const std::string& request_id) {
  return absl::StrCat(owner.size(), ":", owner, "/", request_id);
}

absl::Status RequestIdError(const std::string& id) {
  if (id.size() > 128)
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", id.size(), " characters (at most 128)"));
  for (char c : id) {
    if (c < 0x21 || c > 0x7e)
      return absl::InvalidArgumentError("request_id: only printable ASCII without spaces");
  }
  return absl::OkStatus();
}

}  // namespace

void JobManager::RememberRequest(const v1::Job& job) {
  if (job.request_id().empty()) return;
  const absl::Time now = clock_->Now();
  if (now - FromTimestamp(job.submit_time()) >= kRequestIdLifetime) return;
  requests_[RequestKey(job.owner(), job.request_id())] = job.id();
  // Drop expired entries whenever the map has doubled since the last time.
  if (requests_.size() < 2 * std::max<size_t>(requests_pruned_at_, 512)) return;
  absl::erase_if(requests_, [&](const auto& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    const JobEntry* e = book_->Find(kv.second);
    return e == nullptr || now - FromTimestamp(e->job.submit_time()) >= kRequestIdLifetime;
  });
  requests_pruned_at_ = requests_.size();
}

// --- client API --------------------------------------------------------------

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec, const std::string& owner,
                                           const std::string& owner_token_id,
                                           const std::string& request_id) {
  if (!request_id.empty()) {
    TRAINCTL_RETURN_IF_ERROR(RequestIdError(request_id));
    // A retry: the job the first request made, whatever its state now.
    if (auto it = requests_.find(RequestKey(owner, request_id)); it != requests_.end()) {
      const JobEntry* first = book_->Find(it->second);
      if (first != nullptr &&
          clock_->Now() - FromTimestamp(first->job.submit_time()) < kRequestIdLifetime) {
        return first->job;
      }
    }
  }
  TRAINCTL_RETURN_IF_ERROR(SpecErrorsToStatus(ValidateJobSpec(spec)));
  if (book_->active_jobs() >= options_.max_active_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator holds ", book_->active_jobs(),
                                                     " unfinished jobs (its limit)"));
  }
  v1::Job job;
  job.set_id(book_->NewId(spec.name()));
  *job.mutable_spec() = spec;
  ResolveJobSpecDefaults(job.mutable_spec());
  if (std::string* dir = job.mutable_spec()->mutable_checkpoint()->mutable_dir(); !dir->empty()) {
    absl::StrReplaceAll({{"{job_id}", job.id()}}, dir);
  }
  if (!job.spec().resume_from().job().empty()) TRAINCTL_RETURN_IF_ERROR(AttachResumeSource(job));
  TRAINCTL_RETURN_IF_ERROR(CheckDirOwner(job.spec(), owner));
  job.set_state(v1::JOB_STATE_PENDING);
  TRAINCTL_RETURN_IF_ERROR(RefuseIfUnschedulable(job));
  // Numbered before it is stored: every attempt's ranks run as this owner's
  // uid on a worker with --rank-uids (owner_numbers.h).
  TRAINCTL_RETURN_IF_ERROR(owners_->Get(owner).status());
  job.set_owner(owner);
  job.set_owner_token_id(owner_token_id);
  job.set_request_id(request_id);
  SetTimestamp(clock_->Now(), job.mutable_submit_time());
  job.mutable_progress()->set_epochs(job.spec().training().epochs());
  job.mutable_progress()->set_eta_seconds(-1);
  std::string submitted = absl::StrCat("job submitted: ", job.spec().world_size(), " rank(s)");
  if (job.checkpoints_size() > 0)
    absl::StrAppend(&submitted, "; continues from ", DescribeRecord(job.checkpoints(0)));
  absl::StatusOr<JobEntry*> e = book_->Add(std::move(job), {{"submitted", submitted}});
  if (!e.ok())
    return absl::UnavailableError(absl::StrCat("could not store the job: ", e.status().message()));
  (*e)->pending_since_mono = clock_->Mono();
  RememberRequest((*e)->job);
  RequestSchedule();
  return (*e)->job;
}

absl::Status JobManager::RefuseIfUnschedulable(const v1::Job& job) const {
  if (!options_.refuse_unschedulable || job.spec().scheduling().wait_for_capacity())
    return absl::OkStatus();
  if (registry_->Alive().empty()) return absl::OkStatus();  // nobody joined yet
  absl::StatusOr<scheduler::ScheduleResult> plan = placer_->Plan(job);
  if (!plan.ok() || plan->pending.empty()) return absl::OkStatus();
  const scheduler::PendingJobStatus& p = plan->pending[0];
  if (p.reason != scheduler::PendingReason::kExceedsCapacity &&
      p.reason != scheduler::PendingReason::kNoWorkerOfKind) {
    return absl::OkStatus();  // it fits once slots free up: it waits
  }
  const std::string lower = job.spec().scheduling().nodes() > 0
                                ? "lower world_size or scheduling.nodes (--nnodes)"
                                : "lower world_size (or set elastic.min_ranks)";
  return absl::FailedPreconditionError(absl::StrCat(
      "the cluster as it is can never run this job: ", p.message, ". Add workers, ", lower,
      ", or submit with --wait-for-capacity (scheduling.wait_for_capacity: true) to wait for "
      "workers to join"));
}

void JobManager::FailOverduePending(absl::Time mono) {
  std::vector<std::string> overdue;
  for (const std::string& id : book_->pending()) {
    JobEntry& e = book_->At(id);
    const double timeout_s = e.job.spec().scheduling().pending_timeout_s();
    if (timeout_s <= 0 || e.job.state() != v1::JOB_STATE_PENDING) continue;
    if (e.pending_since_mono == absl::InfinitePast()) e.pending_since_mono = mono;
    if (mono - e.pending_since_mono >= absl::Seconds(timeout_s)) overdue.push_back(id);
  }
  for (const std::string& id : overdue) {
    JobEntry& e = book_->At(id);
    const std::string* waiting = book_->PendingReason(id);
    std::string why = absl::StrCat(
        "still pending after scheduling.pending_timeout_s (",
        absl::FormatDuration(absl::Seconds(e.job.spec().scheduling().pending_timeout_s())), ")");
    if (waiting != nullptr && !waiting->empty()) absl::StrAppend(&why, ": ", *waiting);
    v1::Job next = e.job;
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(why);
    if (absl::Status s = book_->Commit(e, std::move(next), {{"failed", why}}); !s.ok()) {
      LogDeferred(s, "retried at the next tick");
    }
  }
}

absl::Status JobManager::CheckDirOwner(const v1::JobSpec& spec, const std::string& owner) const {
  const std::string& dir = spec.checkpoint().dir();
  if (dir.empty() || dir[0] != '/')
    return absl::OkStatus();  // resolved on each worker: its pre-flight checks
  std::vector<const v1::Job*> jobs;
  for (const auto& [id, e] : book_->entries()) jobs.push_back(&e.job);
  auto claimed = DirOwnerFromRecords(jobs, NormalDirPath(dir));
  if (!claimed.has_value() || claimed->first.empty() || claimed->first == owner)
    return absl::OkStatus();
  // Resuming a job of that owner (the caller was allowed to: SubmitJob
  // checked) may use its directory.
  if (const std::string& from = spec.resume_from().job(); !from.empty()) {
    const JobEntry* src = book_->Find(from);
    if (src != nullptr && src->job.owner() == claimed->first) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("checkpoint.dir: ", dir, " belongs to '", claimed->first, "' (job ",
                   claimed->second, "); a job of '", owner,
                   "' may not write there: use a directory of your own, or resume a job of '",
                   claimed->first, "' (resume_from) with a token allowed to"));
}

absl::Status JobManager::AttachResumeSource(v1::Job& job) const {
  const std::string& from = job.spec().resume_from().job();
  const JobEntry* src = book_->Find(from);
  if (src == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("resume_from.job: no job ", from));
  const v1::Job& source = src->job;
  if (!IsTerminal(source.state())) {
    return absl::FailedPreconditionError(absl::StrCat("resume_from.job: job ", from, " is still ",
                                                      StateName(source.state()),
                                                      "; cancel it (or let it finish) first"));
  }
  std::vector<const v1::CheckpointRecord*> newest = NewestRecords(source);
  if (newest.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume_from.job: job ", from, " recorded no checkpoint to continue from"));
  }
  std::vector<SpecError> errors = CheckResumeCompatible(source.spec(), from, job.spec());
  if (!errors.empty()) return SpecErrorsToStatus(errors);
  // A command job's epochs are its program's business (it has no
  // training.epochs): trainctl.load_checkpoint() tells it where it was.
  const int64_t done = newest.front()->epochs_done();
  if (!job.spec().has_command() && done >= job.spec().training().epochs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.epochs: ", job.spec().training().epochs(), ", but job ", from,
                     "'s checkpoint already completed ", done, " epoch(s); set it above ", done,
                     " (e.g. --set training.epochs=", done + 1, ")"));
  }
  for (const v1::CheckpointRecord* r : newest) *job.add_checkpoints() = *r;
  // A script's continuation runs the code it continues unless it ships its
  // own (that code is stored: the source job's row keeps it).
  if (job.spec().has_command() && !job.spec().command().has_code() &&
      source.spec().command().has_code()) {
    *job.mutable_spec()->mutable_command()->mutable_code() = source.spec().command().code();
  }
  // Lineage: a continuation's TensorBoard events go on in the run directory
  // of the job it continues (its step axis goes on too: steps count from the
  // checkpoint's), not into a new directory per job id.
  const v1::TensorBoardSpec& src_tb = source.spec().tensorboard();
  v1::TensorBoardSpec* tb = job.mutable_spec()->mutable_tensorboard();
  if ((tb->enabled() || src_tb.enabled()) && tb->dir().empty()) {
    if (!src_tb.dir().empty()) {
      tb->set_dir(src_tb.dir());
    } else if (src_tb.enabled() && !source.spec().checkpoint().dir().empty()) {
      tb->set_dir(source.spec().checkpoint().dir() + "/tensorboard");
    }
  }
  return absl::OkStatus();
}

namespace {

std::string CancelReason(const std::string& reason) {
  return reason.empty() ? "cancelled by a user" : absl::StrCat("cancelled: ", reason);
}

}  // namespace

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  JobEntry* e = book_->Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(e->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", StateName(e->job.state()), ")"));
  }
  if (reason.size() > 1024) return absl::InvalidArgumentError("reason: at most 1024 bytes");
  TRAINCTL_RETURN_IF_ERROR(CancelEntry(*e, CancelReason(reason)));
  RequestSchedule();
  return e->job;
}

absl::Status JobManager::CancelEntry(JobEntry& e, const std::string& why) {
  return EndEntry(e, v1::JOB_STATE_CANCELLED, "cancelled", why, {});
}

absl::Status JobManager::EndEntry(JobEntry& e, v1::JobState end, const std::string& event,
                                  const std::string& why, StopHow how) {
  v1::Job next = e.job;
  next.set_state(end);
  next.set_state_reason(why);
  v1::Attempt* a = CurrentAttempt(next);
  RanksByWorker to_stop;
  if (a != nullptr && !AttemptEnded(a->state())) {
    a->set_state(v1::ATTEMPT_STATE_CANCELLED);
    a->set_reason(why);
    if (end == v1::JOB_STATE_CANCELLED) a->set_failure_kind(v1::FAILURE_KIND_CANCELLED);
    SetTimestamp(clock_->Now(), a->mutable_end_time());
    to_stop = LiveRanksByWorker(*a);
  }
  TRAINCTL_RETURN_IF_ERROR(book_->Commit(e, std::move(next), {{event, why}}));
  starter_->StopAll(e.job.id(),
                    CurrentAttempt(e.job) == nullptr ? 0 : CurrentAttempt(e.job)->number(), to_stop,
                    why, how);
  return absl::OkStatus();
}

void JobManager::StopOverrunJobs(absl::Time now) {
  // Only jobs that have had an attempt: those holding slots or waiting for
  // their next one (a job never placed has run for no time). Read in place:
  // this runs every tick, and the pending set may hold many jobs.
  std::vector<std::string> overrun;
  for (const auto* ids : {&book_->holding_slots(), &book_->pending()}) {
    for (const std::string& id : *ids) {
      const v1::Job& job = book_->At(id).job;
      const double limit_s = job.spec().scheduling().max_runtime_s();
      if (limit_s <= 0 || IsTerminal(job.state()) || job.attempts_size() == 0) continue;
      if (RunningTime(job, now) >= absl::Seconds(limit_s)) overrun.push_back(id);
    }
  }
  // A job stopping between attempts may be in both sets.
  std::sort(overrun.begin(), overrun.end());
  overrun.erase(std::unique(overrun.begin(), overrun.end()), overrun.end());
  for (const std::string& id : overrun) {
    JobEntry& e = book_->At(id);
    const absl::Duration ran = RunningTime(e.job, now);
    const std::string why =
        absl::StrCat("ran past max_runtime_s=", e.job.spec().scheduling().max_runtime_s(), " (",
                     absl::FormatDuration(ran), " of running time over ", e.job.attempts_size(),
                     e.job.attempts_size() == 1 ? " attempt" : " attempts",
                     "); stopped as a preemption is: its ranks checkpoint first, `trainctl resume` "
                     "continues it");
    // The preemption's stop: checkpoint_first and its grace.
    if (absl::Status s = EndEntry(e, v1::JOB_STATE_TIMEOUT, "timeout", why,
                                  {options_.placer.preemption_grace, /*checkpoint_first=*/true});
        !s.ok()) {
      LogDeferred(s, "retried at the next tick");
      continue;
    }
    RequestSchedule();  // its slots come free
  }
}

absl::StatusOr<std::vector<std::string>> JobManager::CancelMatching(const CancelFilter& filter,
                                                                    const std::string& reason,
                                                                    bool dry_run) {
  for (v1::JobState s : filter.states) {
    if (s == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("states: ", static_cast<int>(s), " is not a job state"));
    }
    if (IsTerminal(s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "states: ", StateName(s),
          " jobs have ended and cannot be cancelled (pending, scheduled, running or restarting)"));
    }
  }
  if (reason.size() > 1024) return absl::InvalidArgumentError("reason: at most 1024 bytes");
  std::vector<std::string> ids;
  for (const auto& [id, e] : book_->entries()) {
    const v1::Job& job = e.job;
    if (IsTerminal(job.state())) continue;
    if (!filter.queue.empty() &&
        filter.queue !=
            (job.spec().queue().empty() ? std::string("default") : job.spec().queue())) {
      continue;
    }
    if (!filter.owner.empty() && job.owner() != filter.owner) continue;
    if (!filter.owner_token_id.empty() && job.owner_token_id() != filter.owner_token_id) continue;
    if (!filter.states.empty() &&
        std::find(filter.states.begin(), filter.states.end(), job.state()) == filter.states.end()) {
      continue;
    }
    ids.push_back(id);
  }
  if (dry_run || ids.empty()) return ids;
  const std::string why = CancelReason(reason);
  size_t done = 0;
  absl::Status failed;
  for (const std::string& id : ids) {
    failed = CancelEntry(book_->At(id), why);
    if (!failed.ok()) break;
    ++done;
  }
  if (done > 0) RequestSchedule();
  if (!failed.ok()) {
    return absl::Status(
        failed.code(),
        absl::StrCat("cancelled ", done, " of ", ids.size(), " jobs, then job ", ids[done], ": ",
                     failed.message(), " (run it again for the rest)"));
  }
  return ids;
}

// --- worker sessions -------------------------------------------------------------

void JobManager::OnWorkerRegistered(const std::string& worker_id, const v1::Register& msg) {
  // 0. Ends that happened while the worker was away come first.
  for (const v1::RankStatus& st : msg.ended()) {
    absl::Status s = OnRankStatus(worker_id, st);
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
      LogEvent(LogLevel::kWarn, "coordinator", "report_refused",
               {{"worker_id", worker_id},
                {"report", "rank end at registration"},
                {"error", std::string(s.message())}});
    }
  }
  // 1. Ranks it runs that the coordinator no longer wants: stop them.
  absl::flat_hash_set<std::string> reported;
  for (const v1::RunningRank& r : msg.running()) {
    reported.insert(ReportKey(r.job_id(), r.attempt(), r.rank()));
    const JobEntry* e = book_->Find(r.job_id());
    bool wanted = false;
    if (e != nullptr && !IsTerminal(e->job.state()) && r.attempt() == e->job.attempts_size()) {
      const v1::Attempt& a = *CurrentAttempt(e->job);
      wanted = !AttemptEnded(a.state()) && r.rank() >= 0 && r.rank() < a.ranks_size() &&
               a.ranks(r.rank()).worker_id() == worker_id && !IsTerminal(a.ranks(r.rank()).state());
    }
    if (!wanted)
      starter_->Stop(worker_id, r.job_id(), r.attempt(), {r.rank()}, "not wanted after reconnect");
  }
  // 2. Ranks the coordinator placed there: resend, keep, or fail as vanished.
  std::vector<std::string> ids(book_->holding_slots().begin(), book_->holding_slots().end());
  for (const std::string& id : ids) ReconcileWorkerJob(worker_id, book_->At(id), reported);
  // 3. Checkpoint files it was to delete while it was away.
  if (auto it = pending_drops_.find(worker_id); it != pending_drops_.end()) {
    std::deque<v1::CoordinatorMessage> drops = std::move(it->second);
    pending_drops_.erase(it);
    for (const v1::CoordinatorMessage& m : drops) registry_->Send(worker_id, m);
  }
  RequestSchedule();
}

void JobManager::ReconcileWorkerJob(const std::string& worker_id, JobEntry& e,
                                    const absl::flat_hash_set<std::string>& reported) {
  v1::Job next = e.job;
  std::vector<int32_t> vanished;
  std::vector<v1::RankStatus> ends;  // What changed, to replay if the write fails.
  for (int ai = 0; ai < next.attempts_size(); ++ai) {
    v1::Attempt* a = next.mutable_attempts(ai);
    bool current =
        ai == next.attempts_size() - 1 && !AttemptEnded(a->state()) && !IsTerminal(next.state());
    for (v1::RankAssignment& r : *a->mutable_ranks()) {
      if (r.worker_id() != worker_id || IsTerminal(r.state())) continue;
      if (reported.contains(ReportKey(next.id(), a->number(), r.rank()))) continue;
      if (current && r.state() == v1::RANK_STATE_ASSIGNED) continue;  // Resent below.
      // Gone while the worker was away.
      r.set_state(current ? v1::RANK_STATE_FAILED : v1::RANK_STATE_STOPPED);
      r.mutable_exit()->set_kind(v1::FAILURE_KIND_WORKER_LOST);
      r.mutable_exit()->set_message("the rank process was gone when its worker reconnected");
      if (current) vanished.push_back(r.rank());
      v1::RankStatus& end = ends.emplace_back();
      end.set_job_id(next.id());
      end.set_attempt(a->number());
      end.set_rank(r.rank());
      end.set_state(r.state());
      *end.mutable_exit() = r.exit();
    }
  }
  if (!ends.empty()) {
    absl::Status s;
    if (!vanished.empty()) {
      const v1::RankAssignment& r = CurrentAttempt(next)->ranks(vanished[0]);
      std::string reason = DescribeExit(r, r.exit());
      s = FailAttempt(e, std::move(next), {}, v1::FAILURE_KIND_WORKER_LOST, reason, vanished[0]);
    } else {
      s = book_->Commit(e, std::move(next), {});
    }
    if (!s.ok()) {
      LogDeferred(s, "retried at the next tick",
                  {{"worker_id", worker_id}, {"on", "worker reconnected"}});
      for (const v1::RankStatus& end : ends) HoldReport(worker_id, end, clock_->Now());
      return;
    }
    if (!vanished.empty()) return;
  }
  const v1::Attempt* cur = CurrentAttempt(e.job);
  if (cur == nullptr || AttemptEnded(cur->state()) || IsTerminal(e.job.state())) return;
  starter_->Resend(e, *cur, worker_id);
}

// --- periodic ----------------------------------------------------------------------

void JobManager::ApplyDueReports(absl::Time now) {
  std::vector<HeldReport> due;
  for (auto it = held_reports_.begin(); it != held_reports_.end();) {
    bool ready = now >= it->second.due;
    if (!ready) {
      const JobEntry* e = book_->Find(it->second.status.job_id());
      const v1::Attempt* a = e == nullptr ? nullptr : CurrentAttempt(e->job);
      ready = a == nullptr || a->number() != it->second.status.attempt() ||
              AttemptEnded(a->state()) || LostPeer(*a, it->second.worker_id).has_value();
    }
    if (!ready) {
      ++it;
      continue;
    }
    due.push_back(std::move(it->second));
    it = held_reports_.erase(it);  // btree: erase invalidates other iterators.
  }
  for (const HeldReport& r : due) {
    absl::Status s = ApplyRankStatus(r.worker_id, r.status, /*may_hold=*/false);
    if (s.code() == absl::StatusCode::kUnavailable) {
      HoldReport(r.worker_id, r.status, now);
    } else if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
      LogEvent(LogLevel::kWarn, "coordinator", "report_refused",
               {{"worker_id", r.worker_id},
                {"report", "held rank end"},
                {"error", std::string(s.message())}});
    }
  }
}

void JobManager::Tick() {
  const absl::Time now = clock_->Now();
  // 1. Rank ends held for a lost peer to explain them (due, or explained
  //    now), and ends whose write failed.
  ApplyDueReports(now);
  // 2. Ranks still placed on a LOST worker (OnWorkerLost's write failed).
  health_->RetryLostWorkers();
  // 3. Attempts whose ranks all ended without the attempt ending.
  std::vector<std::string> unsettled(book_->unsettled().begin(), book_->unsettled().end());
  for (const std::string& id : unsettled) {
    if (SettleEndedAttempt(book_->At(id))) book_->MarkSettled(id);
  }
  // 4. A placement whose write failed, or an elastic job whose wait for a
  //    replacement ran out: place again.
  placer_->OnTick(now);
  // 5. Rendezvous timeouts, hangs and stragglers: not while the store fails.
  if (HealthJudgeable()) health_->CheckAttempts(clock_->Mono());
  // 6. Jobs pending past their scheduling.pending_timeout_s.
  FailOverduePending(clock_->Mono());
  // 7. Jobs that ran past their scheduling.max_runtime_s.
  StopOverrunJobs(now);
}

bool JobManager::HealthJudgeable() {
  const bool unconfirmed = !store_->lease_confirmed();
  if (unconfirmed || !reports_held_.empty()) {
    if (!health_paused_) {
      health_paused_ = true;
      std::vector<std::string> workers;
      for (const auto& [session, worker] : reports_held_) workers.push_back(worker);
      std::sort(workers.begin(), workers.end());
      LogEvent(LogLevel::kWarn, "coordinator", "health_checks_paused",
               {{"reason", unconfirmed
                               ? std::string("the store's lease is not confirmed")
                               : absl::StrCat("reports of worker(s) ", absl::StrJoin(workers, ", "),
                                              " wait for the store")},
                {"then",
                 "no hang, rendezvous or straggler verdict until the ranks' reports are stored"}});
    }
    return false;
  }
  if (health_paused_) {
    health_paused_ = false;
    LogEvent(LogLevel::kInfo, "coordinator", "health_checks_resumed",
             {{"why", "every report held for the store is applied"}});
  }
  return true;
}

}  // namespace trainctl::coordinator

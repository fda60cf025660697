#include "coordinator/jobs/attempt_starter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/nccl_id.h"
#include "common/random_secret.h"
#include "common/status_macros.h"

namespace trainctl::coordinator {
namespace {

absl::Status ValidateRendezvous(const v1::RendezvousInfo& info) {
  switch (info.kind_case()) {
    case v1::RendezvousInfo::kNcclUniqueId:
      if (info.nccl_unique_id().size() != kNcclUniqueIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("rendezvous.info.nccl_unique_id: must be ",
                                                       kNcclUniqueIdBytes, " bytes, got ",
                                                       info.nccl_unique_id().size()));
      }
      break;
    case v1::RendezvousInfo::kGlooStoreAddress:
      if (info.gloo_store_address().empty() || info.gloo_store_address().size() > 255) {
        return absl::InvalidArgumentError(
            "rendezvous.info.gloo_store_address: host:port, at most 255 bytes");
      }
      break;
    default:
      return absl::InvalidArgumentError(
          "rendezvous.info: set nccl_unique_id or gloo_store_address");
  }
  if (info.master_addr().size() > 255 || info.master_port() < 0 || info.master_port() > 65535) {
    return absl::InvalidArgumentError("rendezvous.info.master_addr/master_port: out of range");
  }
  return absl::OkStatus();
}

absl::Status ValidatePreflightReport(const v1::PreflightReport& rep) {
  if (rep.problems_size() > 64)
    return absl::InvalidArgumentError("preflight.problems: at most 64 lines");
  for (const std::string& p : rep.problems()) {
    if (p.size() > 2048)
      return absl::InvalidArgumentError("preflight.problems: a line is over 2048 bytes");
  }
  return absl::OkStatus();
}

}  // namespace

std::string AttemptStarter::ResumeOwner(const v1::Job& job) const {
  const std::string& from = job.spec().resume_from().job();
  if (from.empty()) return "";
  const JobEntry* src = book_->Find(from);
  return src == nullptr ? "" : src->job.owner();
}

int64_t AttemptStarter::OwnerNumber(const v1::Job& job) {
  std::string whose = ResumeOwner(job);
  if (whose.empty()) whose = job.owner();
  absl::StatusOr<int64_t> n = owners_->Get(whose);
  if (n.ok()) return *n;
  LogEvent(LogLevel::kWarn, "coordinator", "owner_number_unavailable",
           {{"job_id", job.id()}, {"owner", whose}, {"error", std::string(n.status().message())}});
  return 0;
}

void AttemptStarter::Launch(JobEntry& e, const v1::Attempt& attempt) {
  if (!options_.preflight) {
    for (const std::string& w : AttemptWorkers(attempt)) SendStartRanks(e, attempt, w);
    return;
  }
  e.preflight_attempt = attempt.number();
  e.preflight_reports.clear();
  e.preflight_space_only.clear();
  e.preflight_passed = false;
  for (const std::string& w : AttemptWorkers(attempt)) SendPreflight(e, attempt, w);
}

void AttemptStarter::Resend(JobEntry& e, const v1::Attempt& cur, const std::string& worker_id) {
  bool has_assigned = false, on_worker = false;
  for (const v1::RankAssignment& r : cur.ranks()) {
    if (r.worker_id() != worker_id) continue;
    on_worker = true;
    if (r.state() == v1::RANK_STATE_ASSIGNED) has_assigned = true;
  }
  if (has_assigned) {
    if (options_.preflight && e.preflight_attempt == cur.number() && !e.preflight_passed) {
      if (e.preflight_reports.count(worker_id) == 0) SendPreflight(e, cur, worker_id);
    } else {
      SendStartRanks(e, cur, worker_id);
    }
  }
  if (on_worker && cur.has_rendezvous()) SendRendezvous(e.job, cur, worker_id);
}

void AttemptStarter::SendPreflight(const JobEntry& e, const v1::Attempt& attempt,
                                   const std::string& worker_id) {
  v1::CoordinatorMessage msg;
  v1::Preflight* p = msg.mutable_preflight();
  p->set_job_id(e.job.id());
  p->set_attempt(attempt.number());
  *p->mutable_spec() = e.job.spec();
  if (attempt.has_resume()) *p->mutable_resume() = attempt.resume();
  p->set_owner(e.job.owner());
  p->set_resume_owner(ResumeOwner(e.job));
  p->set_owner_number(OwnerNumber(e.job));
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (r.worker_id() == worker_id) *p->add_ranks() = r;
  }
  SendAfterCommit(worker_id, std::move(msg));
}

absl::Status AttemptStarter::OnPreflightReport(const std::string& worker_id,
                                               const v1::PreflightReport& rep) {
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(
      JobEntry * e, book_->ForWorker(worker_id, rep.job_id(), rep.attempt(), -1, false, &a_mem));
  const std::vector<std::string> workers = AttemptWorkers(*a_mem);
  if (std::find(workers.begin(), workers.end(), worker_id) == workers.end()) {
    return absl::PermissionDeniedError(absl::StrCat("preflight: worker ", worker_id,
                                                    " holds no rank of attempt ", rep.attempt(),
                                                    " of ", rep.job_id()));
  }
  TRAINCTL_RETURN_IF_ERROR(ValidatePreflightReport(rep));
  if (IsTerminal(e->job.state()) || AttemptEnded(a_mem->state()))
    return absl::AbortedError("the attempt already ended");
  if (e->preflight_attempt != rep.attempt() || e->preflight_passed)
    return absl::OkStatus();  // stale or a re-send
  e->preflight_reports[worker_id] = {rep.problems().begin(), rep.problems().end()};
  if (rep.waiting_for_space() && rep.problems_size() > 0) e->preflight_space_only.insert(worker_id);
  for (const std::string& w : workers) {
    if (e->preflight_reports.count(w) == 0) return absl::OkStatus();  // more to come
  }
  return ConcludePreflight(*e, workers);
}

absl::Status AttemptStarter::ConcludePreflight(JobEntry& e,
                                               const std::vector<std::string>& workers) {
  std::vector<std::string> failing;
  for (const std::string& w : workers) {
    const std::vector<std::string>& problems = e.preflight_reports[w];
    if (!problems.empty()) failing.push_back(absl::StrCat(w, ": ", absl::StrJoin(problems, "; ")));
  }
  if (failing.empty()) {
    e.preflight_passed = true;
    const v1::Attempt& cur = *CurrentAttempt(e.job);
    for (const std::string& w : workers) SendStartRanks(e, cur, w);
    return absl::OkStatus();
  }
  // One reason naming every failing worker; no rank was started. When
  // every problem is a full checkpoint directory, the job waits for space
  // (DISK_FULL: restarted after a backoff for restart.disk_full_wait_s)
  // instead of failing: space comes back by itself (a cleanup, a quota).
  bool space_only = true;
  for (const std::string& w : workers) {
    if (!e.preflight_reports[w].empty() && e.preflight_space_only.count(w) == 0) space_only = false;
  }
  const v1::FailureKind kind = space_only ? v1::FAILURE_KIND_DISK_FULL : v1::FAILURE_KIND_PREFLIGHT;
  std::string reason =
      absl::StrCat(space_only ? "pre-flight: waiting for space: " : "pre-flight failed: ",
                   absl::StrJoin(failing, "; "));
  v1::Job next = e.job;
  for (v1::RankAssignment& r : *CurrentAttempt(next)->mutable_ranks()) {
    // Never started: ended here, so their slots are free at once.
    if (IsTerminal(r.state())) continue;
    r.set_state(v1::RANK_STATE_STOPPED);
    r.mutable_exit()->set_kind(kind);
    r.mutable_exit()->set_exit_code(-1);
    r.mutable_exit()->set_message(space_only ? "not started: waiting for space"
                                             : "not started: pre-flight failed");
  }
  TRAINCTL_RETURN_IF_ERROR(actions_->FailAttempt(e, std::move(next), {}, kind, reason, -1));
  actions_->RequestSchedule();
  return absl::OkStatus();
}

void AttemptStarter::SendStartRanks(JobEntry& entry, const v1::Attempt& attempt,
                                    const std::string& worker_id) {
  const v1::Job& job = entry.job;
  if (entry.secret_attempt != attempt.number() || entry.rendezvous_secret.empty()) {
    entry.rendezvous_secret = NewSecretHex();
    entry.secret_attempt = attempt.number();
  }
  v1::CoordinatorMessage msg;
  v1::StartRanks* s = msg.mutable_start_ranks();
  s->set_job_id(job.id());
  s->set_attempt(attempt.number());
  *s->mutable_spec() = job.spec();
  if (attempt.has_resume()) {
    s->set_resume_from(attempt.resume().path());
    *s->mutable_resume() = attempt.resume();
  }
  s->set_spec_hash(CheckpointSpecHash(job.spec()));
  s->set_rendezvous_secret(entry.rendezvous_secret);
  s->set_owner(job.owner());
  s->set_resume_owner(ResumeOwner(job));
  s->set_owner_number(OwnerNumber(job));
  *s->mutable_skip_steps() = attempt.skip_steps();
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (r.worker_id() != worker_id) continue;
    *s->add_ranks() = r;
    if (r.rank() == 0) s->set_produce_rendezvous(true);
  }
  SendAfterCommit(worker_id, std::move(msg));
}

void AttemptStarter::SendAfterCommit(const std::string& worker_id, v1::CoordinatorMessage msg) {
  book_->AfterCommit([this, worker_id, msg = std::move(msg)]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { registry_->Send(worker_id, msg); });
}

void AttemptStarter::Stop(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                          const std::vector<int32_t>& ranks, const std::string& reason,
                          StopHow how) {
  v1::CoordinatorMessage msg;
  v1::StopRanks* s = msg.mutable_stop_ranks();
  s->set_job_id(job_id);
  s->set_attempt(attempt);
  for (int32_t r : ranks) s->add_ranks(r);
  s->set_reason(reason);
  s->set_grace_period_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(how.grace.value_or(options_.stop_grace))));
  s->set_checkpoint_first(how.checkpoint_first);
  s->set_stack_dump_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(how.stack_dump)));
  SendAfterCommit(worker_id, std::move(msg));
}

void AttemptStarter::StopAll(const std::string& job_id, int32_t attempt, const RanksByWorker& ranks,
                             const std::string& reason, StopHow how) {
  for (const auto& [w, rs] : ranks) Stop(w, job_id, attempt, rs, reason, how);
}

void AttemptStarter::SendRendezvous(const v1::Job& job, const v1::Attempt& attempt,
                                    const std::string& worker_id) {
  v1::CoordinatorMessage msg;
  v1::RendezvousDelivery* d = msg.mutable_rendezvous();
  d->set_job_id(job.id());
  d->set_attempt(attempt.number());
  *d->mutable_info() = attempt.rendezvous();
  SendAfterCommit(worker_id, std::move(msg));
}

absl::Status AttemptStarter::OnRendezvous(const std::string& worker_id,
                                          const v1::RendezvousReport& rep) {
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(
      JobEntry * e, book_->ForWorker(worker_id, rep.job_id(), rep.attempt(), 0, false, &a_mem));
  TRAINCTL_RETURN_IF_ERROR(ValidateRendezvous(rep.info()));
  if (IsTerminal(e->job.state()) || AttemptEnded(a_mem->state())) {
    return absl::AbortedError("the attempt already ended");
  }
  v1::Job next = e->job;
  *CurrentAttempt(next)->mutable_rendezvous() = rep.info();
  TRAINCTL_RETURN_IF_ERROR(book_->Commit(*e, std::move(next), {}));
  const v1::Attempt& cur = *CurrentAttempt(e->job);
  for (const std::string& w : AttemptWorkers(cur)) SendRendezvous(e->job, cur, w);
  return absl::OkStatus();
}

absl::Status AttemptStarter::OnRendezvousRefused(const std::string& worker_id,
                                                 const v1::RendezvousReport& rep,
                                                 const absl::Status& why) {
  v1::Attempt* a_mem = nullptr;
  absl::StatusOr<JobEntry*> e =
      book_->ForWorker(worker_id, rep.job_id(), rep.attempt(), 0, false, &a_mem);
  if (!e.ok()) return e.status();
  if (IsTerminal((*e)->job.state()) || AttemptEnded(a_mem->state())) return why;
  const std::vector<std::string> workers = AttemptWorkers(*a_mem);
  if (workers.size() <= 1) return why;
  std::string reason =
      absl::StrCat("rendezvous refused: worker ", worker_id, " reported ", why.message());
  if (const v1::Worker* w = registry_->Find(worker_id);
      w != nullptr && !w->address_refused().empty()) {
    absl::StrAppend(&reason, "; its registration said: ", w->address_refused());
  } else {
    absl::StrAppend(
        &reason,
        "; start that worker with --address set to its IP address that the other workers reach");
  }
  TRAINCTL_RETURN_IF_ERROR(
      actions_->FailAttempt(**e, (*e)->job, {}, v1::FAILURE_KIND_CONFIG, reason, 0));
  actions_->RequestSchedule();
  return why;
}

}  // namespace trainctl::coordinator

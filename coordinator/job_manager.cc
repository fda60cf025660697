#include "coordinator/job_manager.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/nccl_id.h"
#include "common/random_secret.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/scheduler/scheduler.h"

namespace trainctl::coordinator {
namespace {

constexpr int kMaxLogLinesInReason = 5;
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
// Bytes of jobs in one ListJobs page (gRPC's default message limit is 4 MiB).
constexpr size_t kMaxListBytes = 2u << 20;

const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_PENDING: return "PENDING";
    case v1::JOB_STATE_SCHEDULED: return "SCHEDULED";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_RESTARTING: return "RESTARTING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNSPECIFIED";
  }
}

bool AttemptEnded(v1::AttemptState s) {
  return s == v1::ATTEMPT_STATE_SUCCEEDED || s == v1::ATTEMPT_STATE_FAILED ||
         s == v1::ATTEMPT_STATE_CANCELLED;
}

v1::Attempt* CurrentAttempt(v1::Job& job) {
  return job.attempts_size() == 0 ? nullptr : job.mutable_attempts(job.attempts_size() - 1);
}

std::string ReportKey(const v1::RankStatus& st) {
  return absl::StrCat(st.job_id(), "/", st.attempt(), "/", st.rank());
}

// A current attempt that has not ended although every rank has.
bool Unsettled(v1::Job& job) {
  if (IsTerminal(job.state())) return false;
  const v1::Attempt* a = CurrentAttempt(job);
  if (a == nullptr || AttemptEnded(a->state()) || a->ranks_size() == 0) return false;
  return std::all_of(a->ranks().begin(), a->ranks().end(),
                     [](const v1::RankAssignment& r) { return IsTerminal(r.state()); });
}

bool HasLiveRanks(const v1::Job& job) {
  for (const v1::Attempt& a : job.attempts()) {
    for (const v1::RankAssignment& r : a.ranks()) {
      if (!IsTerminal(r.state())) return true;
    }
  }
  return false;
}

// Workers of an attempt, in node order.
std::vector<std::string> AttemptWorkers(const v1::Attempt& a) {
  std::vector<std::string> out;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (std::find(out.begin(), out.end(), r.worker_id()) == out.end()) out.push_back(r.worker_id());
  }
  return out;
}

// Ranks of an attempt that have not ended, grouped by worker (node order).
using RanksByWorker = std::vector<std::pair<std::string, std::vector<int32_t>>>;
RanksByWorker LiveRanksByWorker(const v1::Attempt& a) {
  RanksByWorker out;
  for (const std::string& w : AttemptWorkers(a)) {
    std::vector<int32_t> ranks;
    for (const v1::RankAssignment& r : a.ranks()) {
      if (r.worker_id() == w && !IsTerminal(r.state())) ranks.push_back(r.rank());
    }
    if (!ranks.empty()) out.emplace_back(w, std::move(ranks));
  }
  return out;
}

// `cause`: what made the rank fail when it was not its own doing (a lost
// peer worker, "worker W (host H) was lost"), named first; or empty.
std::string DescribeExit(const v1::RankAssignment& r, const v1::ExitInfo& exit,
                         const std::string& cause = "") {
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
  if (!exit.message().empty()) absl::StrAppend(&out, ": ", exit.message());
  if (exit.last_log_lines_size() > 0) {
    int from = std::max(0, exit.last_log_lines_size() - kMaxLogLinesInReason);
    std::vector<std::string> lines(exit.last_log_lines().begin() + from, exit.last_log_lines().end());
    absl::StrAppend(&out, "\n  last log lines:\n    ", absl::StrJoin(lines, "\n    "));
  }
  return out;
}

// The records of `job` at its newest checkpoint (highest global step), one
// per holder.
std::vector<const v1::CheckpointRecord*> NewestRecords(const v1::Job& job) {
  std::vector<const v1::CheckpointRecord*> out;
  for (const v1::CheckpointRecord& r : job.checkpoints()) {
    if (!out.empty() && r.global_step() < out.front()->global_step()) continue;
    if (!out.empty() && r.global_step() > out.front()->global_step()) out.clear();
    out.push_back(&r);
  }
  return out;
}

std::string Holder(const v1::CheckpointRecord& r) {
  return r.shared() ? "the shared checkpoint dir" : absl::StrCat("worker ", r.worker_id());
}

std::string DescribeRecord(const v1::CheckpointRecord& r) {
  return absl::StrCat("the checkpoint of job ", r.job_id(), " at epoch ", r.epochs_done(), " (step ",
                      r.global_step(), ") on ", Holder(r));
}

// Command jobs (the user's program) run only on workers started with
// --allow-commands. They are placed in a second pass, over those workers'
// slots that the engine jobs of the first pass left free: the pure scheduler
// stays unaware of the distinction.
absl::StatusOr<scheduler::ScheduleResult> ScheduleWithCommands(
    const std::vector<scheduler::PendingJob>& jobs, const absl::flat_hash_set<std::string>& command_jobs,
    std::vector<scheduler::WorkerSlots> workers, const absl::flat_hash_set<std::string>& allowing) {
  std::vector<scheduler::PendingJob> engine, command;
  for (const scheduler::PendingJob& j : jobs) (command_jobs.contains(j.job_id) ? command : engine).push_back(j);
  scheduler::ScheduleResult out;
  if (!engine.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(out, scheduler::Schedule(engine, workers));
  }
  if (command.empty()) return out;
  std::vector<scheduler::WorkerSlots> cmd_workers;
  for (scheduler::WorkerSlots& w : workers) {
    if (!allowing.contains(w.worker_id)) continue;
    for (const scheduler::Placement& p : out.placements) {
      for (const scheduler::RankAssignment& r : p.ranks) {
        if (r.worker_id != w.worker_id) continue;
        w.free_slots.erase(std::remove(w.free_slots.begin(), w.free_slots.end(), r.slot), w.free_slots.end());
      }
    }
    cmd_workers.push_back(std::move(w));
  }
  TRAINCTL_ASSIGN_OR_RETURN(scheduler::ScheduleResult second, scheduler::Schedule(command, cmd_workers));
  for (scheduler::Placement& p : second.placements) out.placements.push_back(std::move(p));
  for (scheduler::PendingJobStatus& p : second.pending) {
    p.message = cmd_workers.empty()
                    ? "no worker allows commands (start trainctl-worker with --allow-commands)"
                    : absl::StrCat("on workers that allow commands: ", p.message);
    out.pending.push_back(std::move(p));
  }
  return out;
}

scheduler::DeviceRequirement ToRequirement(v1::Device d) {
  switch (d) {
    case v1::DEVICE_CUDA: return scheduler::DeviceRequirement::kCuda;
    case v1::DEVICE_CPU: return scheduler::DeviceRequirement::kCpu;
    default: return scheduler::DeviceRequirement::kAuto;
  }
}

}  // namespace

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

bool IsTerminal(v1::RankState s) {
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED || s == v1::RANK_STATE_STOPPED;
}

bool JobTransitionAllowed(v1::JobState from, v1::JobState to) {
  if (from == to) return true;  // Updates without a state change (also rank ends after the job ended).
  switch (from) {
    case v1::JOB_STATE_UNSPECIFIED:
      return to == v1::JOB_STATE_PENDING;
    case v1::JOB_STATE_PENDING:
      return to == v1::JOB_STATE_SCHEDULED || to == v1::JOB_STATE_CANCELLED ||
             to == v1::JOB_STATE_FAILED;
    case v1::JOB_STATE_SCHEDULED:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_RESTARTING ||
             to == v1::JOB_STATE_SUCCEEDED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED;
    case v1::JOB_STATE_RUNNING:
      return to == v1::JOB_STATE_SUCCEEDED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_RESTARTING || to == v1::JOB_STATE_CANCELLED;
    case v1::JOB_STATE_RESTARTING:
      return to == v1::JOB_STATE_SCHEDULED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED;
    default:
      return false;  // Terminal states never change.
  }
}

JobManager::JobManager(StateStore* store, WorkerRegistry* registry, MetricsHub* hub,
                       const Clock* clock, JobManagerOptions options)
    : store_(store), registry_(registry), hub_(hub), clock_(clock), options_(options) {}

std::string JobManager::NewJobId(const std::string& name) {
  static std::mt19937_64 rng(std::random_device{}());
  std::string id;
  do {
    id = absl::StrFormat("%s-%06x", name, rng() & 0xffffff);
  } while (jobs_.contains(id));
  return id;
}

absl::Duration JobManager::ProgressTimeout(const v1::Job& job) const {
  int32_t s = job.spec().restart().progress_timeout_s();
  return s > 0 ? absl::Seconds(s) : options_.progress_timeout;
}

JobManager::JobEntry* JobManager::FindEntry(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void JobManager::TrackIndexes(const JobEntry& e) {
  const std::string& id = e.job.id();
  v1::JobState s = e.job.state();
  if (s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_RESTARTING) {
    pending_.insert(id);
  } else {
    pending_.erase(id);
    pending_reasons_.erase(id);
  }
  if (HasLiveRanks(e.job)) {
    holding_slots_.insert(id);
  } else {
    holding_slots_.erase(id);
  }
}

absl::Status JobManager::Recover(const StoreSnapshot& snapshot) {
  for (size_t i = 0; i < snapshot.jobs.size(); ++i) {
    JobEntry e;
    e.job = snapshot.jobs[i];
    e.submit_seq = snapshot.submit_seqs[i];
    e.last_event_seq = snapshot.last_event_seqs[i];
    next_submit_seq_ = std::max(next_submit_seq_, e.submit_seq + 1);
    if (!IsTerminal(e.job.state())) ++active_jobs_;
    // Hang detection restarts its clock: the coordinator was away, not the ranks.
    absl::Time now = clock_->Now();
    for (v1::Attempt& a : *e.job.mutable_attempts()) {
      for (v1::RankAssignment& r : *a.mutable_ranks()) {
        if (!IsTerminal(r.state())) SetTimestamp(now, r.mutable_last_progress_time());
      }
    }
    auto [it, inserted] = jobs_.emplace(e.job.id(), std::move(e));
    TrackIndexes(it->second);
    if (Unsettled(it->second.job)) unsettled_.insert(it->first);
  }
  return absl::OkStatus();
}

absl::Status JobManager::Commit(JobEntry& entry, v1::Job next, std::vector<EventSpec> events) {
  v1::JobState from = entry.job.state();
  if (!JobTransitionAllowed(from, next.state())) {
    return absl::InternalError(absl::StrCat("job ", entry.job.id(), ": transition ", StateName(from),
                                            " -> ", StateName(next.state()), " is not allowed"));
  }
  absl::Time now = clock_->Now();
  std::vector<v1::Event> stored;
  int64_t seq = entry.last_event_seq;
  for (EventSpec& spec : events) {
    v1::Event ev;
    ev.set_seq(++seq);
    SetTimestamp(now, ev.mutable_time());
    ev.set_job_id(next.id());
    ev.set_attempt(spec.attempt);
    ev.set_rank(spec.rank);
    ev.set_state(next.state());
    ev.set_type(std::move(spec.type));
    ev.set_message(std::move(spec.message));
    stored.push_back(std::move(ev));
  }
  if (IsTerminal(next.state()) && !next.has_end_time()) SetTimestamp(now, next.mutable_end_time());
  if (next.state() == v1::JOB_STATE_SUCCEEDED && from != v1::JOB_STATE_SUCCEEDED &&
      entry.final_model.has_value() && next.attempts_size() > 0 &&
      entry.final_model->attempt() == next.attempts(next.attempts_size() - 1).number()) {
    next.set_final_model(entry.final_model->path());
    next.set_final_model_worker(entry.final_model_worker);
  }
  if (absl::Status s = store_->PutJob(next, entry.submit_seq, stored); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("job ", next.id(), ": could not store the ",
                                               StateName(next.state()), " transition: ", s.message()));
  }

  if (from != next.state()) {
    LogFields fields = {{"job_id", next.id()}, {"from", StateName(from)}, {"to", StateName(next.state())}};
    if (next.attempts_size() > 0) fields.emplace_back("attempt", absl::StrCat(next.attempts(next.attempts_size() - 1).number()));
    if (!next.state_reason().empty()) fields.emplace_back("reason", next.state_reason().substr(0, 300));
    if (next.state() == v1::JOB_STATE_SUCCEEDED && !next.final_model().empty()) {
      fields.emplace_back("final_model", next.final_model());
    }
    const bool bad = next.state() == v1::JOB_STATE_FAILED || next.state() == v1::JOB_STATE_RESTARTING;
    LogEvent(bad ? LogLevel::kWarn : LogLevel::kInfo, "coordinator", "job_state", fields);
  }
  bool was_active = !IsTerminal(from) && from != v1::JOB_STATE_UNSPECIFIED;
  entry.job = std::move(next);
  entry.last_event_seq = seq;
  if (was_active && IsTerminal(entry.job.state())) --active_jobs_;
  TrackIndexes(entry);

  for (const v1::Event& ev : stored) {
    v1::JobUpdate u;
    *u.mutable_event() = ev;
    hub_->Publish(entry.job.id(), u);
  }
  v1::JobUpdate snapshot;
  *snapshot.mutable_job() = entry.job;
  snapshot.mutable_job()->clear_attempts();
  hub_->Publish(entry.job.id(), snapshot);
  if (IsTerminal(entry.job.state()) && IsTerminal(from) == false) hub_->JobEnded(entry.job.id());
  return absl::OkStatus();
}

// --- client API --------------------------------------------------------------

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec, const std::string& owner,
                                           const std::string& owner_token_id) {
  TRAINCTL_RETURN_IF_ERROR(SpecErrorsToStatus(ValidateJobSpec(spec)));
  if (active_jobs_ >= options_.max_active_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the coordinator holds ", active_jobs_, " unfinished jobs (its limit)"));
  }
  JobEntry entry;
  entry.submit_seq = next_submit_seq_++;
  v1::Job job;
  job.set_id(NewJobId(spec.name()));
  *job.mutable_spec() = spec;
  ResolveJobSpecDefaults(job.mutable_spec());
  if (std::string* dir = job.mutable_spec()->mutable_checkpoint()->mutable_dir(); !dir->empty()) {
    absl::StrReplaceAll({{"{job_id}", job.id()}}, dir);
  }
  if (!job.spec().resume_from().job().empty()) TRAINCTL_RETURN_IF_ERROR(AttachResumeSource(job));
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_owner(owner);
  job.set_owner_token_id(owner_token_id);
  SetTimestamp(clock_->Now(), job.mutable_submit_time());
  job.mutable_progress()->set_epochs(job.spec().training().epochs());
  job.mutable_progress()->set_eta_seconds(-1);
  ++active_jobs_;
  auto [it, inserted] = jobs_.emplace(job.id(), std::move(entry));
  it->second.job.set_id(job.id());
  std::string submitted = absl::StrCat("job submitted: ", job.spec().world_size(), " rank(s)");
  if (job.checkpoints_size() > 0) {
    absl::StrAppend(&submitted, "; continues from ", DescribeRecord(job.checkpoints(0)));
  }
  absl::Status s = Commit(it->second, job, {{"submitted", submitted}});
  if (!s.ok()) {
    --active_jobs_;
    jobs_.erase(it);
    return absl::UnavailableError(absl::StrCat("could not store the job: ", s.message()));
  }
  RequestSchedule();
  return jobs_.at(job.id()).job;
}

absl::Status JobManager::AttachResumeSource(v1::Job& job) const {
  const std::string& from = job.spec().resume_from().job();
  auto it = jobs_.find(from);
  if (it == jobs_.end()) return absl::InvalidArgumentError(absl::StrCat("resume_from.job: no job ", from));
  const v1::Job& source = it->second.job;
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
  const int64_t done = newest.front()->epochs_done();
  if (done >= job.spec().training().epochs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.epochs: ", job.spec().training().epochs(), ", but job ", from, "'s checkpoint already completed ",
        done, " epoch(s); set it above ", done, " (e.g. --set training.epochs=", done + 1, ")"));
  }
  for (const v1::CheckpointRecord* r : newest) *job.add_checkpoints() = *r;
  return absl::OkStatus();
}

absl::StatusOr<v1::SubmitJobResponse> JobManager::DryRun(const v1::JobSpec& spec) {
  TRAINCTL_RETURN_IF_ERROR(SpecErrorsToStatus(ValidateJobSpec(spec)));
  v1::SubmitJobResponse resp;
  v1::Job* job = resp.mutable_job();
  *job->mutable_spec() = spec;
  ResolveJobSpecDefaults(job->mutable_spec());
  job->set_state(v1::JOB_STATE_PENDING);

  std::vector<scheduler::WorkerSlots> workers = WorkerView();
  scheduler::PendingJob pj;
  pj.job_id = "dry-run";
  pj.world_size = job->spec().world_size();
  pj.device = ToRequirement(job->spec().device());
  pj.min_world_size = ElasticMinimum(*job, clock_->Now());
  absl::flat_hash_set<std::string> command_jobs;
  if (job->spec().has_command()) command_jobs.insert(pj.job_id);
  TRAINCTL_ASSIGN_OR_RETURN(scheduler::ScheduleResult result,
                            ScheduleWithCommands({pj}, command_jobs, workers, AllowingCommands()));
  if (!result.placements.empty()) {
    const scheduler::Placement& p = result.placements[0];
    for (const scheduler::RankAssignment& r : p.ranks) {
      v1::RankAssignment* a = resp.add_planned();
      a->set_rank(r.rank);
      a->set_local_rank(r.local_rank);
      a->set_node_rank(r.node_rank);
      a->set_world_size(p.world_size);
      a->set_local_world_size(r.local_world_size);
      a->set_num_nodes(p.num_nodes);
      a->set_worker_id(r.worker_id);
      if (const v1::Worker* w = registry_->Find(r.worker_id)) a->set_host(w->hostname());
      a->mutable_slot()->set_index(r.slot);
      a->mutable_slot()->set_kind(p.kind == scheduler::SlotKind::kGpu ? v1::Slot::KIND_GPU
                                                                      : v1::Slot::KIND_CPU);
    }
  } else if (!result.pending.empty()) {
    resp.set_pending_reason(result.pending[0].message);
  }
  return resp;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  v1::Job job = it->second.job;
  if (auto r = pending_reasons_.find(job_id); r != pending_reasons_.end()) {
    job.set_state_reason(r->second);
  }
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobManager::List(const v1::ListJobsRequest& req) const {
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size: must be >= 0");
  int page = req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  int64_t before = INT64_MAX;
  if (!req.page_token().empty()) {
    if (!absl::SimpleAtoi(req.page_token(), &before)) {
      return absl::InvalidArgumentError("page_token: not a token from a previous response");
    }
  }
  for (int s : req.states()) {
    if (!v1::JobState_IsValid(s) || s == 0) {
      return absl::InvalidArgumentError(absl::StrCat("states: unknown state ", s));
    }
  }
  // Newest first: order by submit_seq descending.
  std::vector<const JobEntry*> all;
  for (const auto& [id, e] : jobs_) {
    if (e.submit_seq >= before) continue;
    if (req.states_size() > 0 &&
        std::find(req.states().begin(), req.states().end(), e.job.state()) == req.states().end()) {
      continue;
    }
    all.push_back(&e);
  }
  std::sort(all.begin(), all.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->submit_seq > b->submit_seq; });
  // A page ends at `page` jobs or kMaxListBytes, whichever comes first, so
  // no response can exceed the message limit (specs are at most 1 MiB each).
  v1::ListJobsResponse resp;
  size_t bytes = 0, taken = 0;
  for (; taken < all.size() && static_cast<int>(taken) < page; ++taken) {
    v1::Job j = all[taken]->job;
    j.clear_attempts();
    j.clear_checkpoints();
    if (auto r = pending_reasons_.find(j.id()); r != pending_reasons_.end()) j.set_state_reason(r->second);
    const size_t size = j.ByteSizeLong() + 8;  // with its field tag and length
    if (taken > 0 && bytes + size > kMaxListBytes) break;
    bytes += size;
    *resp.add_jobs() = std::move(j);
  }
  if (taken < all.size()) resp.set_next_page_token(absl::StrCat(all[taken - 1]->submit_seq));
  return resp;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id, const std::string& reason) {
  JobEntry* e = FindEntry(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(e->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", StateName(e->job.state()), ")"));
  }
  if (reason.size() > 1024) return absl::InvalidArgumentError("reason: at most 1024 bytes");
  std::string why = reason.empty() ? "cancelled by a user" : absl::StrCat("cancelled: ", reason);
  v1::Job next = e->job;
  next.set_state(v1::JOB_STATE_CANCELLED);
  next.set_state_reason(why);
  v1::Attempt* a = CurrentAttempt(next);
  RanksByWorker to_stop;
  if (a != nullptr && !AttemptEnded(a->state())) {
    a->set_state(v1::ATTEMPT_STATE_CANCELLED);
    a->set_reason(why);
    a->set_failure_kind(v1::FAILURE_KIND_CANCELLED);
    SetTimestamp(clock_->Now(), a->mutable_end_time());
    to_stop = LiveRanksByWorker(*a);
  }
  TRAINCTL_RETURN_IF_ERROR(Commit(*e, std::move(next), {{"cancelled", why}}));
  const v1::Attempt* cur = CurrentAttempt(e->job);
  for (auto& [w, ranks] : to_stop) SendStop(w, job_id, cur->number(), ranks, why);
  RequestSchedule();
  return e->job;
}

// --- messages to workers -----------------------------------------------------

void JobManager::LaunchAttempt(JobEntry& e, const v1::Attempt& attempt) {
  if (!options_.preflight) {
    for (const std::string& w : AttemptWorkers(attempt)) SendStartRanks(e, attempt, w);
    return;
  }
  e.preflight_attempt = attempt.number();
  e.preflight_reports.clear();
  e.preflight_passed = false;
  for (const std::string& w : AttemptWorkers(attempt)) SendPreflight(e, attempt, w);
}

void JobManager::SendPreflight(const JobEntry& e, const v1::Attempt& attempt, const std::string& worker_id) {
  v1::CoordinatorMessage msg;
  v1::Preflight* p = msg.mutable_preflight();
  p->set_job_id(e.job.id());
  p->set_attempt(attempt.number());
  *p->mutable_spec() = e.job.spec();
  if (attempt.has_resume()) *p->mutable_resume() = attempt.resume();
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (r.worker_id() == worker_id) *p->add_ranks() = r;
  }
  registry_->Send(worker_id, msg);
}

absl::Status JobManager::OnPreflightReport(const std::string& worker_id, const v1::PreflightReport& rep) {
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e,
                            EntryForWorker(worker_id, rep.job_id(), rep.attempt(), -1, false, &a_mem));
  const std::vector<std::string> workers = AttemptWorkers(*a_mem);
  if (std::find(workers.begin(), workers.end(), worker_id) == workers.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("preflight: worker ", worker_id, " holds no rank of attempt ", rep.attempt(), " of ", rep.job_id()));
  }
  if (rep.problems_size() > 64) return absl::InvalidArgumentError("preflight.problems: at most 64 lines");
  for (const std::string& p : rep.problems()) {
    if (p.size() > 2048) return absl::InvalidArgumentError("preflight.problems: a line is over 2048 bytes");
  }
  if (IsTerminal(e->job.state()) || AttemptEnded(a_mem->state())) return absl::AbortedError("the attempt already ended");
  if (e->preflight_attempt != rep.attempt() || e->preflight_passed) return absl::OkStatus();  // stale or a re-send
  e->preflight_reports[worker_id] = {rep.problems().begin(), rep.problems().end()};
  for (const std::string& w : workers) {
    if (e->preflight_reports.count(w) == 0) return absl::OkStatus();  // more to come
  }
  std::vector<std::string> failing;
  for (const std::string& w : workers) {
    const std::vector<std::string>& problems = e->preflight_reports[w];
    if (!problems.empty()) failing.push_back(absl::StrCat(w, ": ", absl::StrJoin(problems, "; ")));
  }
  if (failing.empty()) {
    e->preflight_passed = true;
    const v1::Attempt& cur = *CurrentAttempt(e->job);
    for (const std::string& w : workers) SendStartRanks(*e, cur, w);
    return absl::OkStatus();
  }
  // One reason naming every failing worker; no rank was started.
  std::string reason = absl::StrCat("pre-flight failed: ", absl::StrJoin(failing, "; "));
  v1::Job next = e->job;
  for (v1::RankAssignment& r : *CurrentAttempt(next)->mutable_ranks()) {
    // Never started: ended here, so their slots are free at once.
    if (IsTerminal(r.state())) continue;
    r.set_state(v1::RANK_STATE_STOPPED);
    r.mutable_exit()->set_kind(v1::FAILURE_KIND_PREFLIGHT);
    r.mutable_exit()->set_exit_code(-1);
    r.mutable_exit()->set_message("not started: pre-flight failed");
  }
  TRAINCTL_RETURN_IF_ERROR(CommitFailure(*e, std::move(next), {}, v1::FAILURE_KIND_PREFLIGHT, reason, -1));
  RequestSchedule();
  return absl::OkStatus();
}

void JobManager::SendStartRanks(JobEntry& entry, const v1::Attempt& attempt,
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
  *s->mutable_skip_steps() = attempt.skip_steps();
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (r.worker_id() != worker_id) continue;
    *s->add_ranks() = r;
    if (r.rank() == 0) s->set_produce_rendezvous(true);
  }
  registry_->Send(worker_id, msg);
}

void JobManager::SendStop(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                          const std::vector<int32_t>& ranks, const std::string& reason) {
  v1::CoordinatorMessage msg;
  v1::StopRanks* s = msg.mutable_stop_ranks();
  s->set_job_id(job_id);
  s->set_attempt(attempt);
  for (int32_t r : ranks) s->add_ranks(r);
  s->set_reason(reason);
  s->set_grace_period_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(options_.stop_grace)));
  registry_->Send(worker_id, msg);
}

void JobManager::SendRendezvous(const v1::Job& job, const v1::Attempt& attempt,
                                const std::string& worker_id) {
  v1::CoordinatorMessage msg;
  v1::RendezvousDelivery* d = msg.mutable_rendezvous();
  d->set_job_id(job.id());
  d->set_attempt(attempt.number());
  *d->mutable_info() = attempt.rendezvous();
  registry_->Send(worker_id, msg);
}

// --- scheduling ---------------------------------------------------------------

std::vector<int> JobManager::BusySlots(const std::string& worker_id) const {
  std::vector<int> busy;
  for (const std::string& id : holding_slots_) {
    const v1::Job& job = jobs_.at(id).job;
    for (const v1::Attempt& a : job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        if (r.worker_id() == worker_id && !IsTerminal(r.state())) busy.push_back(r.slot().index());
      }
    }
  }
  return busy;
}

std::vector<scheduler::WorkerSlots> JobManager::WorkerView() const {
  absl::flat_hash_map<std::string, std::vector<int>> busy;
  for (const std::string& id : holding_slots_) {
    for (const v1::Attempt& a : jobs_.at(id).job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        if (!IsTerminal(r.state())) busy[r.worker_id()].push_back(r.slot().index());
      }
    }
  }
  std::vector<scheduler::WorkerSlots> workers;
  for (const v1::Worker* w : registry_->Alive()) {
    scheduler::WorkerSlots ws;
    ws.worker_id = w->id();
    ws.kind = w->slots(0).kind() == v1::Slot::KIND_GPU ? scheduler::SlotKind::kGpu
                                                       : scheduler::SlotKind::kCpu;
    ws.total_slots = w->slots_size();
    const std::vector<int>& b = busy[w->id()];
    for (const v1::Slot& s : w->slots()) {
      if (std::find(b.begin(), b.end(), s.index()) == b.end()) ws.free_slots.push_back(s.index());
    }
    workers.push_back(std::move(ws));
  }
  return workers;
}

absl::flat_hash_set<std::string> JobManager::AllowingCommands() const {
  absl::flat_hash_set<std::string> out;
  for (const v1::Worker* w : registry_->Alive()) {
    if (w->allow_commands()) out.insert(w->id());
  }
  return out;
}

void JobManager::RequestSchedule() {
  if (!post_) {
    Schedule();
    return;
  }
  if (schedule_requested_) return;
  schedule_requested_ = true;
  post_([this] {
    schedule_requested_ = false;
    Schedule();
  });
}

static bool IsElastic(const v1::JobSpec& spec) {
  return spec.has_elastic() && spec.elastic().min_ranks() >= 1 && spec.elastic().min_ranks() < spec.world_size();
}

absl::Time JobManager::ElasticDeadline(const v1::Job& job) const {
  if (!IsElastic(job.spec()) || job.attempts_size() == 0) return absl::InfiniteFuture();
  const v1::Attempt& last = job.attempts(job.attempts_size() - 1);
  if (!AttemptEnded(last.state()) || last.grow_to() > 0) return absl::InfiniteFuture();
  return FromTimestamp(last.end_time()) + absl::Seconds(job.spec().elastic().replace_timeout_s());
}

int JobManager::ElasticMinimum(const v1::Job& job, absl::Time now) const {
  if (!IsElastic(job.spec())) return 0;
  const v1::ElasticSpec& el = job.spec().elastic();
  const int world = job.spec().world_size();
  // A first attempt starts with what is free (at least min_ranks).
  if (job.attempts_size() == 0) return el.min_ranks();
  const v1::Attempt& last = job.attempts(job.attempts_size() - 1);
  // Stopped to grow: exactly the size it stopped for (or more).
  if (last.grow_to() > 0) return last.grow_to() >= world ? 0 : last.grow_to();
  // After a failure: the size it ran with until the replace timeout, then
  // what is free down to min_ranks.
  if (now >= ElasticDeadline(job)) return el.min_ranks();
  const int before = std::max(el.min_ranks(), last.ranks_size());
  return before >= world ? 0 : before;
}

void JobManager::MaybeGrow(JobEntry& e, const v1::CheckpointRecord& r) {
  const v1::JobSpec& spec = e.job.spec();
  if (!IsElastic(spec) || spec.elastic().grow() == v1::ELASTIC_GROW_NEVER) return;
  if (e.job.state() != v1::JOB_STATE_RUNNING) return;
  const v1::Attempt* a = CurrentAttempt(e.job);
  if (a == nullptr || a->state() != v1::ATTEMPT_STATE_RUNNING || a->number() != r.attempt()) return;
  const int ranks = a->ranks_size();
  if (ranks >= spec.world_size() || ranks == 0) return;
  if (spec.elastic().grow() == v1::ELASTIC_GROW_AT_EPOCH && r.epoch_consumed() != 0) return;
  if (r.epoch_consumed() == 0 && r.epochs_done() >= spec.training().epochs()) return;  // finishing anyway
  // Pending jobs of this priority or higher get free slots first.
  for (const std::string& id : pending_) {
    if (id != e.job.id() && jobs_.at(id).job.spec().priority() >= spec.priority()) return;
  }
  const bool gpu = a->ranks(0).slot().kind() == v1::Slot::KIND_GPU;
  int free = 0;
  for (const scheduler::WorkerSlots& w : WorkerView()) {
    if ((w.kind == scheduler::SlotKind::kGpu) == gpu) free += static_cast<int>(w.free_slots.size());
  }
  if (free < 1) return;
  const int target = std::min(spec.world_size(), ranks + free);
  v1::Job next = e.job;
  v1::Attempt* na = CurrentAttempt(next);
  const std::string why = absl::StrCat("elastic: growing from ", ranks, " to ", target, " ranks (", free,
                                       " slot(s) free) at the checkpoint of step ", r.global_step());
  na->set_state(v1::ATTEMPT_STATE_CANCELLED);
  na->set_reason(why);
  na->set_grow_to(target);
  SetTimestamp(clock_->Now(), na->mutable_end_time());
  RanksByWorker to_stop = LiveRanksByWorker(*na);
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_state_reason(why);
  if (absl::Status s = Commit(e, std::move(next), {{"resizing", why, a->number()}}); !s.ok()) {
    std::cerr << "coordinator: " << s << " (growing at a later checkpoint)\n";
    return;
  }
  const v1::Attempt* cur = CurrentAttempt(e.job);
  for (auto& [w, rs] : to_stop) SendStop(w, e.job.id(), cur->number(), rs, why);
  RequestSchedule();
}

void JobManager::Schedule() {
  if (pending_.empty()) return;
  std::vector<scheduler::WorkerSlots> workers = WorkerView();
  const absl::Time sched_now = clock_->Now();
  std::vector<scheduler::PendingJob> jobs;
  absl::flat_hash_set<std::string> command_jobs;
  for (const std::string& id : pending_) {
    const JobEntry& e = jobs_.at(id);
    if (e.job.spec().has_command()) command_jobs.insert(id);
    scheduler::PendingJob pj;
    pj.job_id = id;
    pj.world_size = e.job.spec().world_size();
    pj.device = ToRequirement(e.job.spec().device());
    pj.priority = e.job.spec().priority();
    pj.submit_seq = static_cast<uint64_t>(e.submit_seq);
    pj.min_world_size = ElasticMinimum(e.job, sched_now);
    if (e.job.spec().stragglers().policy() == v1::STRAGGLER_POLICY_AVOID) pj.avoid_workers = e.avoid_workers;
    jobs.push_back(std::move(pj));
  }
  absl::StatusOr<scheduler::ScheduleResult> result =
      ScheduleWithCommands(jobs, command_jobs, workers, AllowingCommands());
  if (!result.ok()) return;  // Inputs come from validated state; nothing to place.

  for (const scheduler::PendingJobStatus& p : result->pending) pending_reasons_[p.job_id] = p.message;

  absl::Time now = clock_->Now();
  for (scheduler::Placement& p : result->placements) {
    JobEntry& e = jobs_.at(p.job_id);
    v1::Job next = e.job;
    auto [resume, resume_words] = ChooseResume(next, p);
    if (!resume.has_value() && next.attempts_size() == 0 && !next.spec().resume_from().job().empty()) {
      // Asked to continue another job: never silently from scratch. Wait for
      // a placement that includes a holder of its checkpoint.
      pending_reasons_[p.job_id] = absl::StrCat("waiting for slots that include the holder of ",
                                                DescribeRecord(*NewestRecords(next).front()));
      continue;
    }
    std::vector<int64_t> skip = RollbackSkipSteps(next);
    v1::Attempt* a = next.add_attempts();
    a->set_number(next.attempts_size());
    for (int64_t step : skip) a->add_skip_steps(step);
    a->set_state(v1::ATTEMPT_STATE_STARTING);
    SetTimestamp(now, a->mutable_start_time());
    if (resume.has_value()) {
      *a->mutable_resume() = *resume;
      a->set_resumed_from(absl::StrCat(resume->path(), " on ", Holder(*resume)));
    }
    std::vector<std::string> hosts;
    for (const scheduler::RankAssignment& r : p.ranks) {
      v1::RankAssignment* ra = a->add_ranks();
      ra->set_job_id(next.id());
      ra->set_attempt(a->number());
      ra->set_rank(r.rank);
      ra->set_local_rank(r.local_rank);
      ra->set_node_rank(r.node_rank);
      ra->set_world_size(p.world_size);
      ra->set_local_world_size(r.local_world_size);
      ra->set_num_nodes(p.num_nodes);
      ra->set_worker_id(r.worker_id);
      const v1::Worker* w = registry_->Find(r.worker_id);
      ra->set_host(w != nullptr ? w->hostname() : "");
      if (w != nullptr) {
        for (const v1::Slot& s : w->slots()) {
          if (s.index() == r.slot) *ra->mutable_slot() = s;
        }
      }
      ra->set_state(v1::RANK_STATE_ASSIGNED);
      SetTimestamp(now, ra->mutable_last_progress_time());
      if (r.local_rank == 0) hosts.push_back(absl::StrCat(ra->host(), "×", r.local_world_size));
    }
    next.set_state(v1::JOB_STATE_SCHEDULED);
    next.set_state_reason("");
    if (!next.has_start_time()) SetTimestamp(now, next.mutable_start_time());
    e.last_points.clear();
    std::string msg = absl::StrCat("attempt ", a->number(), " placed on ", absl::StrJoin(hosts, ", "));
    if (!resume_words.empty()) absl::StrAppend(&msg, "; ", resume_words);
    std::vector<EventSpec> placed_events;
    if (IsElastic(next.spec())) {
      const int before = next.attempts_size() >= 2 ? next.attempts(next.attempts_size() - 2).ranks_size()
                                                   : next.spec().world_size();
      if (p.world_size != before) {
        std::string why = p.world_size < before
                              ? absl::StrCat("no replacement within elastic.replace_timeout_s = ",
                                             next.spec().elastic().replace_timeout_s(), " s")
                              : std::string("slots freed up");
        if (next.attempts_size() == 1) why = "the slots free at the start";
        placed_events.push_back({"resized",
                                 absl::StrCat("world size ", before, " -> ", p.world_size, " (", why,
                                              "; elastic between ", next.spec().elastic().min_ranks(), " and ",
                                              next.spec().world_size(), ")"),
                                 a->number()});
      }
    }
    placed_events.insert(placed_events.begin(),
                         {"scheduled", msg, static_cast<int32_t>(e.job.attempts_size() + 1)});
    if (absl::Status s = Commit(e, std::move(next), std::move(placed_events)); !s.ok()) {
      std::cerr << "coordinator: " << s << " (placed again at the next tick)\n";
      schedule_retry_ = true;  // Stays pending; Tick asks for another pass.
      continue;
    }
    LaunchAttempt(e, *CurrentAttempt(e.job));
  }
}

std::pair<std::optional<v1::CheckpointRecord>, std::string> JobManager::ChooseResume(
    const v1::Job& job, scheduler::Placement& p) const {
  if (job.checkpoints_size() == 0) return {std::nullopt, ""};
  std::vector<const v1::CheckpointRecord*> newest = NewestRecords(job);
  auto holds = [](const v1::CheckpointRecord& r, const std::string& worker) {
    return r.shared() || r.worker_id() == worker;
  };
  scheduler::PreferNodeZero(p, [&](const std::string& w) {
    return std::any_of(newest.begin(), newest.end(), [&](const v1::CheckpointRecord* r) { return holds(*r, w); });
  });
  const std::string rank0 = p.ranks.empty() ? "" : p.ranks.front().worker_id;
  // Newest first; the first record rank 0's host can read wins.
  std::vector<const v1::CheckpointRecord*> all;
  for (const v1::CheckpointRecord& r : job.checkpoints()) all.push_back(&r);
  std::stable_sort(all.begin(), all.end(), [](const v1::CheckpointRecord* a, const v1::CheckpointRecord* b) {
    return a->global_step() > b->global_step();
  });
  auto unreachable = [&](const v1::CheckpointRecord& r) {
    const v1::Worker* w = registry_->Find(r.worker_id());
    std::string why = w == nullptr || w->state() != v1::WORKER_STATE_ALIVE
                          ? absl::StrCat("worker ", r.worker_id(), " is not alive")
                          : absl::StrCat("worker ", r.worker_id(), " is not in this placement");
    return absl::StrCat(DescribeRecord(r), " is unreachable (", why, ")");
  };
  for (const v1::CheckpointRecord* r : all) {
    if (!holds(*r, rank0)) continue;
    std::string words = absl::StrCat("resuming from ", DescribeRecord(*r));
    if (r->global_step() < newest.front()->global_step()) {
      absl::StrAppend(&words, "; the newer ", unreachable(*newest.front()));
    }
    return {*r, words};
  }
  return {std::nullopt, absl::StrCat("starting from scratch: ", unreachable(*newest.front()))};
}

// --- failures and restarts ------------------------------------------------------

int64_t JobManager::NanStep(const v1::Attempt& a) {
  int64_t step = -1;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.exit().kind() == v1::FAILURE_KIND_NAN && (step < 0 || r.exit().step() < step)) step = r.exit().step();
  }
  return step;
}

std::vector<int64_t> JobManager::RollbackSkipSteps(const v1::Job& job) {
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

JobManager::RanksByWorker JobManager::BuildAttemptFailure(v1::Job& next,
                                                         std::vector<EventSpec>& events,
                                                         absl::Time now, v1::FailureKind kind,
                                                         const std::string& reason,
                                                         int failed_rank) {
  v1::Attempt* a = CurrentAttempt(next);
  if (a == nullptr || AttemptEnded(a->state()) || IsTerminal(next.state())) return {};
  a->set_state(v1::ATTEMPT_STATE_FAILED);
  a->set_reason(reason);
  a->set_failure_kind(kind);
  SetTimestamp(now, a->mutable_end_time());
  RanksByWorker to_stop = LiveRanksByWorker(*a);
  int32_t max_restarts = next.spec().restart().max_restarts();
  events.push_back({"attempt_failed", reason, a->number(), failed_rank});
  // A full disk gets one more attempt (space may have been freed); the same
  // failure twice in a row fails the job instead of burning every restart.
  const bool disk_full_again = kind == v1::FAILURE_KIND_DISK_FULL && next.attempts_size() >= 2 &&
                               next.attempts(next.attempts_size() - 2).failure_kind() == v1::FAILURE_KIND_DISK_FULL;
  const v1::HealthSpec& health = next.spec().health();
  const int32_t max_rollbacks = health.has_max_rollbacks() ? health.max_rollbacks() : 3;
  const int64_t nan_step = kind == v1::FAILURE_KIND_NAN ? NanStep(*a) : -1;
  if (kind == v1::FAILURE_KIND_NAN) {
    // Numerical health: its own budget, not restart.max_restarts.
    int32_t used = 0;
    for (const v1::Attempt& x : next.attempts()) {
      if (&x != a && x.failure_kind() == v1::FAILURE_KIND_NAN) ++used;
    }
    if (health.on_nan() == v1::HealthSpec::ON_NAN_FAIL) {
      next.set_state(v1::JOB_STATE_FAILED);
      next.set_state_reason(absl::StrCat(reason, "\n(health.on_nan: fail)"));
      events.push_back({"failed", absl::StrCat("NaN/Inf at step ", nan_step, "; health.on_nan: fail"), a->number()});
    } else if (used >= max_rollbacks) {
      next.set_state(v1::JOB_STATE_FAILED);
      next.set_state_reason(absl::StrCat(reason, "\n(no rollbacks left: ", used, " of ", max_rollbacks, " used)"));
      events.push_back({"failed", absl::StrCat("NaN/Inf at step ", nan_step, "; no rollbacks left (health.max_rollbacks: ",
                                               max_rollbacks, ")"),
                        a->number()});
    } else {
      next.set_state(v1::JOB_STATE_RESTARTING);
      next.set_state_reason(absl::StrCat("rolling back after: ", reason));
      const v1::CheckpointRecord* newest = nullptr;
      for (const v1::CheckpointRecord& r : next.checkpoints()) {
        if (newest == nullptr || r.global_step() > newest->global_step()) newest = &r;
      }
      events.push_back({"rollback",
                        absl::StrCat("NaN/Inf at step ", nan_step, ": rolling back to ",
                                     newest != nullptr ? absl::StrCat("the checkpoint at step ", newest->global_step())
                                                       : std::string("the start (no checkpoint recorded yet)"),
                                     " and skipping step ", nan_step, " (rollback ", used + 1, " of ", max_rollbacks, ")"),
                        a->number(), failed_rank});
    }
  } else if (kind == v1::FAILURE_KIND_OUT_OF_MEMORY) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(out of memory: not restarted; the same batch needs the same memory)"));
    events.push_back({"failed", "out of memory; lower data.batch_size", a->number()});
  } else if (kind == v1::FAILURE_KIND_DATA) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(a data error: not restarted)"));
    events.push_back({"failed", "data error; restarting cannot help", a->number()});
  } else if (kind == v1::FAILURE_KIND_PREFLIGHT) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(pre-flight: not restarted)"));
    events.push_back({"failed", "pre-flight failed; fix what it names and submit again", a->number()});
  } else if (disk_full_again) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(the disk was full in the previous attempt too: not restarted again)"));
    events.push_back({"failed", "disk full twice in a row; free space or change checkpoint.dir", a->number()});
  } else if (kind == v1::FAILURE_KIND_HANG && next.spec().restart().on_hang() == v1::HANG_POLICY_FAIL) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(restart.on_hang: fail)"));
    events.push_back({"failed", "hung, and restart.on_hang is fail", a->number()});
  } else if (kind == v1::FAILURE_KIND_CONFIG) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(a configuration or data error: not restarted)"));
    events.push_back({"failed", "configuration or data error; restarting cannot help", a->number()});
  } else if (next.restarts() >= max_restarts) {
    next.set_state(v1::JOB_STATE_FAILED);
    next.set_state_reason(absl::StrCat(reason, "\n(no restarts left: ", next.restarts(), " of ",
                                       max_restarts, " used)"));
    events.push_back({"failed", absl::StrCat("no restarts left (max_restarts: ", max_restarts, ")"),
                      a->number()});
  } else {
    next.set_state(v1::JOB_STATE_RESTARTING);
    next.set_restarts(next.restarts() + 1);
    next.set_state_reason(absl::StrCat("restarting after: ", reason));
    events.push_back({"restarting",
                      absl::StrCat("restart ", next.restarts(), " of ", max_restarts,
                                   next.checkpoints_size() > 0 ? ", from the newest checkpoint it can reach"
                                                               : ", from scratch (no checkpoint recorded yet)"),
                      a->number()});
  }
  return to_stop;
}

absl::Status JobManager::CommitFailure(JobEntry& e, v1::Job next, std::vector<EventSpec> events,
                                       v1::FailureKind kind, const std::string& reason,
                                       int failed_rank) {
  RanksByWorker to_stop =
      BuildAttemptFailure(next, events, clock_->Now(), kind, reason, failed_rank);
  TRAINCTL_RETURN_IF_ERROR(Commit(e, std::move(next), std::move(events)));
  const v1::Attempt* a = CurrentAttempt(e.job);
  for (auto& [w, ranks] : to_stop) SendStop(w, e.job.id(), a->number(), ranks, "a peer rank failed");
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
    a->set_state(v1::ATTEMPT_STATE_SUCCEEDED);
    SetTimestamp(clock_->Now(), a->mutable_end_time());
    next.set_state(v1::JOB_STATE_SUCCEEDED);
    next.set_state_reason("");
    next.mutable_progress()->set_eta_seconds(0);
    int32_t number = a->number();
    s = Commit(e, std::move(next), {{"succeeded", "every rank finished training", number}});
  } else {
    std::string reason = DescribeExit(*failed, failed->exit());
    v1::FailureKind kind = failed->exit().kind();
    int rank = failed->rank();
    s = CommitFailure(e, std::move(next), {}, kind, reason, rank);
  }
  if (!s.ok()) {
    std::cerr << "coordinator: " << s << " (retried at the next tick)\n";
    return false;
  }
  RequestSchedule();
  return true;
}

// --- worker sessions ------------------------------------------------------------

absl::StatusOr<JobManager::JobEntry*> JobManager::EntryForWorker(
    const std::string& worker_id, const std::string& job_id, int32_t attempt, int32_t rank,
    bool allow_stale, v1::Attempt** attempt_out) {
  JobEntry* e = FindEntry(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job ", job_id));
  if (attempt < 1 || attempt > e->job.attempts_size()) {
    return absl::InvalidArgumentError(absl::StrCat("attempt: job ", job_id, " has no attempt ", attempt));
  }
  bool stale = attempt != e->job.attempts_size();
  if (stale && !allow_stale) {
    return absl::AbortedError(absl::StrCat("attempt ", attempt, " of job ", job_id,
                                           " is stale (current: ", e->job.attempts_size(), ")"));
  }
  v1::Attempt* a = e->job.mutable_attempts(attempt - 1);
  if (rank >= 0) {
    if (rank >= a->ranks_size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " is not in [0, ", a->ranks_size(), ")"));
    }
    if (a->ranks(rank).worker_id() != worker_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("rank ", rank, " of ", job_id, " is not assigned to worker ", worker_id));
    }
  }
  *attempt_out = a;
  return e;
}

absl::Status JobManager::OnRankStatus(const std::string& worker_id, const v1::RankStatus& st) {
  absl::Status s = ApplyRankStatus(worker_id, st, /*may_hold=*/true);
  // UNAVAILABLE only comes from a failed write: memory is untouched, and the
  // worker will not send this again, so Tick replays it until it is stored.
  if (s.code() == absl::StatusCode::kUnavailable) HoldReport(worker_id, st, clock_->Now());
  return s;
}

void JobManager::HoldReport(const std::string& worker_id, const v1::RankStatus& st, absl::Time due) {
  held_reports_[ReportKey(st)] = HeldReport{worker_id, st, due};
}

std::optional<std::string> JobManager::LostPeer(const v1::Attempt& a, const std::string& except) const {
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.worker_id() == except || registry_->Connected(r.worker_id())) continue;
    const v1::Worker* w = registry_->Find(r.worker_id());
    return absl::StrCat("worker ", r.worker_id(), " (host ", w != nullptr ? w->hostname() : r.host(),
                        ") was lost");
  }
  return std::nullopt;
}

absl::Status JobManager::ApplyRankStatus(const std::string& worker_id, const v1::RankStatus& st,
                                         bool may_hold) {
  if (!v1::RankState_IsValid(st.state()) || st.state() == v1::RANK_STATE_UNSPECIFIED ||
      st.state() == v1::RANK_STATE_ASSIGNED) {
    return absl::InvalidArgumentError("rank_status.state: must be STARTING, RUNNING or an end state");
  }
  if (!v1::FailureKind_IsValid(st.exit().kind())) {
    return absl::InvalidArgumentError("rank_status.exit.kind: unknown failure kind");
  }
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, EntryForWorker(worker_id, st.job_id(), st.attempt(),
                                                         st.rank(), IsTerminal(st.state()), &a_mem));
  const bool current = st.attempt() == e->job.attempts_size();
  v1::Job next = e->job;
  v1::Attempt* a = next.mutable_attempts(st.attempt() - 1);
  v1::RankAssignment* r = a->mutable_ranks(st.rank());
  if (IsTerminal(r->state())) return absl::OkStatus();  // Already ended (e.g. worker lost).
  if (!current || IsTerminal(next.state()) || AttemptEnded(a->state())) {
    // Bookkeeping for a rank of an ended attempt: only its end matters (frees the slot).
    if (!IsTerminal(st.state())) {
      SendStop(worker_id, st.job_id(), st.attempt(), {st.rank()}, "attempt already ended");
      return absl::AbortedError(absl::StrCat("attempt ", st.attempt(), " of job ", st.job_id(), " ended"));
    }
    r->set_state(st.state() == v1::RANK_STATE_SUCCEEDED ? v1::RANK_STATE_SUCCEEDED : v1::RANK_STATE_STOPPED);
    *r->mutable_exit() = st.exit();
    TRAINCTL_RETURN_IF_ERROR(Commit(*e, std::move(next), {}));
    RequestSchedule();
    return absl::OkStatus();
  }

  absl::Time now = clock_->Now();
  r->set_state(st.state());
  SetTimestamp(now, r->mutable_last_progress_time());
  if (IsTerminal(st.state())) *r->mutable_exit() = st.exit();

  switch (st.state()) {
    case v1::RANK_STATE_STARTING:
      return Commit(*e, std::move(next), {});
    case v1::RANK_STATE_RUNNING: {
      bool all = std::all_of(a->ranks().begin(), a->ranks().end(), [](const v1::RankAssignment& x) {
        return x.state() == v1::RANK_STATE_RUNNING || x.state() == v1::RANK_STATE_SUCCEEDED;
      });
      std::vector<EventSpec> events;
      if (all && a->state() == v1::ATTEMPT_STATE_STARTING) {
        a->set_state(v1::ATTEMPT_STATE_RUNNING);
        next.set_state(v1::JOB_STATE_RUNNING);
        next.set_state_reason("");
        // Hang detection counts from here for every rank.
        for (v1::RankAssignment& x : *a->mutable_ranks()) SetTimestamp(now, x.mutable_last_progress_time());
        events.push_back({"running", absl::StrCat("all ", a->ranks_size(), " ranks ready"), a->number()});
      }
      return Commit(*e, std::move(next), std::move(events));
    }
    case v1::RANK_STATE_SUCCEEDED: {
      bool all = std::all_of(a->ranks().begin(), a->ranks().end(), [](const v1::RankAssignment& x) {
        return x.state() == v1::RANK_STATE_SUCCEEDED;
      });
      std::vector<EventSpec> events;
      if (all) {
        a->set_state(v1::ATTEMPT_STATE_SUCCEEDED);
        SetTimestamp(now, a->mutable_end_time());
        next.set_state(v1::JOB_STATE_SUCCEEDED);
        next.set_state_reason("");
        next.mutable_progress()->set_eta_seconds(0);
        events.push_back({"succeeded", "every rank finished training", a->number()});
      }
      TRAINCTL_RETURN_IF_ERROR(Commit(*e, std::move(next), std::move(events)));
      if (all) RequestSchedule();
      return absl::OkStatus();
    }
    case v1::RANK_STATE_FAILED:
    case v1::RANK_STATE_STOPPED: {
      // The rank's end and the attempt's failure, in one write.
      v1::FailureKind kind = st.exit().kind();
      std::string reason = DescribeExit(*r, st.exit());
      if (st.state() == v1::RANK_STATE_FAILED &&
          (kind == v1::FAILURE_KIND_COLLECTIVE || kind == v1::FAILURE_KIND_RENDEZVOUS)) {
        if (std::optional<std::string> lost = LostPeer(*a, worker_id)) {
          // A peer's death is the cause; this rank's error is its echo.
          reason = DescribeExit(*r, st.exit(), *lost);
          kind = v1::FAILURE_KIND_WORKER_LOST;
        } else if (may_hold && options_.lost_worker_wait > absl::ZeroDuration() &&
                   AttemptWorkers(*a).size() > 1) {
          HoldReport(worker_id, st, now + options_.lost_worker_wait);
          return absl::OkStatus();
        }
      }
      TRAINCTL_RETURN_IF_ERROR(CommitFailure(*e, std::move(next), {}, kind, reason, st.rank()));
      RequestSchedule();
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("rank_status.state: unexpected");
  }
}

JobGauges JobManager::Gauges() const {
  JobGauges g;
  g.straggler_events = straggler_events_;
  g.hangs_detected = hangs_detected_;
  const absl::Time now = clock_->Now();
  for (const auto& [id, e] : jobs_) {
    const v1::Job& job = e.job;
    ++g.jobs_by_state[job.state()];
    if (job.state() == v1::JOB_STATE_PENDING) {
      ++g.queue_length;
      g.oldest_pending_seconds =
          std::max(g.oldest_pending_seconds, absl::ToDoubleSeconds(now - FromTimestamp(job.submit_time())));
    }
    for (int i = 0; i < job.attempts_size(); ++i) {
      const bool followed = i + 1 < job.attempts_size() || job.state() == v1::JOB_STATE_RESTARTING;
      if (job.attempts(i).state() == v1::ATTEMPT_STATE_FAILED && followed) {
        ++g.restarts_by_kind[job.attempts(i).failure_kind()];
      }
    }
    if (job.state() != v1::JOB_STATE_RUNNING) continue;
    JobGauges::Running r;
    r.id = id;
    r.samples_per_sec = job.progress().samples_per_sec();
    r.loss = job.progress().last_loss();
    if (job.attempts_size() > 0) r.world_size = job.attempts(job.attempts_size() - 1).ranks_size();
    for (const auto& [rank, p] : e.last_points) {
      r.data_ms += p.data_ms();
      r.compute_ms += p.compute_ms();
      r.comm_ms += p.comm_ms();
      if (rank == 0) r.loss_scale = p.loss_scale();
    }
    if (!e.last_points.empty()) {
      const double n = static_cast<double>(e.last_points.size());
      r.data_ms /= n;
      r.compute_ms /= n;
      r.comm_ms /= n;
    }
    g.running.push_back(std::move(r));
  }
  return g;
}

absl::Status JobManager::OnFinalModel(const std::string& worker_id, const v1::FinalModelReport& rep) {
  if (rep.path().empty() || rep.path()[0] != '/' || rep.path().size() > 4096 ||
      rep.path().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("final_model.path: must be an absolute path of at most 4096 bytes");
  }
  if (rep.rank() != 0) return absl::InvalidArgumentError("final_model.rank: only rank 0 reports the final model");
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, EntryForWorker(worker_id, rep.job_id(), rep.attempt(), rep.rank(),
                                                         /*allow_stale=*/false, &a));
  (void)a;
  e->final_model = rep;
  e->final_model_worker = worker_id;
  return absl::OkStatus();
}

absl::Status JobManager::OnCheckpoint(const std::string& worker_id, const v1::CheckpointReport& rep) {
  const v1::CheckpointRecord& in = rep.record();
  if (in.path().empty() || in.path()[0] != '/' || in.path().size() > 4096 ||
      in.path().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("checkpoint.record.path: must be an absolute path of at most 4096 bytes");
  }
  if (in.checksum().size() > 64) return absl::InvalidArgumentError("checkpoint.record.checksum: at most 64 bytes");
  // epochs_done is 0 for a checkpoint inside the first epoch (checkpoint.every_steps).
  if (in.epochs_done() < 0 || in.global_step() < 1 || in.size_bytes() < 0) {
    return absl::InvalidArgumentError("checkpoint.record: epochs_done must be >= 0, global_step >= 1 and size_bytes >= 0");
  }
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, EntryForWorker(worker_id, rep.job_id(), rep.attempt(), rep.rank(),
                                                         /*allow_stale=*/true, &a_mem));
  v1::Job next = e->job;
  const v1::CheckpointSpec& ck = next.spec().checkpoint();
  v1::CheckpointRecord r = in;
  r.set_job_id(next.id());
  r.set_attempt(rep.attempt());
  r.set_world_size(a_mem->ranks_size());
  r.set_shared(ck.shared());
  r.set_worker_id(ck.shared() ? "" : worker_id);
  r.set_spec_hash(CheckpointSpecHash(next.spec()));
  SetTimestamp(clock_->Now(), r.mutable_time());

  // Keep, per holder, this job's newest `keep` checkpoints by global step
  // (the rank deletes the older files the same way; a step identifies a
  // checkpoint, inside an epoch or after it); records of the job a resume
  // started from stay.
  google::protobuf::RepeatedPtrField<v1::CheckpointRecord> kept;
  std::vector<int64_t> steps;
  for (const v1::CheckpointRecord& x : next.checkpoints()) {
    if (x.job_id() == r.job_id() && x.worker_id() == r.worker_id() && x.shared() == r.shared() &&
        x.global_step() != r.global_step()) {
      steps.push_back(x.global_step());
    }
  }
  steps.push_back(r.global_step());
  std::sort(steps.rbegin(), steps.rend());
  const int64_t keep = std::max<int64_t>(1, ck.keep());
  const int64_t oldest_kept = steps[static_cast<size_t>(std::min<int64_t>(keep, steps.size()) - 1)];
  for (const v1::CheckpointRecord& x : next.checkpoints()) {
    bool same_holder = x.job_id() == r.job_id() && x.worker_id() == r.worker_id() && x.shared() == r.shared();
    if (same_holder && (x.global_step() == r.global_step() || x.global_step() < oldest_kept)) continue;
    *kept.Add() = x;
  }
  *kept.Add() = r;
  *next.mutable_checkpoints() = std::move(kept);
  std::string msg = absl::StrCat("checkpoint at epoch ", r.epochs_done(), " (step ", r.global_step(), ") on ",
                                 Holder(r), ": ", r.path(), " (", r.size_bytes(), " bytes)");
  if (r.epoch_consumed() > 0) {
    msg = absl::StrCat("checkpoint inside epoch ", r.epochs_done() + 1, " after ", r.epoch_consumed(),
                       " samples (step ", r.global_step(), ") on ", Holder(r), ": ", r.path(), " (",
                       r.size_bytes(), " bytes)");
  }
  TRAINCTL_RETURN_IF_ERROR(Commit(*e, std::move(next), {{"checkpoint", msg, rep.attempt(), rep.rank()}}));
  MaybeGrow(*e, r);
  return absl::OkStatus();
}

absl::Status JobManager::OnRendezvous(const std::string& worker_id, const v1::RendezvousReport& rep) {
  v1::Attempt* a_mem = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e,
                            EntryForWorker(worker_id, rep.job_id(), rep.attempt(), 0, false, &a_mem));
  const v1::RendezvousInfo& info = rep.info();
  switch (info.kind_case()) {
    case v1::RendezvousInfo::kNcclUniqueId:
      if (info.nccl_unique_id().size() != kNcclUniqueIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("rendezvous.info.nccl_unique_id: must be ", kNcclUniqueIdBytes, " bytes, got ",
                                                       info.nccl_unique_id().size()));
      }
      break;
    case v1::RendezvousInfo::kGlooStoreAddress:
      if (info.gloo_store_address().empty() || info.gloo_store_address().size() > 255) {
        return absl::InvalidArgumentError("rendezvous.info.gloo_store_address: host:port, at most 255 bytes");
      }
      break;
    default:
      return absl::InvalidArgumentError("rendezvous.info: set nccl_unique_id or gloo_store_address");
  }
  if (info.master_addr().size() > 255 || info.master_port() < 0 || info.master_port() > 65535) {
    return absl::InvalidArgumentError("rendezvous.info.master_addr/master_port: out of range");
  }
  if (IsTerminal(e->job.state()) || AttemptEnded(a_mem->state())) {
    return absl::AbortedError("the attempt already ended");
  }
  v1::Job next = e->job;
  v1::Attempt* a = CurrentAttempt(next);
  *a->mutable_rendezvous() = info;
  TRAINCTL_RETURN_IF_ERROR(Commit(*e, std::move(next), {}));
  const v1::Attempt& cur = *CurrentAttempt(e->job);
  for (const std::string& w : AttemptWorkers(cur)) SendRendezvous(e->job, cur, w);
  return absl::OkStatus();
}

absl::Status JobManager::OnProgress(const std::string& worker_id, const v1::RankProgress& p) {
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e,
                            EntryForWorker(worker_id, p.job_id(), p.attempt(), p.rank(), false, &a));
  v1::RankAssignment* r = a->mutable_ranks(p.rank());
  const absl::Time now = clock_->Now();
  if (p.step() != r->last_step()) {
    r->set_last_step(p.step());
    SetTimestamp(now, r->mutable_last_progress_time());
  }
  if (p.has_heartbeat()) {
    if (e->watch.attempt() != p.attempt()) {
      e->watch = RankWatch(options_.rank_watch);
      e->watch.Reset(p.attempt());
    }
    const v1::StragglerSpec& st = e->job.spec().stragglers();
    const double threshold = st.policy() == v1::STRAGGLER_POLICY_OFF ? 0
                             : st.threshold() > 0                    ? st.threshold()
                                                                     : 0.3;
    e->watch.OnHeartbeat(p, now, threshold);
  }
  return absl::OkStatus();
}

absl::Status JobManager::OnMetrics(const std::string& worker_id, const v1::MetricBatch& batch) {
  if (batch.points_size() > 10000) return absl::InvalidArgumentError("metrics.points: at most 10000 per batch");
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e,
                            EntryForWorker(worker_id, batch.job_id(), batch.attempt(), -1, false, &a));
  for (const v1::MetricPoint& p : batch.points()) {
    if (p.rank() < 0 || p.rank() >= a->ranks_size() || a->ranks(p.rank()).worker_id() != worker_id) {
      return absl::InvalidArgumentError(absl::StrCat("metrics.points.rank: ", p.rank(), " is not on this worker"));
    }
  }
  TRAINCTL_RETURN_IF_ERROR(store_->AppendMetrics(batch));

  absl::Time now = clock_->Now();
  std::vector<EventSpec> events;
  for (const v1::MetricPoint& p : batch.points()) {
    v1::RankAssignment* r = a->mutable_ranks(p.rank());
    int64_t global_step = static_cast<int64_t>(p.epoch()) * std::max<int64_t>(p.steps_per_epoch(), 1) + p.step();
    if (global_step != r->last_step()) {
      r->set_last_step(global_step);
      SetTimestamp(now, r->mutable_last_progress_time());
    }
    v1::MetricSummary* sum = e->job.mutable_metric_summary();
    if (p.kind() == v1::MetricPoint::KIND_TRAIN) {
      e->last_points[p.rank()] = p;
      // Running mean of one rank's rate, times the ranks: all ranks together.
      const double world = std::max(1, a->ranks_size());
      double rank_mean = sum->mean_samples_per_sec() / world;
      sum->set_train_points(sum->train_points() + 1);
      rank_mean += (p.samples_per_sec() - rank_mean) / static_cast<double>(sum->train_points());
      sum->set_mean_samples_per_sec(rank_mean * world);
      if (p.rank() == 0) sum->set_last_loss(p.loss());
    }
    if (p.kind() == v1::MetricPoint::KIND_EPOCH_END && p.rank() == 0 && p.has_eval()) {
      *e->job.mutable_progress()->mutable_last_eval() = p.eval();
      if (!sum->has_best_eval() || p.eval().accuracy() > sum->best_eval().accuracy()) {
        *sum->mutable_best_eval() = p.eval();
      }
    }
    if (p.kind() == v1::MetricPoint::KIND_EPOCH_END && p.rank() == 0) {
      std::string msg = absl::StrFormat("epoch %d/%d done: loss %.4f", p.epoch() + 1,
                                        e->job.spec().training().epochs(), p.loss());
      if (p.has_eval()) {
        absl::StrAppendFormat(&msg, ", eval loss %.4f, accuracy %.4f", p.eval().loss(), p.eval().accuracy());
      }
      events.push_back({"epoch_end", msg, batch.attempt(), 0});
    }
  }
  // Progress: the slowest rank's position (latest train window per rank);
  // throughput summed over ranks.
  v1::Progress prog = e->job.progress();
  int64_t slowest = INT64_MAX;
  double samples_per_sec = 0, min_rate = 0;
  int64_t seen = 0;
  const v1::MetricPoint* slow_point = nullptr;
  for (const auto& [rank, p] : e->last_points) {
    int64_t g = static_cast<int64_t>(p.epoch()) * std::max<int64_t>(p.steps_per_epoch(), 1) + p.step();
    if (g < slowest) {
      slowest = g;
      slow_point = &p;
    }
    samples_per_sec += p.samples_per_sec();
    min_rate = min_rate == 0 ? p.samples_per_sec() : std::min(min_rate, p.samples_per_sec());
    seen += p.samples_seen();
  }
  if (slow_point != nullptr) {
    prog.set_epoch(slow_point->epoch());
    prog.set_step(slow_point->step());
    prog.set_steps_per_epoch(slow_point->steps_per_epoch());
    prog.set_samples_seen(seen);
    if (samples_per_sec > 0) prog.set_samples_per_sec(samples_per_sec);
    if (auto it = e->last_points.find(0); it != e->last_points.end()) {
      prog.set_last_loss(it->second.loss());
    }
    int64_t total = static_cast<int64_t>(e->job.spec().training().epochs()) * slow_point->steps_per_epoch();
    int32_t batch_size = e->job.spec().data().batch_size() * e->job.spec().training().grad_accumulation();
    if (min_rate > 0 && batch_size > 0 && total > 0) {
      double steps_per_sec = min_rate / batch_size;
      prog.set_eta_seconds(std::max<double>(0, static_cast<double>(total - slowest) / steps_per_sec));
    }
  }
  v1::JobUpdate u;
  *u.mutable_metrics() = batch;
  hub_->Publish(e->job.id(), u);
  if (!events.empty()) {
    v1::Job next = e->job;
    *next.mutable_progress() = prog;
    return Commit(*e, std::move(next), std::move(events));
  }
  // Progress alone is soft state: kept in memory, persisted with the next
  // transition, published to watchers now.
  *e->job.mutable_progress() = prog;
  v1::JobUpdate snap;
  *snap.mutable_job() = e->job;
  snap.mutable_job()->clear_attempts();
  hub_->Publish(e->job.id(), snap);
  return absl::OkStatus();
}

absl::Status JobManager::OnLogs(const std::string& worker_id, const v1::LogChunk& chunk) {
  if (chunk.lines_size() > 10000) return absl::InvalidArgumentError("logs.lines: at most 10000 per chunk");
  v1::Attempt* a = nullptr;
  TRAINCTL_ASSIGN_OR_RETURN(JobEntry * e, EntryForWorker(worker_id, chunk.job_id(), chunk.attempt(),
                                                         chunk.rank(), true, &a));
  (void)e;
  TRAINCTL_RETURN_IF_ERROR(store_->AppendLogs(chunk));
  hub_->PublishLogs(chunk);
  return absl::OkStatus();
}

void JobManager::OnWorkerRegistered(const std::string& worker_id, const v1::Register& msg) {
  // 0. Ends that happened while the worker was away come first.
  for (const v1::RankStatus& st : msg.ended()) {
    absl::Status s = OnRankStatus(worker_id, st);
    if (!s.ok() && s.code() != absl::StatusCode::kAborted) {
      std::cerr << "coordinator: worker " << worker_id << ": rank end reported at registration: "
                << s << "\n";
    }
  }
  // What the worker says it runs, by (job, attempt, rank).
  absl::flat_hash_map<std::string, const v1::RunningRank*> reported;
  for (const v1::RunningRank& r : msg.running()) {
    reported[absl::StrCat(r.job_id(), "/", r.attempt(), "/", r.rank())] = &r;
  }
  // 1. Ranks it runs that the coordinator no longer wants: stop them.
  for (const v1::RunningRank& r : msg.running()) {
    JobEntry* e = FindEntry(r.job_id());
    bool wanted = false;
    if (e != nullptr && !IsTerminal(e->job.state()) && r.attempt() == e->job.attempts_size()) {
      const v1::Attempt& a = *CurrentAttempt(e->job);
      wanted = !AttemptEnded(a.state()) && r.rank() >= 0 && r.rank() < a.ranks_size() &&
               a.ranks(r.rank()).worker_id() == worker_id && !IsTerminal(a.ranks(r.rank()).state());
    }
    if (!wanted) SendStop(worker_id, r.job_id(), r.attempt(), {r.rank()}, "not wanted after reconnect");
  }
  // 2. Ranks the coordinator placed there: resend, keep, or fail as vanished.
  std::vector<std::string> ids(holding_slots_.begin(), holding_slots_.end());
  for (const std::string& id : ids) {
    JobEntry& e = jobs_.at(id);
    v1::Job next = e.job;
    bool changed = false;
    std::vector<int32_t> vanished;
    std::vector<v1::RankStatus> ends;  // What changed, to replay if the write fails.
    for (int ai = 0; ai < next.attempts_size(); ++ai) {
      v1::Attempt* a = next.mutable_attempts(ai);
      bool current = ai == next.attempts_size() - 1 && !AttemptEnded(a->state()) && !IsTerminal(next.state());
      for (v1::RankAssignment& r : *a->mutable_ranks()) {
        if (r.worker_id() != worker_id || IsTerminal(r.state())) continue;
        bool there = reported.contains(absl::StrCat(id, "/", a->number(), "/", r.rank()));
        if (there) continue;
        if (current && r.state() == v1::RANK_STATE_ASSIGNED) continue;  // Resent below.
        // Gone while the worker was away.
        r.set_state(current ? v1::RANK_STATE_FAILED : v1::RANK_STATE_STOPPED);
        r.mutable_exit()->set_kind(v1::FAILURE_KIND_WORKER_LOST);
        r.mutable_exit()->set_message("the rank process was gone when its worker reconnected");
        changed = true;
        if (current) vanished.push_back(r.rank());
        v1::RankStatus& end = ends.emplace_back();
        end.set_job_id(id);
        end.set_attempt(a->number());
        end.set_rank(r.rank());
        end.set_state(r.state());
        *end.mutable_exit() = r.exit();
      }
    }
    if (changed) {
      absl::Status s;
      if (!vanished.empty()) {
        const v1::RankAssignment& r = CurrentAttempt(next)->ranks(vanished[0]);
        std::string reason = DescribeExit(r, r.exit());
        s = CommitFailure(e, std::move(next), {}, v1::FAILURE_KIND_WORKER_LOST, reason, vanished[0]);
      } else {
        s = Commit(e, std::move(next), {});
      }
      if (!s.ok()) {
        std::cerr << "coordinator: worker " << worker_id << " reconnected: " << s
                  << " (retried at the next tick)\n";
        for (const v1::RankStatus& end : ends) HoldReport(worker_id, end, clock_->Now());
        continue;
      }
      if (!vanished.empty()) continue;
    }
    const v1::Attempt* cur = CurrentAttempt(e.job);
    if (cur == nullptr || AttemptEnded(cur->state()) || IsTerminal(e.job.state())) continue;
    bool has_assigned = false;
    for (const v1::RankAssignment& r : cur->ranks()) {
      if (r.worker_id() == worker_id && r.state() == v1::RANK_STATE_ASSIGNED) has_assigned = true;
    }
    bool on_worker = std::any_of(cur->ranks().begin(), cur->ranks().end(),
                                 [&](const v1::RankAssignment& r) { return r.worker_id() == worker_id; });
    if (has_assigned) {
      if (options_.preflight && e.preflight_attempt == cur->number() && !e.preflight_passed) {
        if (e.preflight_reports.count(worker_id) == 0) SendPreflight(e, *cur, worker_id);
      } else {
        SendStartRanks(e, *cur, worker_id);
      }
    }
    if (on_worker && cur->has_rendezvous()) SendRendezvous(e.job, *cur, worker_id);
  }
  RequestSchedule();
}

void JobManager::OnWorkerLost(const std::string& worker_id) {
  std::vector<std::string> ids(holding_slots_.begin(), holding_slots_.end());
  for (const std::string& id : ids) {
    JobEntry& e = jobs_.at(id);
    v1::Job next = e.job;
    int failed_rank = -1;
    bool changed = false;
    for (int ai = 0; ai < next.attempts_size(); ++ai) {
      v1::Attempt* a = next.mutable_attempts(ai);
      bool current = ai == next.attempts_size() - 1 && !AttemptEnded(a->state()) && !IsTerminal(next.state());
      for (v1::RankAssignment& r : *a->mutable_ranks()) {
        if (r.worker_id() != worker_id || IsTerminal(r.state())) continue;
        r.set_state(current ? v1::RANK_STATE_FAILED : v1::RANK_STATE_STOPPED);
        r.mutable_exit()->set_kind(v1::FAILURE_KIND_WORKER_LOST);
        r.mutable_exit()->set_exit_code(-1);
        r.mutable_exit()->set_message("its worker stopped heartbeating (lease expired)");
        changed = true;
        if (current && failed_rank < 0) failed_rank = r.rank();
      }
    }
    if (!changed) continue;
    // The ranks' ends and the attempt's failure, in one write.
    absl::Status s;
    if (failed_rank >= 0) {
      const v1::RankAssignment& r = CurrentAttempt(next)->ranks(failed_rank);
      std::string reason = DescribeExit(r, r.exit());
      s = CommitFailure(e, std::move(next), {}, v1::FAILURE_KIND_WORKER_LOST, reason, failed_rank);
    } else {
      s = Commit(e, std::move(next), {});
    }
    // Memory is untouched: Tick finds these ranks on a LOST worker again.
    if (!s.ok()) std::cerr << "coordinator: worker " << worker_id << " lost: " << s << " (retried at the next tick)\n";
  }
  RequestSchedule();
}

void JobManager::Tick() {
  absl::Time now = clock_->Now();
  // 1. Rank ends held for a lost peer to explain them (due, or explained
  //    now), and ends whose write failed.
  std::vector<HeldReport> due;
  for (auto it = held_reports_.begin(); it != held_reports_.end();) {
    bool ready = now >= it->second.due;
    if (!ready) {
      JobEntry* e = FindEntry(it->second.status.job_id());
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
      std::cerr << "coordinator: worker " << r.worker_id << ": held rank end: " << s << "\n";
    }
  }
  // 2. Ranks still placed on a LOST worker (OnWorkerLost's write failed).
  absl::btree_set<std::string> lost;
  for (const std::string& id : holding_slots_) {
    for (const v1::Attempt& a : jobs_.at(id).job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        if (IsTerminal(r.state()) || lost.contains(r.worker_id())) continue;
        const v1::Worker* w = registry_->Find(r.worker_id());
        if (w != nullptr && w->state() == v1::WORKER_STATE_LOST) lost.insert(r.worker_id());
      }
    }
  }
  for (const std::string& w : lost) OnWorkerLost(w);
  // 3. Attempts whose ranks all ended without the attempt ending.
  std::vector<std::string> unsettled(unsettled_.begin(), unsettled_.end());
  for (const std::string& id : unsettled) {
    if (SettleEndedAttempt(jobs_.at(id))) unsettled_.erase(id);
  }
  // 4. A placement whose write failed, or an elastic job whose wait for a
  //    replacement ran out: place again.
  //    (A job still pending past its deadline waits for min_ranks slots;
  //    a pass per tick for it is cheap next to the wait.)
  for (const std::string& id : pending_) {
    if (ElasticDeadline(jobs_.at(id).job) <= now) schedule_retry_ = true;
  }
  if (schedule_retry_) {
    schedule_retry_ = false;
    RequestSchedule();
  }
  // 5. Rendezvous timeouts and hangs. A failed write changes nothing in
  //    memory, so the next tick finds the same condition and tries again.
  std::vector<std::string> ids(holding_slots_.begin(), holding_slots_.end());
  for (const std::string& id : ids) {
    JobEntry& e = jobs_.at(id);
    if (IsTerminal(e.job.state())) continue;
    const v1::Attempt* a = CurrentAttempt(e.job);
    if (a == nullptr || AttemptEnded(a->state())) continue;
    absl::Status s;
    if (a->state() == v1::ATTEMPT_STATE_STARTING) {
      if (now - FromTimestamp(a->start_time()) > options_.rendezvous_timeout) {
        std::vector<std::string> waiting;
        for (const v1::RankAssignment& r : a->ranks()) {
          if (r.state() != v1::RANK_STATE_RUNNING) waiting.push_back(absl::StrCat(r.rank()));
        }
        s = CommitFailure(e, e.job, {}, v1::FAILURE_KIND_RENDEZVOUS,
                          absl::StrCat("rendezvous timed out after ",
                                       absl::FormatDuration(options_.rendezvous_timeout),
                                       "; ranks not ready: ", absl::StrJoin(waiting, ", ")),
                          -1);
        if (s.ok()) RequestSchedule();
      }
    } else if (e.job.spec().has_command() && e.job.spec().restart().progress_timeout_s() == 0) {
      // The user's program need not report progress (trainctl.report): it is
      // checked for hangs only when its job asks for it with a timeout.
    } else {
      // Engine jobs: the adaptive bound from the ranks' heartbeats, unless
      // the spec fixes one; the fixed timeout below stays as the backstop
      // for what heartbeats cannot judge (start-up, eval, checkpoints).
      if (e.job.spec().restart().progress_timeout_s() == 0 && e.watch.attempt() == a->number()) {
        if (std::optional<HangVerdict> v = e.watch.CheckHang(*a, now); v.has_value()) {
          const int blamed = v->blamed.empty() ? -1 : v->blamed.front();
          s = CommitFailure(e, e.job, {{"hang", v->message, a->number(), blamed}}, v1::FAILURE_KIND_HANG,
                            absl::StrCat("hung: ", v->message), blamed);
          if (s.ok()) {
            ++hangs_detected_;
            RequestSchedule();
          } else {
            std::cerr << "coordinator: " << s << " (retried at the next tick)\n";
          }
          continue;
        }
        // Commit replaces e.job: copy what the events need from `a` first.
        const int32_t number = a->number();
        for (const Straggler& st : e.watch.TakeStragglers(*a)) {
          std::string message = st.message;
          const std::string worker = CurrentAttempt(e.job)->ranks(st.rank).worker_id();
          const bool avoid = e.job.spec().stragglers().policy() == v1::STRAGGLER_POLICY_AVOID;
          if (avoid) absl::StrAppend(&message, "; the next attempt avoids worker ", worker, " if it can");
          s = Commit(e, e.job, {{"straggler", message, number, st.rank}});
          if (!s.ok()) continue;
          ++straggler_events_;
          if (avoid && std::find(e.avoid_workers.begin(), e.avoid_workers.end(), worker) == e.avoid_workers.end()) {
            e.avoid_workers.push_back(worker);
          }
        }
        a = CurrentAttempt(e.job);
      }
      absl::Duration timeout = ProgressTimeout(e.job);
      std::vector<std::string> stuck;
      int first = -1;
      for (const v1::RankAssignment& r : a->ranks()) {
        if (IsTerminal(r.state())) continue;
        if (now - FromTimestamp(r.last_progress_time()) > timeout) {
          stuck.push_back(absl::StrCat(r.rank(), " (", r.host(), ", last step ", r.last_step(), ")"));
          if (first < 0) first = r.rank();
        }
      }
      if (!stuck.empty()) {
        s = CommitFailure(e, e.job, {}, v1::FAILURE_KIND_HANG,
                          absl::StrCat("hung: no progress for ", absl::FormatDuration(timeout),
                                       " from rank(s) ", absl::StrJoin(stuck, ", ")),
                          first);
        if (s.ok()) RequestSchedule();
      }
    }
    if (!s.ok()) std::cerr << "coordinator: " << s << " (retried at the next tick)\n";
  }
}

}  // namespace trainctl::coordinator

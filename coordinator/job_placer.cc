#include "coordinator/retry_log.h"
#include "coordinator/job_placer.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/attempt_failure.h"
#include "coordinator/checkpoint_records.h"

namespace trainctl::coordinator {
namespace {

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
    p.message = cmd_workers.empty() ? "no worker allows commands (start trainctl-worker with --allow-commands)"
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

// The attempt's ranks from placement `p`; returns "host×n" per node.
std::vector<std::string> AddRanks(v1::Attempt& a, const std::string& job_id, const scheduler::Placement& p,
                                  const WorkerRegistry& registry, absl::Time now) {
  std::vector<std::string> hosts;
  for (const scheduler::RankAssignment& r : p.ranks) {
    v1::RankAssignment* ra = a.add_ranks();
    ra->set_job_id(job_id);
    ra->set_attempt(a.number());
    ra->set_rank(r.rank);
    ra->set_local_rank(r.local_rank);
    ra->set_node_rank(r.node_rank);
    ra->set_world_size(p.world_size);
    ra->set_local_world_size(r.local_world_size);
    ra->set_num_nodes(p.num_nodes);
    ra->set_worker_id(r.worker_id);
    const v1::Worker* w = registry.Find(r.worker_id);
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
  return hosts;
}

// An elastic job's `resized` event when its new attempt (the last of `job`)
// has another size than the one before.
std::optional<JobEvent> ResizedEvent(const v1::Job& job, int world_size) {
  if (!IsElastic(job.spec())) return std::nullopt;
  const int n = job.attempts_size();
  const int before = n >= 2 ? job.attempts(n - 2).ranks_size() : job.spec().world_size();
  if (world_size == before) return std::nullopt;
  std::string why = world_size < before ? absl::StrCat("no replacement within elastic.replace_timeout_s = ",
                                                       job.spec().elastic().replace_timeout_s(), " s")
                                        : std::string("slots freed up");
  if (n == 1) why = "the slots free at the start";
  return JobEvent{"resized",
                  absl::StrCat("world size ", before, " -> ", world_size, " (", why, "; elastic between ",
                               job.spec().elastic().min_ranks(), " and ", job.spec().world_size(), ")"),
                  job.attempts(n - 1).number()};
}

}  // namespace

bool IsElastic(const v1::JobSpec& spec) {
  return spec.has_elastic() && spec.elastic().min_ranks() >= 1 && spec.elastic().min_ranks() < spec.world_size();
}

absl::Time ElasticDeadline(const v1::Job& job) {
  if (!IsElastic(job.spec()) || job.attempts_size() == 0) return absl::InfiniteFuture();
  const v1::Attempt& last = job.attempts(job.attempts_size() - 1);
  if (!AttemptEnded(last.state()) || last.grow_to() > 0) return absl::InfiniteFuture();
  return FromTimestamp(last.end_time()) + absl::Seconds(job.spec().elastic().replace_timeout_s());
}

int ElasticMinimum(const v1::Job& job, absl::Time now) {
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

std::vector<scheduler::WorkerSlots> JobPlacer::WorkerView() const {
  absl::flat_hash_map<std::string, std::vector<int>> busy = book_->BusySlotsByWorker();
  std::vector<scheduler::WorkerSlots> workers;
  for (const v1::Worker* w : registry_->Alive()) {
    scheduler::WorkerSlots ws;
    ws.worker_id = w->id();
    ws.kind = w->slots(0).kind() == v1::Slot::KIND_GPU ? scheduler::SlotKind::kGpu : scheduler::SlotKind::kCpu;
    ws.total_slots = w->slots_size();
    const std::vector<int>& b = busy[w->id()];
    for (const v1::Slot& s : w->slots()) {
      if (std::find(b.begin(), b.end(), s.index()) == b.end()) ws.free_slots.push_back(s.index());
    }
    workers.push_back(std::move(ws));
  }
  return workers;
}

absl::flat_hash_set<std::string> JobPlacer::AllowingCommands() const {
  absl::flat_hash_set<std::string> out;
  for (const v1::Worker* w : registry_->Alive()) {
    if (w->allow_commands()) out.insert(w->id());
  }
  return out;
}

void JobPlacer::RequestSchedule() {
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

void JobPlacer::OnTick(absl::Time now) {
  // (A job still pending past its deadline waits for min_ranks slots; a
  // pass per tick for it is cheap next to the wait.)
  const absl::Time mono = clock_->Mono();
  for (const std::string& id : book_->pending()) {
    JobEntry& e = book_->At(id);
    if (ElasticDeadline(e.job) <= now) schedule_retry_ = true;
    if (e.restart_not_before != absl::InfinitePast() && e.restart_not_before <= mono) {
      e.restart_not_before = absl::InfinitePast();  // due: one pass places it when slots allow
      schedule_retry_ = true;
    }
  }
  if (!schedule_retry_) return;
  schedule_retry_ = false;
  RequestSchedule();
}

scheduler::PendingJob JobPlacer::ToPending(const JobEntry& e, absl::Time now) const {
  scheduler::PendingJob pj;
  pj.job_id = e.job.id();
  pj.world_size = e.job.spec().world_size();
  pj.device = ToRequirement(e.job.spec().device());
  pj.priority = e.job.spec().priority();
  pj.submit_seq = static_cast<uint64_t>(e.submit_seq);
  pj.min_world_size = ElasticMinimum(e.job, now);
  if (e.job.spec().stragglers().policy() == v1::STRAGGLER_POLICY_AVOID) pj.avoid_workers = e.avoid_workers;
  return pj;
}

absl::StatusOr<scheduler::ScheduleResult> JobPlacer::Plan(const v1::Job& job) const {
  JobEntry probe;
  probe.job = job;
  probe.job.set_id("dry-run");
  scheduler::PendingJob pj = ToPending(probe, clock_->Now());
  absl::flat_hash_set<std::string> command_jobs;
  if (job.spec().has_command()) command_jobs.insert(pj.job_id);
  return ScheduleWithCommands({pj}, command_jobs, WorkerView(), AllowingCommands());
}

void JobPlacer::Schedule() {
  if (book_->pending().empty()) return;
  const absl::Time now = clock_->Now();
  std::vector<scheduler::PendingJob> jobs;
  absl::flat_hash_set<std::string> command_jobs;
  const absl::Time mono = clock_->Mono();
  for (const std::string& id : book_->pending()) {
    const JobEntry& e = book_->At(id);
    // A restart waiting its backoff keeps its reason ("restarting after:
    // ..."; the `restarting` event says how long); OnTick asks for a pass
    // when it is due.
    if (e.restart_not_before > mono) continue;
    if (e.job.spec().has_command()) command_jobs.insert(id);
    jobs.push_back(ToPending(e, now));
  }
  absl::StatusOr<scheduler::ScheduleResult> result =
      ScheduleWithCommands(jobs, command_jobs, WorkerView(), AllowingCommands());
  if (!result.ok()) return;  // Inputs come from validated state; nothing to place.
  for (const scheduler::PendingJobStatus& p : result->pending) book_->SetPendingReason(p.job_id, p.message);
  for (scheduler::Placement& p : result->placements) Place(book_->At(p.job_id), p, now);
}

void JobPlacer::Place(JobEntry& e, scheduler::Placement& p, absl::Time now) {
  v1::Job next = e.job;
  auto [resume, resume_words] = ChooseResume(next, p, *registry_);
  if (!resume.has_value() && next.attempts_size() == 0 && !next.spec().resume_from().job().empty()) {
    // Asked to continue another job: never silently from scratch. Wait for
    // a placement that includes a holder of its checkpoint.
    book_->SetPendingReason(p.job_id, absl::StrCat("waiting for slots that include the holder of ",
                                                   DescribeRecord(*NewestRecords(next).front())));
    return;
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
  std::vector<std::string> hosts = AddRanks(*a, next.id(), p, *registry_, now);
  next.set_state(v1::JOB_STATE_SCHEDULED);
  next.set_state_reason("");
  if (!next.has_start_time()) SetTimestamp(now, next.mutable_start_time());
  e.last_points.clear();
  std::string msg = absl::StrCat("attempt ", a->number(), " placed on ", absl::StrJoin(hosts, ", "));
  if (!resume_words.empty()) absl::StrAppend(&msg, "; ", resume_words);
  std::vector<JobEvent> events = {{"scheduled", msg, a->number()}};
  if (std::optional<JobEvent> resized = ResizedEvent(next, p.world_size)) events.push_back(std::move(*resized));
  if (absl::Status s = book_->Commit(e, std::move(next), std::move(events)); !s.ok()) {
    LogDeferred(s, "placed again at the next tick");
    schedule_retry_ = true;  // Stays pending; the tick asks for another pass.
    return;
  }
  e.start_mono = clock_->Mono();
  e.progress_mono.clear();
  for (const v1::RankAssignment& r : CurrentAttempt(e.job)->ranks()) e.progress_mono[r.rank()] = e.start_mono;
  starter_->Launch(e, *CurrentAttempt(e.job));
}

void JobPlacer::MaybeGrow(JobEntry& e, const v1::CheckpointRecord& r) {
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
  for (const std::string& id : book_->pending()) {
    if (id != e.job.id() && book_->At(id).job.spec().priority() >= spec.priority()) return;
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
  if (absl::Status s = book_->Commit(e, std::move(next), {{"resizing", why, a->number()}}); !s.ok()) {
    LogDeferred(s, "growing at a later checkpoint");
    return;
  }
  starter_->StopAll(e.job.id(), CurrentAttempt(e.job)->number(), to_stop, why);
  RequestSchedule();
}

}  // namespace trainctl::coordinator

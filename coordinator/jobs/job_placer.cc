#include "coordinator/jobs/job_placer.h"
#include "coordinator/core/retry_log.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/artifacts/checkpoint_records.h"
#include "coordinator/jobs/attempt_failure.h"
#include "coordinator/jobs/command_pass.h"
#include "coordinator/jobs/runtime_bound.h"
#include "coordinator/scheduler/quota.h"

namespace trainctl::coordinator {
namespace {

// A job's queue as the scheduler names it.
std::string QueueName(const v1::JobSpec& spec) {
  return spec.queue().empty() ? "default" : spec.queue();
}

scheduler::DeviceRequirement ToRequirement(v1::Device d) {
  switch (d) {
    case v1::DEVICE_CUDA:
      return scheduler::DeviceRequirement::kCuda;
    case v1::DEVICE_CPU:
      return scheduler::DeviceRequirement::kCpu;
    default:
      return scheduler::DeviceRequirement::kAuto;
  }
}

// The flavor every GPU slot in `slots` has; "" when they have none or
// differ (a mixed host: no flavor as far as placement goes), and for CPU.
std::string CommonFlavor(const google::protobuf::RepeatedPtrField<v1::Slot>& slots) {
  std::string flavor;
  for (int i = 0; i < slots.size(); ++i) {
    if (slots[i].kind() != v1::Slot::KIND_GPU || slots[i].flavor().empty()) return "";
    if (i > 0 && slots[i].flavor() != flavor) return "";
    flavor = slots[i].flavor();
  }
  return flavor;
}

// The attempt's ranks from placement `p`; returns "host×n" per node.
std::vector<std::string> AddRanks(v1::Attempt& a, const std::string& job_id,
                                  const scheduler::Placement& p, const WorkerRegistry& registry,
                                  absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
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
  std::string why = world_size < before
                        ? absl::StrCat("no replacement within elastic.replace_timeout_s = ",
                                       job.spec().elastic().replace_timeout_s(), " s")
                        : std::string("slots freed up");
  if (n == 1) why = "the slots free at the start";
  return JobEvent{
      "resized",
      absl::StrCat("world size ", before, " -> ", world_size, " (", why, "; elastic between ",
                   job.spec().elastic().min_ranks(), " and ", job.spec().world_size(), ")"),
      job.attempts(n - 1).number()};
}

}  // namespace

std::vector<scheduler::WorkerSlots> JobPlacer::WorkerView() const {
  absl::flat_hash_map<std::string, std::vector<int>> busy = book_->BusySlotsByWorker();
  // What the live ranks on each worker reserve: their jobs' per-rank
  // resources (ranks of a stopping attempt too, until they have ended).
  struct Reserved {
    double cpus = 0;
    int64_t memory = 0;
  };
  absl::flat_hash_map<std::string, Reserved> reserved;
  book_->ForEachLiveRank([&](const v1::RankAssignment& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    const JobEntry* e = book_->Find(r.job_id());
    if (e == nullptr) return;
    const v1::ResourceSpec& res = e->job.spec().resources();
    if (res.cpus() <= 0 && res.memory() <= 0) return;
    Reserved& x = reserved[r.worker_id()];
    if (std::isfinite(res.cpus()) && res.cpus() > 0) x.cpus += res.cpus();
    x.memory += std::max<int64_t>(0, res.memory());
  });
  absl::flat_hash_map<std::string, std::vector<scheduler::WorkerSlots::Busy>> bounds =
      BusyByWorker(*book_, clock_->Now(), options_.preemption_grace);
  std::vector<scheduler::WorkerSlots> workers;
  for (const v1::Worker* w : registry_->Alive()) {
    scheduler::WorkerSlots ws;
    ws.worker_id = w->id();
    // 0 = unknown (an older daemon reports no allocatable, and so does not
    // enforce limits either): see scheduler.h, Resources.
    const v1::Allocatable& a = w->allocatable();
    ws.allocatable_cpus = std::isfinite(a.cpus()) && a.cpus() > 0 ? a.cpus() : 0;
    ws.allocatable_memory = std::max<int64_t>(0, a.memory_bytes());
    ws.enforces_limits = a.enforces_limits();
    if (auto it = reserved.find(w->id()); it != reserved.end()) {
      ws.reserved_cpus = it->second.cpus;
      ws.reserved_memory = it->second.memory;
    }
    ws.kind = w->slots(0).kind() == v1::Slot::KIND_GPU ? scheduler::SlotKind::kGpu
                                                       : scheduler::SlotKind::kCpu;
    ws.gpu_flavor = CommonFlavor(w->slots());
    ws.total_slots = w->slots_size();
    if (auto it = bounds.find(w->id()); it != bounds.end()) ws.busy = std::move(it->second);
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
  // post_ runs it on the loop (SetDeferral).
  post_([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    schedule_requested_ = false;
    Schedule();
  });
}

void JobPlacer::OnTick(absl::Time now) {
  // (A job still pending past its deadline waits for min_ranks slots; a
  // pass per tick for it is cheap next to the wait.)
  const absl::Time mono = clock_->Mono();
  UpdateUsage(mono);
  MaybeSaveUsage(mono);
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
  pj.queue = QueueName(e.job.spec());
  pj.owner = e.job.owner();
  pj.min_world_size = ElasticMinimum(e.job, now);
  // Validated at submit (divides world_size, not elastic); a bad stored
  // value leaves only this job pending as invalid.
  pj.nodes = e.job.spec().scheduling().nodes();
  // Validated at submit (>= 0, finite); clamped so that a bad stored row
  // cannot make the scheduler refuse the whole pass.
  const v1::ResourceSpec& res = e.job.spec().resources();
  pj.cpus = std::isfinite(res.cpus()) && res.cpus() > 0 ? res.cpus() : 0;
  pj.memory_bytes = std::max<int64_t>(0, res.memory());
  pj.other_limits = res.pids() > 0;
  pj.gpu_flavor = res.gpu_flavor();
  if (e.job.spec().stragglers().policy() == v1::STRAGGLER_POLICY_AVOID)
    pj.avoid_workers = e.avoid_workers;
  pj.runtime_bound_s = RuntimeBoundSeconds(e.job, now, options_.preemption_grace);
  return pj;
}

absl::StatusOr<scheduler::ScheduleResult> JobPlacer::Plan(const v1::Job& job) const {
  JobEntry probe;
  probe.job = job;
  probe.job.set_id("dry-run");
  scheduler::PendingJob pj = ToPending(probe, clock_->Now());
  absl::flat_hash_set<std::string> command_jobs;
  if (job.spec().has_command()) command_jobs.insert(pj.job_id);
  absl::flat_hash_set<std::string> stopping;
  return ScheduleWithCommands({pj}, command_jobs, WorkerView(), AllowingCommands(),
                              Queues(&stopping));
}

scheduler::QueueInput JobPlacer::Queues(absl::flat_hash_set<std::string>* stopping_jobs) const {
  scheduler::QueueInput in;
  if (queue_source_) in.queues = queue_source_();
  if (in.queues.empty()) return in;
  absl::flat_hash_set<std::string> defined;
  for (scheduler::QueueSpec& q : in.queues) {
    defined.insert(q.name);
    if (auto it = usage_.queues().find(q.name); it != usage_.queues().end()) {
      q.usage_gpu = it->second[0];
      q.usage_cpu = it->second[1];
    }
    // The owners with a weight (from the queue) get their usage; the others
    // are added with weight 1.
    if (auto it = usage_.owners().find(q.name); it != usage_.owners().end()) {
      absl::flat_hash_map<std::string, size_t> weighted;
      for (size_t i = 0; i < q.owners.size(); ++i) weighted[q.owners[i].name] = i;
      for (const auto& [owner, u] : it->second) {
        auto w = weighted.find(owner);
        scheduler::QueueSpec::Owner& o =
            w != weighted.end() ? q.owners[w->second]
                                : q.owners.emplace_back(scheduler::QueueSpec::Owner{owner});
        o.usage_gpu = u[0];
        o.usage_cpu = u[1];
      }
    }
  }
  // Live ranks per job: the slots each job holds, and of which attempt.
  struct Held {
    int slots = 0;
    bool gpu = false;
    // Its GPU slots' flavor; "" when none or several.
    std::string flavor;
    bool first = true;
    bool current = true;  // every live rank is of the current, unended attempt
  };
  absl::flat_hash_map<std::string, Held> held;
  book_->ForEachLiveRank([&](const v1::RankAssignment& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    Held& h = held[r.job_id()];
    ++h.slots;
    h.gpu = r.slot().kind() == v1::Slot::KIND_GPU;
    if (h.first) {
      h.flavor = r.slot().flavor();
    } else if (h.flavor != r.slot().flavor()) {
      h.flavor.clear();
    }
    h.first = false;
    const v1::Attempt* a = CurrentAttempt(book_->At(r.job_id()).job);
    if (a == nullptr || a->number() != r.attempt() || AttemptEnded(a->state())) h.current = false;
  });
  for (const auto& [id, h] : held) {
    const JobEntry& e = book_->At(id);
    const std::string queue = QueueName(e.job.spec());
    // A job of a queue deleted since (or submitted before queues existed
    // and not in "default") counts against no quota and is never a victim.
    if (!defined.contains(queue)) continue;
    scheduler::RunningJob r;
    r.job_id = id;
    r.queue = queue;
    r.kind = h.gpu ? scheduler::SlotKind::kGpu : scheduler::SlotKind::kCpu;
    r.slots = h.slots;
    r.gpu_flavor = h.flavor;
    // Against the CPU and memory quotas, clamped as ToPending's.
    const v1::ResourceSpec& res = e.job.spec().resources();
    r.cpus = std::isfinite(res.cpus()) && res.cpus() > 0 ? res.cpus() : 0;
    r.memory_bytes = std::max<int64_t>(0, res.memory());
    r.priority = e.job.spec().priority();
    const v1::Attempt* a = CurrentAttempt(e.job);
    r.start_seq = a != nullptr ? static_cast<std::uint64_t>(std::max<int64_t>(
                                     0, absl::ToUnixMicros(FromTimestamp(a->start_time()))))
                               : 0;
    r.stopping = !h.current || IsTerminal(e.job.state());
    if (r.stopping && !IsTerminal(e.job.state())) stopping_jobs->insert(id);
    in.running.push_back(std::move(r));
  }
  return in;
}

void JobPlacer::UpdateUsage(absl::Time mono) {
  if (!queue_source_) return;
  const absl::Time last = usage_mono_;
  usage_mono_ = mono;
  // No queues: no fair share to keep, and no walk over every live rank per
  // tick. Queues defined later start from no usage.
  if (queue_source_().empty()) {
    usage_.Clear();
    return;
  }
  // Held slots are taken as constant since the last call (passes and ticks
  // come at least once a second).
  if (last == absl::InfinitePast() || mono <= last) return;
  usage_.Advance(mono - last, SlotsHeldByOwner());
}

OwnerLimits JobPlacer::RunningByOwner() const {
  OwnerLimits limits(queue_source_ ? queue_source_() : std::vector<scheduler::QueueSpec>{});
  if (limits.empty()) return limits;
  absl::flat_hash_map<std::string, int> slots;
  book_->ForEachLiveRank([&](const v1::RankAssignment& r)
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { ++slots[r.job_id()]; });
  for (const auto& [id, n] : slots) {
    const v1::Job& job = book_->At(id).job;
    limits.AddRunning(QueueName(job.spec()), job.owner(), n);
  }
  return limits;
}

HeldSlots JobPlacer::SlotsHeldByOwner() const {
  HeldSlots held;
  book_->ForEachLiveRank([&](const v1::RankAssignment& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    const int k = r.slot().kind() == v1::Slot::KIND_GPU ? 0 : 1;
    const v1::Job& job = book_->At(r.job_id()).job;
    ++held[QueueName(job.spec())][job.owner()][k];
  });
  return held;
}

void JobPlacer::RestoreUsage(const v1::FairShareSnapshot& stored) {
  usage_.Restore(stored, stored.has_as_of() ? clock_->Now() - FromTimestamp(stored.as_of())
                                            : absl::ZeroDuration());
}

v1::FairShareSnapshot JobPlacer::UsageSnapshot() const { return usage_.Snapshot(clock_->Now()); }

void JobPlacer::MaybeSaveUsage(absl::Time mono) {
  if (store_ == nullptr || !queue_source_) return;
  if (usage_saved_mono_ != absl::InfinitePast() &&
      mono - usage_saved_mono_ < options_.fair_share_save_interval) {
    return;
  }
  if (usage_.empty() && usage_saved_empty_) return;
  const absl::Status saved = store_->queues().PutFairShare(UsageSnapshot());
  if (!saved.ok()) {
    LogDeferred(saved, "fair-share usage written again at the next tick");
    return;
  }
  usage_saved_mono_ = mono;
  usage_saved_empty_ = usage_.empty();
}

void JobPlacer::Schedule() {
  if (book_->pending().empty()) return;
  const absl::Time started = clock_->Mono();
  SchedulePending();
  pass_latency_.Observe(clock_->Mono() - started);
}

void JobPlacer::SchedulePending() {
  const absl::Time now = clock_->Now();
  std::vector<scheduler::PendingJob> jobs;
  absl::flat_hash_set<std::string> command_jobs;
  const absl::Time mono = clock_->Mono();
  UpdateUsage(mono);
  absl::flat_hash_set<std::string> stopping;
  scheduler::QueueInput queues = Queues(&stopping);
  OwnerLimits limits = RunningByOwner();
  // With per-owner limits, in the order the scheduler prefers them
  // (priority, then submission), so that the limits let an owner's first
  // jobs in; without, the pass needs no order.
  std::vector<const std::string*> order;
  for (const std::string& id : book_->pending()) order.push_back(&id);
  if (!limits.empty())
    std::stable_sort(order.begin(), order.end(),
                     [this](const std::string* a, const std::string* b)
                         ABSL_NO_THREAD_SAFETY_ANALYSIS {
                           const JobEntry& x = book_->At(*a);
                           const JobEntry& y = book_->At(*b);
                           if (x.job.spec().priority() != y.job.spec().priority())
                             return x.job.spec().priority() > y.job.spec().priority();
                           return x.submit_seq < y.submit_seq;
                         });
  for (const std::string* idp : order) {
    const std::string& id = *idp;
    const JobEntry& e = book_->At(id);
    // With queues, a preempted (or restarting) job whose earlier ranks still
    // hold slots waits for them: it is one of the running jobs, stopping.
    // (It keeps its reason: "preempted for job ...", "restarting after ...".)
    if (stopping.contains(id)) continue;
    // A restart waiting its backoff keeps its reason ("restarting after:
    // ..."; the `restarting` event says how long); OnTick asks for a pass
    // when it is due.
    if (e.restart_not_before > mono) continue;
    // An owner at its queue's limit: counted at world_size (the most an
    // elastic job may take).
    if (std::string held =
            limits.Admit(QueueName(e.job.spec()), e.job.owner(), e.job.spec().world_size());
        !held.empty()) {
      book_->SetPendingReason(id, held);
      continue;
    }
    if (e.job.spec().has_command()) command_jobs.insert(id);
    jobs.push_back(ToPending(e, now));
  }
  absl::StatusOr<scheduler::ScheduleResult> result =
      ScheduleWithCommands(jobs, command_jobs, WorkerView(), AllowingCommands(), std::move(queues));
  if (!result.ok()) {
    // Inputs come from validated state; a refusal is a bug worth a log line.
    LogDeferred(result.status(), "no placement in this pass");
    return;
  }
  for (const scheduler::PendingJobStatus& p : result->pending)
    book_->SetPendingReason(p.job_id, p.message);
  for (const scheduler::Preemption& v : result->preemptions) Preempt(v.victim_job_id, v.for_job_id);
  for (scheduler::Placement& p : result->placements) Place(book_->At(p.job_id), p, now);
}

void JobPlacer::Preempt(const std::string& victim, const std::string& for_job) {
  JobEntry* e = book_->Find(victim);
  const JobEntry* f = book_->Find(for_job);
  if (e == nullptr || f == nullptr || IsTerminal(e->job.state())) return;
  const v1::Attempt* a = CurrentAttempt(e->job);
  if (a == nullptr || AttemptEnded(a->state())) return;
  const std::string why = absl::StrCat(
      "preempted for job ", for_job, " (queue ", QueueName(f->job.spec()), ", priority ",
      f->job.spec().priority(), "); resumes from its latest checkpoint when slots free");
  v1::Job next = e->job;
  v1::Attempt* na = CurrentAttempt(next);
  na->set_state(v1::ATTEMPT_STATE_CANCELLED);
  na->set_reason(why);
  na->set_preempted_for(for_job);
  SetTimestamp(clock_->Now(), na->mutable_end_time());
  RanksByWorker to_stop = LiveRanksByWorker(*na);
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_state_reason(why);
  if (absl::Status s = book_->Commit(*e, std::move(next), {{"preempted", why, a->number()}});
      !s.ok()) {
    LogDeferred(s, "preempted at a later pass");
    schedule_retry_ = true;
    return;
  }
  ++preemptions_;
  starter_->StopAll(victim, CurrentAttempt(e->job)->number(), to_stop, why,
                    {options_.preemption_grace, /*checkpoint_first=*/true});
}

bool JobPlacer::QueueHasRoom(const JobEntry& e, bool gpu) const {
  if (!queue_source_) return true;
  const std::vector<scheduler::QueueSpec> queues = queue_source_();
  if (queues.empty()) return true;
  const std::string name = QueueName(e.job.spec());
  const auto q = std::find_if(queues.begin(), queues.end(),
                              [&](const scheduler::QueueSpec& s) { return s.name == name; });
  if (q == queues.end()) return false;
  // Its CPU, memory and GPU flavor quotas: room for one more rank of it.
  const v1::ResourceSpec& res = e.job.spec().resources();
  absl::flat_hash_set<std::string> stopping;
  if (!scheduler::QueueHasResourceRoom(queues, Queues(&stopping).running, name, res.cpus(),
                                       res.memory(), gpu ? res.gpu_flavor() : ""))
    return false;
  const int nominal = gpu ? q->nominal_gpu : q->nominal_cpu;
  if (nominal < 0) return true;
  const auto held = SlotsHeldByOwner();
  int used = 0;
  if (const auto it = held.find(name); it != held.end()) {
    for (const auto& [owner, n] : it->second) used += n[gpu ? 0 : 1];
  }
  // Growing into borrowed quota would only be preempted back: within the
  // queue's own nominal only.
  return used < nominal;
}

void JobPlacer::Place(JobEntry& e, scheduler::Placement& p, absl::Time now) {
  v1::Job next = e.job;
  auto [resume, resume_words] = ChooseResume(next, p, *registry_);
  if (!resume.has_value() && next.attempts_size() == 0 &&
      !next.spec().resume_from().job().empty()) {
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
  std::string msg =
      absl::StrCat("attempt ", a->number(), " placed on ", absl::StrJoin(hosts, ", "));
  if (!resume_words.empty()) absl::StrAppend(&msg, "; ", resume_words);
  if (!p.backfilled_before.empty()) {
    absl::StrAppend(&msg, "; backfilled on slots held for job ", p.backfilled_before,
                    ", ending (scheduling.max_runtime_s) before that job could start");
  }
  std::vector<JobEvent> events = {{"scheduled", msg, a->number()}};
  if (std::optional<JobEvent> resized = ResizedEvent(next, p.world_size))
    events.push_back(std::move(*resized));
  if (absl::Status s = book_->Commit(e, std::move(next), std::move(events)); !s.ok()) {
    LogDeferred(s, "placed again at the next tick");
    schedule_retry_ = true;  // Stays pending; the tick asks for another pass.
    return;
  }
  e.start_mono = clock_->Mono();
  e.progress_mono.clear();
  for (const v1::RankAssignment& r : CurrentAttempt(e.job)->ranks())
    e.progress_mono[r.rank()] = e.start_mono;
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
  if (r.epoch_consumed() == 0 && r.epochs_done() >= spec.training().epochs())
    return;  // finishing anyway
  // Pending jobs of this priority or higher get free slots first.
  for (const std::string& id : book_->pending()) {
    if (id != e.job.id() && book_->At(id).job.spec().priority() >= spec.priority()) return;
  }
  const bool gpu = a->ranks(0).slot().kind() == v1::Slot::KIND_GPU;
  if (!QueueHasRoom(e, gpu)) return;
  int free = 0;
  const v1::ResourceSpec& res = spec.resources();
  if (res.cpus() > 0 || res.memory() > 0 || res.pids() > 0) {
    // Ranks with resources: as many more as the scheduler would place now
    // (free slots with the CPUs and memory left beside them, on workers
    // that enforce limits). The attempt's own ranks still count as busy, so
    // this errs on the small side.
    scheduler::PendingJob probe = ToPending(e, clock_->Now());
    probe.job_id = "grow-probe";
    probe.world_size = spec.world_size() - ranks;
    probe.min_world_size = probe.world_size > 1 ? 1 : 0;
    probe.device = gpu ? scheduler::DeviceRequirement::kCuda : scheduler::DeviceRequirement::kCpu;
    probe.avoid_workers.clear();
    absl::StatusOr<scheduler::ScheduleResult> plan = scheduler::Schedule({probe}, WorkerView());
    if (plan.ok() && !plan->placements.empty()) free = plan->placements[0].world_size;
  } else {
    for (const scheduler::WorkerSlots& w : WorkerView()) {
      if ((w.kind == scheduler::SlotKind::kGpu) == gpu)
        free += static_cast<int>(w.free_slots.size());
    }
  }
  if (free < 1) return;
  const int target = std::min(spec.world_size(), ranks + free);
  v1::Job next = e.job;
  v1::Attempt* na = CurrentAttempt(next);
  const std::string why =
      absl::StrCat("elastic: growing from ", ranks, " to ", target, " ranks (", free,
                   " slot(s) free) at the checkpoint of step ", r.global_step());
  na->set_state(v1::ATTEMPT_STATE_CANCELLED);
  na->set_reason(why);
  na->set_grow_to(target);
  SetTimestamp(clock_->Now(), na->mutable_end_time());
  RanksByWorker to_stop = LiveRanksByWorker(*na);
  next.set_state(v1::JOB_STATE_RESTARTING);
  next.set_state_reason(why);
  if (absl::Status s = book_->Commit(e, std::move(next), {{"resizing", why, a->number()}});
      !s.ok()) {
    LogDeferred(s, "growing at a later checkpoint");
    return;
  }
  starter_->StopAll(e.job.id(), CurrentAttempt(e.job)->number(), to_stop, why);
  RequestSchedule();
}

}  // namespace trainctl::coordinator

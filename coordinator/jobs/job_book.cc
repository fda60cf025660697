#include "coordinator/jobs/job_book.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/time_util.h"

namespace trainctl::coordinator {

bool Unsettled(const v1::Job& job) {
  if (IsTerminal(job.state())) return false;
  const v1::Attempt* a = CurrentAttempt(job);
  if (a == nullptr || AttemptEnded(a->state()) || a->ranks_size() == 0) return false;
  return std::all_of(a->ranks().begin(), a->ranks().end(),
                     [](const v1::RankAssignment& r) { return IsTerminal(r.state()); });
}

namespace {

bool HasLiveRanks(const v1::Job& job) {
  for (const v1::Attempt& a : job.attempts()) {
    for (const v1::RankAssignment& r : a.ranks()) {
      if (!IsTerminal(r.state())) return true;
    }
  }
  return false;
}

// The job_state log line of a transition, written once it is stored.
std::function<void()> StateChangeLog(v1::JobState from, const v1::Job& next) {
  LogFields fields = {
      {"job_id", next.id()}, {"from", StateName(from)}, {"to", StateName(next.state())}};
  if (const v1::Attempt* a = CurrentAttempt(next))
    fields.emplace_back("attempt", absl::StrCat(a->number()));
  if (!next.state_reason().empty())
    fields.emplace_back("reason", next.state_reason().substr(0, 300));
  if (next.state() == v1::JOB_STATE_SUCCEEDED && !next.final_model().empty()) {
    fields.emplace_back("final_model", next.final_model());
  }
  const bool bad = next.state() == v1::JOB_STATE_FAILED || next.state() == v1::JOB_STATE_RESTARTING;
  return [fields = std::move(fields), bad] {
    LogEvent(bad ? LogLevel::kWarn : LogLevel::kInfo, "coordinator", "job_state", fields);
  };
}

// Groups nest in no caller (the store refuses a second BeginGroup): one
// that does is a bug, not a state to go on from.
[[noreturn]] void BrokenInvariant(const char* what) {
  std::fprintf(stderr, "trainctl: JobBook: %s; aborting\n", what);
  std::abort();
}

}  // namespace

v1::Attempt* CurrentAttempt(v1::Job& job) {
  return job.attempts_size() == 0 ? nullptr : job.mutable_attempts(job.attempts_size() - 1);
}

const v1::Attempt* CurrentAttempt(const v1::Job& job) {
  return job.attempts_size() == 0 ? nullptr : &job.attempts(job.attempts_size() - 1);
}

std::vector<std::string> AttemptWorkers(const v1::Attempt& a) {
  std::vector<std::string> out;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (std::find(out.begin(), out.end(), r.worker_id()) == out.end()) out.push_back(r.worker_id());
  }
  return out;
}

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

absl::Duration RunningTime(const v1::Job& job, absl::Time now) {
  absl::Duration sum = absl::ZeroDuration();
  for (const v1::Attempt& a : job.attempts()) {
    if (!a.has_start_time()) continue;
    const absl::Time end = a.has_end_time() ? FromTimestamp(a.end_time()) : now;
    sum += std::max(end - FromTimestamp(a.start_time()), absl::ZeroDuration());
  }
  return sum;
}

std::string JobBook::NewId(const std::string& name) const {
  static std::mt19937_64 rng(std::random_device{}());
  std::string id;
  do {
    id = absl::StrFormat("%s-%06x", name, rng() & 0xffffff);
  } while (jobs_.contains(id));
  return id;
}

JobEntry* JobBook::Find(const std::string& job_id) {
  CheckOnLoop();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return nullptr;
  Remember(job_id);
  return &it->second;
}

const JobEntry* JobBook::Find(const std::string& job_id) const {
  CheckOnLoop();
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const std::string* JobBook::PendingReason(const std::string& job_id) const {
  auto it = pending_reasons_.find(job_id);
  return it == pending_reasons_.end() ? nullptr : &it->second;
}

void JobBook::TrackIndexes(const JobEntry& e) {
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

void JobBook::Recover(const StoreSnapshot& snapshot) {
  CheckOnLoop();
  const absl::Time now = clock_->Now();
  for (size_t i = 0; i < snapshot.jobs.size(); ++i) {
    JobEntry e;
    e.job = snapshot.jobs[i];
    // A job stored by a version with fewer defaults gets today's (the rank
    // and the coordinator read only resolved specs).
    ResolveJobSpecDefaults(e.job.mutable_spec());
    e.submit_seq = snapshot.submit_seqs[i];
    e.last_event_seq = snapshot.last_event_seqs[i];
    next_submit_seq_ = std::max(next_submit_seq_, e.submit_seq + 1);
    if (!IsTerminal(e.job.state())) ++active_jobs_;
    for (v1::Attempt& a : *e.job.mutable_attempts()) {
      for (v1::RankAssignment& r : *a.mutable_ranks()) {
        if (!IsTerminal(r.state())) SetTimestamp(now, r.mutable_last_progress_time());
      }
    }
    auto [it, inserted] = jobs_.emplace(e.job.id(), std::move(e));
    TrackIndexes(it->second);
    if (Unsettled(it->second.job)) unsettled_.insert(it->first);
  }
}

absl::StatusOr<JobEntry*> JobBook::Add(v1::Job job, std::vector<JobEvent> events) {
  CheckOnLoop();
  const std::string id = job.id();
  Remember(id);
  JobEntry entry;
  entry.submit_seq = next_submit_seq_++;
  entry.job.set_id(id);
  auto [it, inserted] = jobs_.emplace(id, std::move(entry));
  if (!inserted) return absl::AlreadyExistsError(absl::StrCat("job ", id, " exists"));
  if (absl::Status s = Commit(it->second, std::move(job), std::move(events)); !s.ok()) {
    jobs_.erase(it);
    return s;
  }
  return &it->second;
}

absl::Status JobBook::Commit(JobEntry& entry, v1::Job next, std::vector<JobEvent> events) {
  CheckOnLoop();
  const v1::JobState from = entry.job.state();
  if (absl::Status s = CheckJobChange(entry.job, next); !s.ok()) return s;
  absl::Time now = clock_->Now();
  std::vector<v1::Event> stored;
  int64_t seq = entry.last_event_seq;
  for (JobEvent& spec : events) {
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
      entry.final_model->attempt() == CurrentAttempt(next)->number()) {
    next.set_final_model(entry.final_model->path());
    next.set_final_model_worker(entry.final_model_worker);
  }
  // Accounting: an ended attempt whose last rank exited now gets its
  // record, stamped now (the grace its ranks took to stop is charged).
  // Before the job: a failed job write leaves a record that the retried
  // commit replaces.
  std::vector<std::pair<int32_t, int32_t>> recorded;  // (attempt, ranks)
  for (int i = 0; i < next.attempts_size(); ++i) {
    const v1::Attempt& a = next.attempts(i);
    if (a.ranks_size() == 0 || !a.has_start_time() || !AttemptSettled(a)) continue;
    if (i < entry.job.attempts_size() && AttemptSettled(entry.job.attempts(i))) continue;
    std::vector<RankFigures> figures(a.ranks_size());
    for (int r = 0; r < a.ranks_size(); ++r) {
      auto it = entry.rank_figures.find({a.number(), r});
      if (it != entry.rank_figures.end()) figures[r] = it->second;
    }
    if (absl::Status s =
            store_->usage().PutAttemptUsage(AttemptUsageOf(next, a, now, true, figures));
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat("job ", next.id(), ": could not store attempt ",
                                                 a.number(), "'s usage: ", s.message()));
    }
    recorded.emplace_back(a.number(), a.ranks_size());
  }
  if (absl::Status s = store_->jobs().PutJob(next, entry.submit_seq, stored); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("job ", next.id(), ": could not store the ",
                                               StateName(next.state()),
                                               " transition: ", s.message()));
  }
  for (const auto& [number, ranks] : recorded) {
    for (int r = 0; r < ranks; ++r) entry.rank_figures.erase({number, r});
  }

  if (from != next.state()) {
    AfterCommit(StateChangeLog(from, next));
  }
  const bool was_active = !IsTerminal(from) && from != v1::JOB_STATE_UNSPECIFIED;
  const bool now_active = !IsTerminal(next.state());
  entry.job = std::move(next);
  entry.last_event_seq = seq;
  active_jobs_ += (now_active ? 1 : 0) - (was_active ? 1 : 0);
  TrackIndexes(entry);

  AfterCommit([this, id = entry.job.id(), stored = std::move(stored)]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                    for (const v1::Event& ev : stored) {
                      v1::JobUpdate u;
                      *u.mutable_event() = ev;
                      hub_->Publish(id, u);
                    }
                  });
  PublishSnapshot(entry);
  if (IsTerminal(entry.job.state()) && !IsTerminal(from)) {
    AfterCommit([this, id = entry.job.id()]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { hub_->JobEnded(id); });
  }
  return absl::OkStatus();
}

void JobBook::PublishSnapshot(const JobEntry& entry) {
  CheckOnLoop();
  v1::JobUpdate snapshot;
  *snapshot.mutable_job() = entry.job;
  snapshot.mutable_job()->clear_attempts();
  AfterCommit([this, id = entry.job.id(), snapshot = std::move(snapshot)]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { hub_->Publish(id, snapshot); });
}

void JobBook::AfterCommit(std::function<void()> effect) {
  CheckOnLoop();
  if (in_group_) {
    held_effects_.push_back(std::move(effect));
    return;
  }
  effect();
}

void JobBook::Remember(const std::string& job_id) {
  if (!in_group_ || before_.contains(job_id)) return;
  Before b;
  if (auto it = jobs_.find(job_id); it != jobs_.end()) b.entry = it->second;
  b.unsettled = unsettled_.contains(job_id);
  if (auto it = pending_reasons_.find(job_id); it != pending_reasons_.end())
    b.pending_reason = it->second;
  before_.emplace(job_id, std::move(b));
}

void JobBook::GroupBegun() {
  CheckOnLoop();
  if (in_group_) BrokenInvariant("a store group began inside another");
  in_group_ = true;
  next_submit_seq_before_ = next_submit_seq_;
}

void JobBook::GroupEnded(bool committed) {
  CheckOnLoop();
  if (!in_group_) BrokenInvariant("a store group ended that never began");
  in_group_ = false;
  std::vector<std::function<void()>> effects = std::move(held_effects_);
  held_effects_.clear();
  absl::flat_hash_map<std::string, Before> before = std::move(before_);
  before_.clear();
  if (committed) {
    for (std::function<void()>& effect : effects) effect();
    return;
  }
  // Rolled back: every job the group touched goes back to how it was (and
  // with it its indexes); nothing it would have sent goes out.
  next_submit_seq_ = next_submit_seq_before_;
  for (auto& [id, b] : before) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && !IsTerminal(it->second.job.state()) &&
        it->second.job.state() != v1::JOB_STATE_UNSPECIFIED) {
      --active_jobs_;
    }
    if (!b.entry.has_value()) {
      if (it != jobs_.end()) jobs_.erase(it);
      pending_.erase(id);
      holding_slots_.erase(id);
    } else {
      if (!IsTerminal(b.entry->job.state()) && b.entry->job.state() != v1::JOB_STATE_UNSPECIFIED)
        ++active_jobs_;
      JobEntry& e = it != jobs_.end() ? it->second : jobs_[id];
      e = std::move(*b.entry);
      TrackIndexes(e);
    }
    if (b.unsettled) {
      unsettled_.insert(id);
    } else {
      unsettled_.erase(id);
    }
    if (b.pending_reason.has_value()) {
      pending_reasons_[id] = std::move(*b.pending_reason);
    } else {
      pending_reasons_.erase(id);
    }
  }
}

absl::StatusOr<JobEntry*> JobBook::ForWorker(const std::string& worker_id,
                                             const std::string& job_id, int32_t attempt,
                                             int32_t rank, bool allow_stale,
                                             v1::Attempt** attempt_out) {
  JobEntry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job ", job_id));
  if (attempt < 1 || attempt > e->job.attempts_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attempt: job ", job_id, " has no attempt ", attempt));
  }
  bool stale = attempt != e->job.attempts_size();
  if (stale && !allow_stale) {
    return absl::AbortedError(absl::StrCat("attempt ", attempt, " of job ", job_id,
                                           " is stale (current: ", e->job.attempts_size(), ")"));
  }
  v1::Attempt* a = e->job.mutable_attempts(attempt - 1);
  if (rank >= 0) {
    if (rank >= a->ranks_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank: ", rank, " is not in [0, ", a->ranks_size(), ")"));
    }
    if (a->ranks(rank).worker_id() != worker_id) {
      return absl::PermissionDeniedError(
          absl::StrCat("rank ", rank, " of ", job_id, " is not assigned to worker ", worker_id));
    }
  }
  *attempt_out = a;
  return e;
}

void JobBook::ForEachLiveRank(const std::function<void(const v1::RankAssignment&)>& fn) const {
  CheckOnLoop();
  for (const std::string& id : holding_slots_) {
    for (const v1::Attempt& a : jobs_.at(id).job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        if (!IsTerminal(r.state())) fn(r);
      }
    }
  }
}

absl::flat_hash_map<std::string, std::vector<int>> JobBook::BusySlotsByWorker() const {
  absl::flat_hash_map<std::string, std::vector<int>> busy;
  ForEachLiveRank(
      [&](const v1::RankAssignment& r) { busy[r.worker_id()].push_back(r.slot().index()); });
  return busy;
}

std::vector<int> JobBook::BusySlots(const std::string& worker_id) const {
  std::vector<int> busy;
  ForEachLiveRank([&](const v1::RankAssignment& r) {
    if (r.worker_id() == worker_id) busy.push_back(r.slot().index());
  });
  return busy;
}

}  // namespace trainctl::coordinator

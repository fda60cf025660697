#include "coordinator/jobs/job_health.h"
#include "coordinator/core/retry_log.h"

#include <algorithm>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/time_util.h"
#include "coordinator/jobs/attempt_failure.h"

namespace trainctl::coordinator {

absl::Duration JobHealth::ProgressTimeout(const v1::Job& job) const {
  int32_t s = job.spec().restart().progress_timeout_s();
  return s > 0 ? absl::Seconds(s) : options_.progress_timeout;
}

namespace {
// restart.progress_timeout_s: -1 turns progress checks off (a job that
// legitimately pauses longer than any bound); a silent engine rank is
// still caught.
constexpr int32_t kProgressChecksOff = -1;
}  // namespace

absl::Status JobHealth::CheckScriptHang(JobEntry& e, const v1::Attempt& a, absl::Time now) {
  if (e.script_watch.attempt() != a.number()) return absl::OkStatus();  // Nothing heard yet.
  std::optional<HangVerdict> v = e.script_watch.Check(a, now, options_.progress_timeout);
  if (!v.has_value()) return absl::OkStatus();
  return FailHung(e, a, *v);
}

absl::Status JobHealth::FailHung(JobEntry& e, const v1::Attempt& a, const HangVerdict& v) {
  const int blamed = v.blamed.empty() ? -1 : v.blamed.front();
  absl::Status s =
      actions_->FailAttempt(e, e.job, {{"hang", v.message, a.number(), blamed}},
                            v1::FAILURE_KIND_HANG, absl::StrCat("hung: ", v.message), blamed);
  if (s.ok()) {
    ++hangs_detected_;
    actions_->RequestSchedule();
  }
  return s;
}

void JobHealth::CheckAttempts(absl::Time now) {
  std::vector<std::string> ids(book_->holding_slots().begin(), book_->holding_slots().end());
  for (const std::string& id : ids) {
    JobEntry& e = book_->At(id);
    if (IsTerminal(e.job.state())) continue;
    const v1::Attempt* a = CurrentAttempt(e.job);
    if (a == nullptr || AttemptEnded(a->state())) continue;
    absl::Status s;
    // Engine jobs are judged from the ranks' heartbeats (only their ranks
    // send them, so only they are in the watch). A rank whose heartbeat is
    // missing past the bound is hung in any phase, while the attempt starts
    // too (a resume's checkpoint broadcast) and with a fixed progress
    // timeout too: the heartbeat does not depend on steps. The adaptive
    // stall bound applies while running, unless the spec fixes one.
    const bool watched = e.watch.attempt() == a->number();
    const bool adaptive = watched && a->state() != v1::ATTEMPT_STATE_STARTING &&
                          !e.job.spec().has_command() &&
                          e.job.spec().restart().progress_timeout_s() == 0;
    if (watched && CheckAdaptiveHang(e, *a, now, /*stall_rule=*/adaptive)) continue;
    if (a->state() == v1::ATTEMPT_STATE_STARTING) {
      s = CheckStarting(e, *a, now);
    } else if (e.job.spec().restart().progress_timeout_s() == kProgressChecksOff) {
      // The job pauses legitimately: no progress check.
    } else if (e.job.spec().has_command() && e.job.spec().restart().progress_timeout_s() == 0) {
      // The user's script: its reports and its ranks' Python stacks, on a
      // bound learned from its own report intervals (script_watch.h).
      s = CheckScriptHang(e, *a, now);
    } else {
      // The fixed timeout stays as the backstop for what heartbeats cannot
      // judge (a rank that never sent one).
      if (adaptive) RecordStragglers(e, *a);
      s = CheckProgressTimeout(e, *CurrentAttempt(e.job), now);
    }
    LogDeferred(s, "retried at the next tick");
  }
}

absl::Status JobHealth::CheckStarting(JobEntry& e, const v1::Attempt& a, absl::Time now) {
  // `now` and the anchors are monotonic (JobEntry::start_mono).
  if (e.start_mono == absl::InfiniteFuture()) e.start_mono = now;
  if (now - e.start_mono <= options_.rendezvous_timeout) return absl::OkStatus();
  std::vector<std::string> waiting;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.state() != v1::RANK_STATE_RUNNING) waiting.push_back(absl::StrCat(r.rank()));
  }
  absl::Status s = actions_->FailAttempt(
      e, e.job, {}, v1::FAILURE_KIND_RENDEZVOUS,
      absl::StrCat("rendezvous timed out after ", absl::FormatDuration(options_.rendezvous_timeout),
                   "; ranks not ready: ", absl::StrJoin(waiting, ", ")),
      -1);
  if (s.ok()) actions_->RequestSchedule();
  return s;
}

bool JobHealth::CheckAdaptiveHang(JobEntry& e, const v1::Attempt& a, absl::Time now,
                                  bool stall_rule) {
  // Silence is counted only while the rank's worker keeps heartbeating on
  // its session (the same stream and loop as the rank's heartbeats).
  const RankWatch::LastHeard heard =
      [this](const std::string& worker_id)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return registry_->LastHeardMono(worker_id); };
  std::optional<HangVerdict> v = e.watch.CheckSilence(a, now, heard);
  if (!v.has_value() && stall_rule) v = e.watch.CheckHang(a, now);
  if (!v.has_value()) return false;
  LogDeferred(FailHung(e, a, *v), "retried at the next tick");
  return true;
}

void JobHealth::RecordStragglers(JobEntry& e, const v1::Attempt& a) {
  // Commit replaces e.job: copy what the events need from `a` first.
  const int32_t number = a.number();
  for (const Straggler& st : e.watch.TakeStragglers(a)) {
    std::string message = st.message;
    const std::string worker = CurrentAttempt(e.job)->ranks(st.rank).worker_id();
    const bool avoid = e.job.spec().stragglers().policy() == v1::STRAGGLER_POLICY_AVOID;
    if (avoid) absl::StrAppend(&message, "; the next attempt avoids worker ", worker, " if it can");
    if (!book_->Commit(e, e.job, {{"straggler", message, number, st.rank}}).ok()) continue;
    ++straggler_events_;
    if (avoid && std::find(e.avoid_workers.begin(), e.avoid_workers.end(), worker) ==
                     e.avoid_workers.end()) {
      e.avoid_workers.push_back(worker);
    }
  }
}

absl::Status JobHealth::CheckProgressTimeout(JobEntry& e, const v1::Attempt& a, absl::Time now) {
  const absl::Duration timeout = ProgressTimeout(e.job);
  std::vector<std::string> stuck;
  int first = -1;
  for (const v1::RankAssignment& r : a.ranks()) {
    if (IsTerminal(r.state())) continue;
    const absl::Time last = e.progress_mono.try_emplace(r.rank(), now).first->second;
    if (now - last > timeout) {
      stuck.push_back(absl::StrCat(r.rank(), " (", r.host(), ", last step ", r.last_step(), ")"));
      if (first < 0) first = r.rank();
    }
  }
  if (stuck.empty()) return absl::OkStatus();
  absl::Status s =
      actions_->FailAttempt(e, e.job, {}, v1::FAILURE_KIND_HANG,
                            absl::StrCat("hung: no progress for ", absl::FormatDuration(timeout),
                                         " from rank(s) ", absl::StrJoin(stuck, ", ")),
                            first);
  if (s.ok()) actions_->RequestSchedule();
  return s;
}

void JobHealth::OnWorkerLost(const std::string& worker_id) {
  const std::string why = registry_->LossReason(worker_id);
  std::vector<std::string> ids(book_->holding_slots().begin(), book_->holding_slots().end());
  for (const std::string& id : ids) {
    JobEntry& e = book_->At(id);
    v1::Job next = e.job;
    int failed_rank = -1;
    bool changed = false;
    for (int ai = 0; ai < next.attempts_size(); ++ai) {
      v1::Attempt* a = next.mutable_attempts(ai);
      bool current =
          ai == next.attempts_size() - 1 && !AttemptEnded(a->state()) && !IsTerminal(next.state());
      for (v1::RankAssignment& r : *a->mutable_ranks()) {
        if (r.worker_id() != worker_id || IsTerminal(r.state())) continue;
        r.set_state(current ? v1::RANK_STATE_FAILED : v1::RANK_STATE_STOPPED);
        r.mutable_exit()->set_kind(v1::FAILURE_KIND_WORKER_LOST);
        r.mutable_exit()->set_exit_code(-1);
        r.mutable_exit()->set_message(why);
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
      s = actions_->FailAttempt(e, std::move(next), {}, v1::FAILURE_KIND_WORKER_LOST, reason,
                                failed_rank);
    } else {
      s = book_->Commit(e, std::move(next), {});
    }
    // Memory is untouched: RetryLostWorkers finds these ranks on a LOST worker again.
    LogDeferred(s, "retried at the next tick", {{"worker_id", worker_id}, {"on", "worker lost"}});
  }
  actions_->RequestSchedule();
}

void JobHealth::RetryLostWorkers() {
  absl::btree_set<std::string> lost;
  for (const std::string& id : book_->holding_slots()) {
    for (const v1::Attempt& a : book_->At(id).job.attempts()) {
      for (const v1::RankAssignment& r : a.ranks()) {
        if (IsTerminal(r.state()) || lost.contains(r.worker_id())) continue;
        const v1::Worker* w = registry_->Find(r.worker_id());
        if (w != nullptr && w->state() == v1::WORKER_STATE_LOST) lost.insert(r.worker_id());
      }
    }
  }
  for (const std::string& w : lost) OnWorkerLost(w);
}

}  // namespace trainctl::coordinator

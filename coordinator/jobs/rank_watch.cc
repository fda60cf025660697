#include "coordinator/jobs/rank_watch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainctl::coordinator {
namespace {

bool Ended(v1::RankState s) {
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED || s == v1::RANK_STATE_STOPPED;
}

std::string Secs(absl::Duration d) { return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d)); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string DescribeCollective(v1::CollectiveOp op, int64_t seq, int64_t step, int32_t bucket) {
  const char* name = op == v1::COLLECTIVE_OP_ALL_REDUCE  ? "all-reduce"
                     : op == v1::COLLECTIVE_OP_BROADCAST ? "broadcast"
                     : op == v1::COLLECTIVE_OP_BARRIER   ? "barrier"
                                                         : "collective";
  std::string out = absl::StrCat(name, " #", seq);
  if (op == v1::COLLECTIVE_OP_ALL_REDUCE && bucket >= 0) {
    absl::StrAppend(&out, " (step ", step, ", bucket ", bucket, ")");
  } else if (step > 0) {
    absl::StrAppend(&out, " (step ", step, ")");
  }
  return out;
}

std::string DescribePhase(const v1::RankProgress& p) {
  // The rank reports its step from its first epoch on: an init phase
  // after a step is the start of an epoch (its sampler, loader, first
  // batch); before any, start-up (resume, the initial broadcast).
  const char* name = p.phase() == v1::RANK_PHASE_TRAIN        ? "training"
                     : p.phase() == v1::RANK_PHASE_EVAL       ? "eval"
                     : p.phase() == v1::RANK_PHASE_CHECKPOINT ? "checkpoint"
                     : p.step() > 0                           ? "epoch start"
                                                              : "start-up";
  return absl::StrCat(name, " phase (epoch ", p.epoch() + 1, ", step ", p.step(), ")");
}

void RankWatch::Reset(int32_t attempt) {
  attempt_ = attempt;
  ranks_.clear();
}

void RankWatch::OnHeartbeat(const v1::RankProgress& p, absl::Time now, double straggler_threshold) {
  RankState& r = ranks_[p.rank()];
  const bool first = r.received == absl::Time();
  if (first || p.step() != r.last.step() || p.collective_seq() != r.last.collective_seq() ||
      p.phase() != r.last.phase()) {
    r.advanced = now;
  }
  r.last = p;
  r.received = now;
  if (straggler_threshold <= 0 || p.phase() != v1::RANK_PHASE_TRAIN || p.compute_ms() <= 0) return;
  std::vector<double> others;
  for (const auto& [rank, o] : ranks_) {
    if (rank == p.rank() || o.last.phase() != v1::RANK_PHASE_TRAIN || o.last.compute_ms() <= 0)
      continue;
    others.push_back(o.last.compute_ms());
  }
  if (others.empty()) return;
  if (p.compute_ms() > (1 + straggler_threshold) * Median(others)) {
    ++r.slow_streak;
  } else {
    r.slow_streak = 0;
  }
}

absl::Duration RankWatch::Bound(double p99_ms) const {
  return std::max(absl::Milliseconds(options_.hang_factor * p99_ms), options_.hang_floor);
}

std::optional<HangVerdict> RankWatch::CheckSilence(const v1::Attempt& attempt, absl::Time now,
                                                   const LastHeard& heard) const {
  std::vector<Live> live;
  double p99_ms = 0;
  for (const v1::RankAssignment& a : attempt.ranks()) {
    if (Ended(a.state())) continue;
    auto it = ranks_.find(a.rank());
    if (it == ranks_.end() || !it->second.last.has_heartbeat()) continue;
    live.push_back({&a, &it->second});
    p99_ms = std::max(p99_ms, it->second.last.p99_step_ms());
  }
  const absl::Duration bound = Bound(p99_ms);
  std::vector<const Live*> silent;
  for (const Live& l : live) {
    // Silence as the rank's worker saw it: only while the coordinator kept
    // hearing from that worker does a missing heartbeat count.
    absl::Time until = now;
    if (heard != nullptr) until = std::min(now, heard(l.assignment->worker_id()));
    if (until - l.state->received > bound) silent.push_back(&l);
  }
  if (silent.empty()) return std::nullopt;

  HangVerdict v;
  v.bound = bound;
  // The collective the ranks still reporting wait in, if any.
  const Live* ref = LowestWaiter(live, now);
  const int64_t n = ref == nullptr ? 0 : ref->state->last.waiting_seq();
  std::string coll;
  if (ref != nullptr) {
    const v1::RankProgress& rp = ref->state->last;
    coll = DescribeCollective(rp.op(), n, rp.op_step(), rp.op_bucket());
  }
  std::vector<std::string> parts, quiet;
  for (const Live* l : silent) {
    const v1::RankProgress& p = l->state->last;
    v.blamed.push_back(l->assignment->rank());
    std::string s =
        absl::StrCat("rank ", l->assignment->rank(), " (worker ", l->assignment->worker_id());
    if (p.pid() > 0) absl::StrAppend(&s, ", pid ", p.pid());
    absl::StrAppend(&s, ")");
    if (ref != nullptr) {
      // "rank 1 (…) stopped before all-reduce #18 (step 501, bucket 0) in its
      // epoch start phase (epoch 2, step 500)".
      absl::StrAppend(&s, p.collective_seq() >= n ? " stopped in " : " stopped before ", coll,
                      " in its ", DescribePhase(p));
    } else {
      absl::StrAppend(&s, " stopped in its ", DescribePhase(p));
      if (p.waiting_seq() > 0) {
        absl::StrAppend(&s, ", waiting in ",
                        DescribeCollective(p.op(), p.waiting_seq(), p.op_step(), p.op_bucket()));
      } else if (p.collective_seq() > 0) {
        absl::StrAppend(&s, ", after ",
                        DescribeCollective(p.op(), p.collective_seq(), p.op_step(), p.op_bucket()));
      }
    }
    parts.push_back(std::move(s));
    quiet.push_back(
        absl::StrCat("rank ", l->assignment->rank(), " for ", Secs(now - l->state->received)));
  }
  if (ref == nullptr) {
    v.message = absl::StrCat(absl::StrJoin(parts, " and "), "; no heartbeat from ",
                             absl::StrJoin(quiet, ", "), " (bound ", Secs(bound), ")");
    return v;
  }
  std::vector<std::string> waiting_ranks;
  for (const Live& l : live) {
    if (Fresh(l, now) && l.state->last.waiting_seq() == n)
      waiting_ranks.push_back(absl::StrCat(l.assignment->rank()));
  }
  const v1::RankProgress& rp = ref->state->last;
  const absl::Duration waited = absl::Milliseconds(rp.waiting_ms()) + (now - ref->state->received);
  v.message = absl::StrCat(
      absl::StrJoin(parts, " and "), "; ", waiting_ranks.size() == 1 ? "rank " : "ranks ",
      absl::StrJoin(waiting_ranks, ", "), " waiting in it for ", Secs(waited), " (bound ",
      Secs(bound), "); no heartbeat from ", absl::StrJoin(quiet, ", "));
  return v;
}

std::optional<HangVerdict> RankWatch::CheckHang(const v1::Attempt& attempt, absl::Time now) const {
  double p99_ms = 0;
  std::optional<std::vector<Live>> live = TrainingRanks(attempt, &p99_ms);
  if (!live.has_value() || live->empty() || p99_ms <= 0) return std::nullopt;
  const absl::Duration bound = Bound(p99_ms);
  absl::Duration stalled = absl::InfiniteDuration();
  for (const Live& l : *live) stalled = std::min(stalled, now - l.state->advanced);
  if (stalled <= bound) return std::nullopt;
  const Live* ref = LowestWaiter(*live, now);
  // Without a rank that says it waits, silence must last longer before it is
  // a hang (a delayed telemetry stream looks like silence for a while).
  if (ref == nullptr && stalled <= 3 * bound) return std::nullopt;
  return Blame(*live, ref, stalled, bound, now);
}

std::optional<std::vector<RankWatch::Live>> RankWatch::TrainingRanks(const v1::Attempt& attempt,
                                                                     double* p99_ms) const {
  std::vector<Live> live;
  for (const v1::RankAssignment& a : attempt.ranks()) {
    if (Ended(a.state())) continue;
    auto it = ranks_.find(a.rank());
    if (it == ranks_.end() || !it->second.last.has_heartbeat() ||
        it->second.last.phase() != v1::RANK_PHASE_TRAIN) {
      return std::nullopt;
    }
    live.push_back({&a, &it->second});
    *p99_ms = std::max(*p99_ms, it->second.last.p99_step_ms());
  }
  return live;
}

const RankWatch::Live* RankWatch::LowestWaiter(const std::vector<Live>& live,
                                               absl::Time now) const {
  const Live* ref = nullptr;
  for (const Live& l : live) {
    const int64_t w = l.state->last.waiting_seq();
    if (!Fresh(l, now) || w <= 0) continue;
    if (ref == nullptr || w < ref->state->last.waiting_seq()) ref = &l;
  }
  return ref;
}

std::optional<HangVerdict> RankWatch::Blame(const std::vector<Live>& live, const Live* ref,
                                            absl::Duration stalled, absl::Duration bound,
                                            absl::Time now) const {
  auto who = [](const Live& l) {
    std::string s =
        absl::StrCat("rank ", l.assignment->rank(), " (worker ", l.assignment->worker_id());
    if (l.state->last.pid() > 0) absl::StrAppend(&s, ", pid ", l.state->last.pid());
    return s + ")";
  };
  HangVerdict v;
  v.bound = bound;
  std::vector<std::string> blamed_names, waiting_ranks, silent;
  bool all_before = true;
  const int64_t n = ref == nullptr ? 0 : ref->state->last.waiting_seq();
  for (const Live& l : live) {
    const v1::RankProgress& p = l.state->last;
    if (ref != nullptr && Fresh(l, now) && p.waiting_seq() == n) {
      waiting_ranks.push_back(absl::StrCat(l.assignment->rank()));
      continue;
    }
    v.blamed.push_back(l.assignment->rank());
    blamed_names.push_back(who(l));
    all_before &= p.collective_seq() < n;
    if (!Fresh(l, now)) {
      silent.push_back(
          absl::StrCat("rank ", l.assignment->rank(), " for ", Secs(now - l.state->received)));
    }
  }
  // A silent rank is strong evidence; ranks that all still report (one busy
  // outside the collectives, say on a slow read) get the longer bound too.
  if (silent.empty() && stalled <= 3 * bound) return std::nullopt;
  if (ref == nullptr) {
    v.message =
        absl::StrCat(absl::StrJoin(blamed_names, " and "), " made no progress for ", Secs(stalled),
                     " (bound ", Secs(bound), "); no heartbeat from ", absl::StrJoin(silent, ", "));
    return v;
  }
  const v1::RankProgress& rp = ref->state->last;
  const std::string coll = DescribeCollective(rp.op(), n, rp.op_step(), rp.op_bucket());
  const absl::Duration waited = absl::Milliseconds(rp.waiting_ms()) + (now - ref->state->received);
  if (v.blamed.empty()) {
    v.message = absl::StrCat("every rank has waited in ", coll, " for ", Secs(waited), " (bound ",
                             Secs(bound), "): the collective itself is stuck, no rank is missing");
    return v;
  }
  v.message = absl::StrCat(
      absl::StrJoin(blamed_names, " and "), all_before ? " stopped before " : " stopped in ", coll,
      "; ", waiting_ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(waiting_ranks, ", "),
      " waiting in it for ", Secs(waited), " (bound ", Secs(bound), ")");
  if (!silent.empty()) {
    absl::StrAppend(&v.message, "; no heartbeat from ", absl::StrJoin(silent, ", "));
  } else {
    absl::StrAppend(&v.message, "; ", v.blamed.size() == 1 ? "it is" : "they are",
                    " alive but outside the collective");
  }
  return v;
}

std::vector<Straggler> RankWatch::TakeStragglers(const v1::Attempt& attempt) {
  std::vector<Straggler> out;
  for (const v1::RankAssignment& a : attempt.ranks()) {
    auto it = ranks_.find(a.rank());
    if (it == ranks_.end() || Ended(a.state())) continue;
    RankState& r = it->second;
    if (r.straggler_reported || r.slow_streak < options_.straggler_reports) continue;
    std::vector<double> others;
    for (const auto& [rank, o] : ranks_) {
      if (rank != a.rank() && o.last.compute_ms() > 0) others.push_back(o.last.compute_ms());
    }
    if (others.empty()) continue;
    r.straggler_reported = true;
    Straggler s;
    s.rank = a.rank();
    s.compute_ms = r.last.compute_ms();
    s.median_others_ms = Median(others);
    s.message = absl::StrFormat(
        "rank %d (worker %s, host %s) is a straggler: %.1f ms of compute per step, %.0f%% slower "
        "than the "
        "median of the other ranks (%.1f ms), for %d heartbeats in a row",
        a.rank(), a.worker_id(), a.host(), s.compute_ms,
        100 * (s.compute_ms / s.median_others_ms - 1), s.median_others_ms, r.slow_streak);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace trainctl::coordinator

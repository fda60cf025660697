#include "coordinator/jobs/script_watch.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/jobs/job_transitions.h"

namespace trainctl::coordinator {
namespace {

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

std::string RankList(const std::vector<int32_t>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

void ScriptWatch::Reset(int32_t attempt) {
  attempt_ = attempt;
  ranks_.clear();
}

void ScriptWatch::OnProgress(const v1::RankProgress& p, absl::Time now) {
  auto [it, first] = ranks_.try_emplace(p.rank());
  RankState& st = it->second;
  if (first) st.first_heard = now;
  if (p.step() > st.step) {
    // Each rank's first two reports end start-up and the first step's
    // warm-up: only the intervals after them are learned.
    if (st.advances >= 2) st.longest = std::max(st.longest, now - st.stepped);
    st.step = p.step();
    st.stepped = now;
    ++st.advances;
  }
  if (!p.has_heartbeat()) return;
  if (!st.has_hook || p.stack_moves() != st.moves) st.moved = now;
  st.has_hook = true;
  st.moves = p.stack_moves();
  st.torch_wait_ms = p.torch_wait_ms();
  st.heard = now;
  if (p.pid() > 0) st.pid = p.pid();
}

absl::Duration ScriptWatch::Longest() const {
  absl::Duration longest = absl::ZeroDuration();
  for (const auto& [rank, st] : ranks_) longest = std::max(longest, st.longest);
  return longest;
}

absl::Duration ScriptWatch::Bound(absl::Duration unlearned) const {
  const absl::Duration longest = Longest();
  if (longest == absl::ZeroDuration()) return unlearned;
  return std::max(options_.floor, options_.factor * longest);
}

std::string ScriptWatch::DescribeBound(absl::Duration unlearned) const {
  const absl::Duration longest = Longest();
  if (longest == absl::ZeroDuration())
    return "no report interval learned yet: the coordinator's --progress-timeout-s";
  return absl::StrFormat("%g × the longest interval between reports, %s, at least %s",
                         options_.factor, Seconds(longest), Seconds(options_.floor));
}

std::optional<HangVerdict> ScriptWatch::Check(const v1::Attempt& attempt, absl::Time now,
                                              absl::Duration unlearned) const {
  struct Heard {
    const v1::RankAssignment* assignment;
    const RankState* state;
  };
  std::vector<Heard> live;
  absl::Time active = absl::InfinitePast();
  for (const v1::RankAssignment& r : attempt.ranks()) {
    if (IsTerminal(r.state())) continue;
    auto it = ranks_.find(r.rank());
    if (it == ranks_.end()) continue;
    live.push_back({&r, &it->second});
    active = std::max({active, it->second.first_heard, it->second.stepped, it->second.moved});
  }
  if (live.empty()) return std::nullopt;
  const absl::Duration bound = Bound(unlearned);
  const absl::Duration stalled = now - active;
  if (stalled <= bound) return std::nullopt;

  auto who = [](const Heard& h) {
    std::string s =
        absl::StrCat("rank ", h.assignment->rank(), " (worker ", h.assignment->worker_id());
    if (h.state->pid > 0) absl::StrAppend(&s, ", pid ", h.state->pid);
    return absl::StrCat(s, ")");
  };
  auto at_step = [](const Heard& h) {
    return h.state->advances > 0 ? absl::StrCat(" at step ", h.state->step)
                                 : std::string(" before any report");
  };
  HangVerdict v;
  v.bound = bound;
  std::string what;
  // 1. Some ranks wait in torch's collective code: the others hold them up.
  std::vector<const Heard*> waiting, not_waiting;
  for (const Heard& h : live) {
    const bool fresh = now - h.state->heard <= options_.fresh;
    (fresh && h.state->torch_wait_ms > 0 ? waiting : not_waiting).push_back(&h);
  }
  if (!waiting.empty() && !not_waiting.empty()) {
    std::vector<int32_t> others;
    int64_t longest_wait = 0;
    for (const Heard* h : waiting) {
      others.push_back(h->assignment->rank());
      longest_wait = std::max(longest_wait, h->state->torch_wait_ms);
    }
    std::vector<std::string> blamed;
    for (const Heard* h : not_waiting) {
      v.blamed.push_back(h->assignment->rank());
      blamed.push_back(absl::StrCat(who(*h), at_step(*h)));
    }
    what = absl::StrCat(absl::StrJoin(blamed, ", "), " stopped outside torch's collectives while ",
                        RankList(others), others.size() == 1 ? " has" : " have",
                        " waited in one for ", Seconds(absl::Milliseconds(longest_wait)));
  }
  // 2. Among the ranks that reported steps, those behind the furthest one.
  if (what.empty()) {
    const Heard* ahead = nullptr;
    for (const Heard& h : live) {
      if (h.state->advances > 0 && (ahead == nullptr || h.state->step > ahead->state->step))
        ahead = &h;
    }
    std::vector<std::string> blamed;
    std::vector<int32_t> ahead_ranks;
    for (const Heard& h : live) {
      if (h.state->advances == 0) continue;
      if (h.state->step < ahead->state->step) {
        v.blamed.push_back(h.assignment->rank());
        blamed.push_back(absl::StrCat(who(h), at_step(h)));
      } else {
        ahead_ranks.push_back(h.assignment->rank());
      }
    }
    if (!blamed.empty()) {
      what = absl::StrCat(absl::StrJoin(blamed, ", "), " stopped while ", RankList(ahead_ranks),
                          " reached step ", ahead->state->step);
    }
  }
  // 3. Nothing tells them apart.
  if (what.empty()) {
    std::vector<std::string> all;
    for (const Heard& h : live) {
      v.blamed.push_back(h.assignment->rank());
      all.push_back(absl::StrCat(who(h), at_step(h)));
    }
    what = absl::StrCat(absl::StrJoin(all, ", "), live.size() == 1 ? " stopped" : " all stopped",
                        " (none waits in a torch collective for the others, none is behind)");
  }
  bool hooked = false;
  for (const Heard& h : live) hooked = hooked || h.state->has_hook;
  v.message = absl::StrCat(
      what, "; no rank made progress (a step, a change of its Python stack) for ", Seconds(stalled),
      " (bound ", Seconds(bound), ": ", DescribeBound(unlearned), ")",
      hooked ? "; every rank's Python stack follows in its log (trainctl logs)" : "");
  return v;
}

}  // namespace trainctl::coordinator

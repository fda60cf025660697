// Hang detection for one attempt of a command job (the user's own script),
// where the engine's collective heartbeats (rank_watch.h) do not exist. What
// a script's rank tells the coordinator:
//
//  * its steps, from trainctl.report(step=...) (`progress` lines);
//  * with its Python start-up hook (python/trainctl/_rank_boot/
//    sitecustomize.py, put on every command rank's PYTHONPATH by the worker)
//    a heartbeat about once a second: how often its main thread's Python
//    stack changed (`stack_moves`: a rank blocked in one call, time.sleep or
//    a Gloo wait, stops changing it) and for how long its innermost frame
//    has been in torch's collective or autograd code (`torch_wait_ms`: it
//    waits for its peers).
//
// Stall: no rank heard from has advanced its step or changed its stack for
//     bound = max(factor × the longest interval between a rank's reports, floor)
// The intervals are learned from the attempt's own reports, leaving out each
// rank's first two (start-up, the first step's warm-up); until a rank gave
// one, the bound is the `unlearned` one the caller passes (the
// coordinator's --progress-timeout-s): a script that never reports is judged
// by its stacks alone, on that bound.
//
// Blame, in this order:
//  1. some ranks wait in torch's collective code and some do not: those that
//     do not (the others wait for them);
//  2. among the ranks that reported steps, those behind the furthest one;
//  3. otherwise every rank heard from (nothing tells them apart).
// A rank never heard from in the attempt (no report, no hook: a program that
// is not Python, `python -I`) is not judged.
//
// Memory only. Not thread-safe: owned by the JobManager, on the
// coordinator's loop.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/btree_map.h"
#include "absl/time/time.h"
#include "coordinator/jobs/rank_watch.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

struct ScriptWatchOptions {
  // bound = max(factor × the longest learned report interval, floor). With
  // reports at least every 9 s the bound is at most 45 s, and a hang is
  // reported within 60 s (bound, a heartbeat, the 200 ms check, the stacks'
  // second).
  double factor = 5;
  absl::Duration floor = absl::Seconds(15);
  // A rank's torch_wait_ms counts only from a heartbeat this recent.
  absl::Duration fresh = absl::Seconds(5);
};

class ScriptWatch {
 public:
  explicit ScriptWatch(ScriptWatchOptions options = {}) : options_(options) {}

  // Forgets everything (a new attempt).
  void Reset(int32_t attempt);
  int32_t attempt() const { return attempt_; }

  // A `progress` report or hook heartbeat of the attempt's rank arrived at `now`.
  void OnProgress(const v1::RankProgress& p, absl::Time now);

  // The stall bound now; `unlearned` while no rank gave an interval.
  absl::Duration Bound(absl::Duration unlearned) const;
  // "5 × the longest interval between reports, 0.2 s, at least 15 s".
  std::string DescribeBound(absl::Duration unlearned) const;

  // A verdict when the attempt's ranks heard from (states from `attempt`)
  // are stalled at `now`; nullopt when not, or when none was heard from.
  std::optional<HangVerdict> Check(const v1::Attempt& attempt, absl::Time now,
                                   absl::Duration unlearned) const;

 private:
  struct RankState {
    absl::Time first_heard;
    int64_t step = 0;
    int advances = 0;  // reports that advanced its step
    absl::Time stepped = absl::InfinitePast();
    absl::Duration longest = absl::ZeroDuration();  // the longest learned interval
    bool has_hook = false;
    int64_t moves = 0;
    absl::Time moved = absl::InfinitePast();
    int64_t torch_wait_ms = 0;
    absl::Time heard = absl::InfinitePast();  // its last heartbeat
    int32_t pid = 0;
  };
  // The longest learned interval of any rank (zero: none learned).
  absl::Duration Longest() const;

  ScriptWatchOptions options_;
  int32_t attempt_ = 0;
  absl::btree_map<int32_t, RankState> ranks_;
};

}  // namespace trainctl::coordinator

// Hang and straggler detection for one attempt of an engine job, from the
// ranks' heartbeats (RankProgress with has_heartbeat, about once a second
// each, sent by a reporter thread in the rank so that a rank blocked in a
// collective keeps reporting where it is blocked).
//
// Hang: every rank is in its training steps (phase TRAIN) and none has made
// progress (a new step or a new collective) for
//     bound = max(hang_factor × the ranks' largest recent p99 step time, hang_floor),
// with evidence: a rank that went silent while another still reports that it
// waits in a collective; without a silent rank, or without a waiting one, the
// stall must last 3 × bound (a rank busy on a slow read, a delayed stream). Blame goes to the ranks
// that are NOT waiting in the collective the others wait in (the lowest collective sequence number
// being waited on): a rank that went silent (SIGSTOP, frozen host) or one
// busy elsewhere. A rank blocked in a collective because a peer stopped is
// never the one blamed.
//
// Silence (CheckSilence): a rank whose heartbeat has been missing for longer
// than the bound is hung by itself, in any phase (start-up, resume, epoch
// start, eval, checkpoint, training) and whatever the other ranks do. The
// heartbeat comes from its own thread, so a rank that is merely slow (a long
// checkpoint write, a long eval) keeps beating and is never silent; a rank
// stopped (SIGSTOP) or frozen is. Silence is counted up to the last time the
// coordinator heard from the rank's worker, so that a late stream or a
// stalled coordinator loop (which delays the worker's heartbeats too) is not
// taken for a silent rank. Ranks that never sent a heartbeat in this
// attempt are left to the rendezvous and fixed progress timeouts.
//
// Straggler: a rank whose recent compute time per step exceeds the median
// of the other ranks' by more than `threshold`, in straggler_reports
// consecutive heartbeats, is reported once per attempt.
//
// Memory only (a coordinator restart starts watching afresh). Not
// thread-safe: owned by the JobManager, on the coordinator's loop.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

struct RankWatchOptions {
  // bound = max(hang_factor × p99 step time, hang_floor). The defaults find
  // a stall within 10 s when steps take under a second: 5 s of no progress,
  // plus up to a heartbeat interval and a check interval.
  double hang_factor = 5;
  absl::Duration hang_floor = absl::Seconds(5);
  // A rank whose last heartbeat is older than this has gone silent.
  absl::Duration silent_after = absl::Seconds(3);
  // Consecutive slow heartbeats (about one a second) that make a straggler.
  int straggler_reports = 5;
};

struct HangVerdict {
  // Ranks blamed (not waiting in the stalled collective), lowest first;
  // empty when every rank waits in it.
  std::vector<int32_t> blamed;
  // One line a person can act on, e.g. "rank 1 (worker w2, pid 77) stopped
  // before all-reduce #1234 (step 617, bucket 3); ranks 0, 2 waiting in it
  // for 9.8 s".
  std::string message;
  // The stall bound that was exceeded.
  absl::Duration bound;
};

struct Straggler {
  int32_t rank = 0;
  double compute_ms = 0;        // the rank's recent compute per step
  double median_others_ms = 0;  // the median of the other ranks'
  std::string message;
};

class RankWatch {
 public:
  explicit RankWatch(RankWatchOptions options = {}) : options_(options) {}

  // Forgets everything (a new attempt).
  void Reset(int32_t attempt);
  int32_t attempt() const { return attempt_; }

  // A heartbeat arrived at `now`. `straggler_threshold` <= 0 disables the
  // straggler streak.
  void OnHeartbeat(const v1::RankProgress& p, absl::Time now, double straggler_threshold);

  // A verdict when the attempt's ranks (from `attempt`, for worker ids and
  // states) are hung at `now` by the stall rule; nullopt when not, or when
  // this watch cannot tell (see the header comment).
  std::optional<HangVerdict> CheckHang(const v1::Attempt& attempt, absl::Time now) const;

  // When the coordinator last heard from a worker (its session's heartbeat);
  // absl::InfiniteFuture() when it cannot say (then `now` is used).
  using LastHeard = std::function<absl::Time(const std::string& worker_id)>;
  // A verdict when a live rank of `attempt` that sent heartbeats in it has
  // sent none for longer than the bound (see the header comment), naming
  // it, its phase and the collective it was last in or before; nullopt
  // when none is silent. `heard` may be null (every worker heard at `now`).
  std::optional<HangVerdict> CheckSilence(const v1::Attempt& attempt, absl::Time now,
                                          const LastHeard& heard) const;

  // Stragglers not reported yet in this attempt; each is returned once.
  std::vector<Straggler> TakeStragglers(const v1::Attempt& attempt);

 private:
  struct RankState {
    v1::RankProgress last;
    absl::Time received;
    absl::Time advanced;  // when (step, collective_seq) last changed
    int slow_streak = 0;
    bool straggler_reported = false;
  };
  // A rank of the attempt that has not ended, with what it last reported.
  struct Live {
    const v1::RankAssignment* assignment;
    const RankState* state;
  };

  // The parts of CheckHang: the attempt's live ranks when every one reports
  // training (else none), with the largest p99 step time among them; the
  // fresh rank waiting in the lowest collective (nullptr: none says it
  // waits); and the verdict that names who holds the others up.
  std::optional<std::vector<Live>> TrainingRanks(const v1::Attempt& attempt, double* p99_ms) const;
  const Live* LowestWaiter(const std::vector<Live>& live, absl::Time now) const;
  std::optional<HangVerdict> Blame(const std::vector<Live>& live, const Live* ref,
                                   absl::Duration stalled, absl::Duration bound,
                                   absl::Time now) const;
  // max(hang_factor × the largest p99 step time of `live`, hang_floor).
  absl::Duration Bound(double p99_ms) const;
  // It reported within options_.silent_after of `now`.
  bool Fresh(const Live& l, absl::Time now) const {
    return now - l.state->received <= options_.silent_after;
  }

  RankWatchOptions options_;
  int32_t attempt_ = 0;
  absl::flat_hash_map<int32_t, RankState> ranks_;
};

// "all-reduce #12 (step 6, bucket 1)", "broadcast #3 (step 0)", "barrier #40".
std::string DescribeCollective(v1::CollectiveOp op, int64_t seq, int64_t step, int32_t bucket);

// "checkpoint phase (epoch 2, step 500)": where a heartbeat says its rank is
// (the epoch 1-based, as logs and events count them).
std::string DescribePhase(const v1::RankProgress& p);

}  // namespace trainctl::coordinator

// LocalRankState: the one record of where a rank this daemon was assigned
// stands, from assignment to its reported end. It replaces the booleans the
// daemon used to keep (launched, exited, stop requested, end reported,
// ready); the RankState the daemon reports for an end is derived from it.
//
//   kWaiting ──launch──▶ kStarting ──ready──▶ kRunning
//      │                    │  └──stop──▶ kStopping ◀──stop──┘
//      │                    │                │
//      ├─stop─▶ kStopped    ├─exit─▶ kSucceeded | kFailed (by exit code)
//      └─launch failed─▶ kFailed            └─exit─▶ kStopped
//
// Every end (kSucceeded, kFailed, kStopped) is reported to the coordinator
// exactly once, by the handler that made the transition; an end refuses
// every further event, so a late exit or status line reports nothing twice.
//
// Not thread-safe: a value type owned by the daemon's EventLoop.
#pragma once

#include "trainctl/v1/job.pb.h"

namespace trainctl::worker {

enum class RankPhase {
  // Assigned; its process is not started (rendezvous still to come).
  kWaiting,
  // Its process was started (or is being started); not yet ready.
  kStarting,
  // Reported ready (an engine rank's `ready` line; a command rank at start).
  kRunning,
  // A stop was sent to its running process; its exit ends it as kStopped.
  kStopping,
  // Exited with code 0. Reported.
  kSucceeded,
  // Exited otherwise, or could not be started. Reported.
  kFailed,
  // Stopped on request (before or after it started). Reported.
  kStopped,
};

enum class RankEvent {
  // The daemon starts its process.
  kLaunch,
  // The process could not be started (config, path, spawn): kFailed.
  kLaunchFailed,
  // The rank reported ready.
  kReady,
  // The coordinator asked to stop it.
  kStop,
  // Its process exited with code 0.
  kExitZero,
  // Its process exited otherwise (non-zero code or a signal).
  kExitNonZero,
};

// The phase `event` leads to from `from`, or `from` itself with *refused set
// when the event makes no sense there (every event after an end, a second
// launch, ready before launch). Accepted no-ops: kReady while kRunning or
// kStopping (a stopping rank may still report ready), kStop while kStopping.
RankPhase NextPhase(RankPhase from, RankEvent event, bool* refused);

const char* RankPhaseName(RankPhase phase);

class LocalRankState {
 public:
  // Applies `event`; false (and no change) when NextPhase refuses it.
  bool Apply(RankEvent event);

  RankPhase phase() const { return phase_; }
  // Not started yet (and not ended).
  bool waiting() const { return phase_ == RankPhase::kWaiting; }
  // Its process was started and has not exited.
  bool live() const {
    return phase_ == RankPhase::kStarting || phase_ == RankPhase::kRunning ||
           phase_ == RankPhase::kStopping;
  }
  // Ended and reported: nothing more is said about it.
  bool ended() const {
    return phase_ == RankPhase::kSucceeded || phase_ == RankPhase::kFailed ||
           phase_ == RankPhase::kStopped;
  }
  bool stop_requested() const {
    return phase_ == RankPhase::kStopping || phase_ == RankPhase::kStopped;
  }
  // The RankState the coordinator is told for this phase.
  v1::RankState proto() const;
  // The /metrics label: waiting, starting, running (ready or stopping), exited.
  const char* gauge_label() const;

 private:
  RankPhase phase_ = RankPhase::kWaiting;
};

}  // namespace trainctl::worker

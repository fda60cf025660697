#include "worker/daemon/local_rank_state.h"

namespace trainctl::worker {

RankPhase NextPhase(RankPhase from, RankEvent event, bool* refused) {
  *refused = false;
  auto refuse = [&] {
    *refused = true;
    return from;
  };
  switch (from) {
    case RankPhase::kWaiting:
      switch (event) {
        case RankEvent::kLaunch:
          return RankPhase::kStarting;
        case RankEvent::kLaunchFailed:
          return RankPhase::kFailed;
        case RankEvent::kStop:
          return RankPhase::kStopped;
        default:
          return refuse();
      }
    case RankPhase::kStarting:
    case RankPhase::kRunning:
      switch (event) {
        case RankEvent::kReady:
          return RankPhase::kRunning;
        // Spawning failed after the launch began.
        case RankEvent::kLaunchFailed:
          return from == RankPhase::kStarting ? RankPhase::kFailed : refuse();
        case RankEvent::kStop:
          return RankPhase::kStopping;
        case RankEvent::kExitZero:
          return RankPhase::kSucceeded;
        case RankEvent::kExitNonZero:
          return RankPhase::kFailed;
        default:
          return refuse();
      }
    case RankPhase::kStopping:
      switch (event) {
        case RankEvent::kReady:
        case RankEvent::kStop:
          return RankPhase::kStopping;
        case RankEvent::kExitZero:
        case RankEvent::kExitNonZero:
          return RankPhase::kStopped;
        default:
          return refuse();
      }
    case RankPhase::kSucceeded:
    case RankPhase::kFailed:
    case RankPhase::kStopped:
      return refuse();
  }
  return refuse();
}

const char* RankPhaseName(RankPhase phase) {
  switch (phase) {
    case RankPhase::kWaiting:
      return "waiting";
    case RankPhase::kStarting:
      return "starting";
    case RankPhase::kRunning:
      return "running";
    case RankPhase::kStopping:
      return "stopping";
    case RankPhase::kSucceeded:
      return "succeeded";
    case RankPhase::kFailed:
      return "failed";
    case RankPhase::kStopped:
      return "stopped";
  }
  return "unknown";
}

bool LocalRankState::Apply(RankEvent event) {
  bool refused = false;
  phase_ = NextPhase(phase_, event, &refused);
  return !refused;
}

v1::RankState LocalRankState::proto() const {
  switch (phase_) {
    case RankPhase::kWaiting:
      return v1::RANK_STATE_ASSIGNED;
    case RankPhase::kStarting:
      return v1::RANK_STATE_STARTING;
    case RankPhase::kRunning:
    case RankPhase::kStopping:
      return v1::RANK_STATE_RUNNING;
    case RankPhase::kSucceeded:
      return v1::RANK_STATE_SUCCEEDED;
    case RankPhase::kFailed:
      return v1::RANK_STATE_FAILED;
    case RankPhase::kStopped:
      return v1::RANK_STATE_STOPPED;
  }
  return v1::RANK_STATE_UNSPECIFIED;
}

const char* LocalRankState::gauge_label() const {
  switch (phase_) {
    case RankPhase::kWaiting:
      return "waiting";
    case RankPhase::kStarting:
      return "starting";
    case RankPhase::kRunning:
    case RankPhase::kStopping:
      return "running";
    default:
      return "exited";
  }
}

}  // namespace trainctl::worker

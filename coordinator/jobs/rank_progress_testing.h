// A rank's progress heartbeat in its training steps, for the tests of the
// hang and straggler detection (rank_watch_test, the JobManager tests).
#pragma once

#include <cstdint>

#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::coordinator {

struct HeartbeatShape {
  int32_t bucket_when_waiting = 0;  // op_bucket while waiting in a collective
  double p99_step_ms = 100;
  int32_t pid_base = 500;  // pid = pid_base + rank
};

// Rank `rank` of attempt 1 at `step`, its collective sequence at `seq` and,
// when `waiting_seq` > 0, waiting in all-reduce #waiting_seq.
inline v1::RankProgress TrainHeartbeat(int rank, int64_t step, int64_t seq, int64_t waiting_seq,
                                       double compute_ms, HeartbeatShape shape = {}) {
  v1::RankProgress p;
  p.set_attempt(1);
  p.set_rank(rank);
  p.set_step(step);
  p.set_has_heartbeat(true);
  p.set_phase(v1::RANK_PHASE_TRAIN);
  p.set_collective_seq(seq);
  p.set_waiting_seq(waiting_seq);
  p.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  p.set_op_step(step + 1);
  p.set_op_bucket(waiting_seq > 0 ? shape.bucket_when_waiting : 0);
  p.set_p99_step_ms(shape.p99_step_ms);
  p.set_compute_ms(compute_ms);
  p.set_pid(shape.pid_base + rank);
  return p;
}

}  // namespace trainctl::coordinator

// Where a rank stands in its collectives, readable from another thread at any
// time: the rank's heartbeat reporter (rank_main.cc) reads it about once a
// second and sends it on the status pipe, so that the coordinator can tell a
// rank blocked inside a collective (waiting for a peer) from the peer that
// never joined it, and spot a rank whose compute is consistently slower.
//
// TrackedCollectives wraps the engine the training loop uses and numbers
// every collective it issues (the collective sequence number, the same on
// every rank since all ranks issue the same collectives in the same order);
// the trainer tells the probe its phase and the step in progress, and hands
// it each finished step's times.
//
// Threading: the per-collective path (issue, wait begin/end) touches only
// relaxed atomics; EndStep (once per optimizer step) and Snapshot (the
// reporter, once a second) share a mutex-guarded window of step times. A
// Snapshot taken while a collective starts may mix two neighbouring states;
// the coordinator reads many snapshots and tolerates that.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/dist/collectives.h"

namespace trainctl::dist {

// What the rank's training loop is doing.
enum class ProbePhase : int {
  kInit = 0,        // starting: resume, initial broadcast
  kTrain = 1,       // training steps
  kEval = 2,        // evaluation at the end of an epoch
  kCheckpoint = 3,  // writing a checkpoint or exporting the model
};
const char* ProbePhaseName(ProbePhase p);

// Kind of collective.
enum class ProbeOp : int { kNone = 0, kAllReduce = 1, kBroadcast = 2, kBarrier = 3 };
const char* ProbeOpName(ProbeOp op);

struct ProbeSnapshot {
  ProbePhase phase = ProbePhase::kInit;
  int64_t seq = 0;              // collectives issued
  int64_t waiting_seq = 0;      // the collective being waited on, 0 = none
  ProbeOp op = ProbeOp::kNone;  // waiting_seq's op, else the last issued
  int64_t op_step = 0;
  int32_t op_bucket = -1;
  absl::Duration waiting;  // how long waiting_seq has blocked
  double p99_step_ms = 0;  // over the recent window; 0 before any step
  double compute_ms = 0;   // mean over the recent window
};

class CollectiveProbe {
 public:
  // Steps the percentile and the compute mean are taken over.
  static constexpr size_t kWindow = 64;

  void SetPhase(ProbePhase p) { phase_.store(static_cast<int>(p), std::memory_order_relaxed); }
  // The optimizer step now in progress (1-based); all-reduces issued from
  // here until the next call are its gradient buckets, in launch order.
  void BeginStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  // A finished step's wall time and its compute part (less data loading and
  // exposed communication).
  void EndStep(double step_ms, double compute_ms);

  // Called by TrackedCollectives.
  struct Issued {
    int64_t seq = 0;
    ProbeOp op = ProbeOp::kNone;
    int64_t step = 0;
    int32_t bucket = -1;
  };
  Issued OnIssue(ProbeOp op);
  void OnWaitBegin(const Issued& what);
  void OnWaitEnd(const Issued& what);

  ProbeSnapshot Snapshot() const;

 private:
  static int64_t NowNanos() { return absl::GetCurrentTimeNanos(); }

  std::atomic<int> phase_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> seq_{0};
  // Last issued op, and the all-reduce count within bucket_step_ (issues
  // are serialised by the caller, possibly from several threads).
  std::atomic<int> last_op_{0};
  std::atomic<int64_t> last_step_{0};
  std::atomic<int32_t> last_bucket_{-1};
  std::atomic<int64_t> bucket_step_{-1};
  std::atomic<int32_t> buckets_in_step_{0};
  // The collective being waited on (waiting_seq_ 0 = none).
  std::atomic<int64_t> waiting_seq_{0};
  std::atomic<int> waiting_op_{0};
  std::atomic<int64_t> waiting_step_{0};
  std::atomic<int32_t> waiting_bucket_{-1};
  std::atomic<int64_t> waiting_since_ns_{0};

  mutable absl::Mutex mu_;
  std::vector<double> step_ms_ ABSL_GUARDED_BY(mu_);     // ring of kWindow
  std::vector<double> compute_ms_ ABSL_GUARDED_BY(mu_);  // same positions
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Collectives that reports every issue and wait to `probe` and forwards
// to `inner`. Same contract and threading as `inner`.
class TrackedCollectives : public Collectives {
 public:
  TrackedCollectives(std::shared_ptr<Collectives> inner, std::shared_ptr<CollectiveProbe> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  CommDevice device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  absl::Duration timeout() const override { return inner_->timeout(); }
  std::shared_ptr<CollectiveWork> AllReduceSum(CommBuffer buffer) override;
  std::shared_ptr<CollectiveWork> Broadcast(CommBuffer buffer, int root) override;
  absl::Status Barrier() override;
  void Abort() override { inner_->Abort(); }
  void RecordWorkTimes() override { inner_->RecordWorkTimes(); }
  absl::StatusOr<std::shared_ptr<void>> AllocateShared(size_t bytes) override {
    return inner_->AllocateShared(bytes);
  }

 private:
  std::shared_ptr<Collectives> inner_;
  std::shared_ptr<CollectiveProbe> probe_;
};

}  // namespace trainctl::dist

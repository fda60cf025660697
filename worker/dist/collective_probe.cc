#include "worker/dist/collective_probe.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace trainctl::dist {

const char* ProbePhaseName(ProbePhase p) {
  switch (p) {
    case ProbePhase::kInit:
      return "init";
    case ProbePhase::kTrain:
      return "train";
    case ProbePhase::kEval:
      return "eval";
    case ProbePhase::kCheckpoint:
      return "checkpoint";
  }
  return "init";
}

const char* ProbeOpName(ProbeOp op) {
  switch (op) {
    case ProbeOp::kNone:
      return "none";
    case ProbeOp::kAllReduce:
      return "allreduce";
    case ProbeOp::kBroadcast:
      return "broadcast";
    case ProbeOp::kBarrier:
      return "barrier";
  }
  return "none";
}

void CollectiveProbe::EndStep(double step_ms, double compute_ms) {
  absl::MutexLock l(&mu_);
  if (step_ms_.size() < kWindow) {
    step_ms_.push_back(step_ms);
    compute_ms_.push_back(compute_ms);
    return;
  }
  step_ms_[next_] = step_ms;
  compute_ms_[next_] = compute_ms;
  next_ = (next_ + 1) % kWindow;
}

CollectiveProbe::Issued CollectiveProbe::OnIssue(ProbeOp op) {
  Issued i;
  i.op = op;
  i.step = step_.load(std::memory_order_relaxed);
  if (op == ProbeOp::kAllReduce) {
    if (i.step != bucket_step_.load(std::memory_order_relaxed)) {
      bucket_step_.store(i.step, std::memory_order_relaxed);
      buckets_in_step_.store(0, std::memory_order_relaxed);
    }
    i.bucket = buckets_in_step_.fetch_add(1, std::memory_order_relaxed);
  }
  i.seq = seq_.load(std::memory_order_relaxed) + 1;
  last_op_.store(static_cast<int>(op), std::memory_order_relaxed);
  last_step_.store(i.step, std::memory_order_relaxed);
  last_bucket_.store(i.bucket, std::memory_order_relaxed);
  seq_.store(i.seq, std::memory_order_release);
  return i;
}

void CollectiveProbe::OnWaitBegin(const Issued& what) {
  waiting_op_.store(static_cast<int>(what.op), std::memory_order_relaxed);
  waiting_step_.store(what.step, std::memory_order_relaxed);
  waiting_bucket_.store(what.bucket, std::memory_order_relaxed);
  waiting_since_ns_.store(NowNanos(), std::memory_order_relaxed);
  waiting_seq_.store(what.seq, std::memory_order_release);
}

void CollectiveProbe::OnWaitEnd(const Issued& what) {
  // Only the wait that began last clears (a work may be waited on twice).
  int64_t expected = what.seq;
  waiting_seq_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

ProbeSnapshot CollectiveProbe::Snapshot() const {
  ProbeSnapshot s;
  s.phase = static_cast<ProbePhase>(phase_.load(std::memory_order_relaxed));
  s.waiting_seq = waiting_seq_.load(std::memory_order_acquire);
  s.seq = seq_.load(std::memory_order_acquire);
  if (s.waiting_seq != 0) {
    s.op = static_cast<ProbeOp>(waiting_op_.load(std::memory_order_relaxed));
    s.op_step = waiting_step_.load(std::memory_order_relaxed);
    s.op_bucket = waiting_bucket_.load(std::memory_order_relaxed);
    s.waiting = absl::Nanoseconds(
        std::max<int64_t>(0, NowNanos() - waiting_since_ns_.load(std::memory_order_relaxed)));
  } else {
    s.op = static_cast<ProbeOp>(last_op_.load(std::memory_order_relaxed));
    s.op_step = last_step_.load(std::memory_order_relaxed);
    s.op_bucket = last_bucket_.load(std::memory_order_relaxed);
  }
  std::vector<double> steps;
  double compute_sum = 0;
  {
    absl::MutexLock l(&mu_);
    steps = step_ms_;
    for (double c : compute_ms_) compute_sum += c;
  }
  if (!steps.empty()) {
    // Nearest-rank 99th percentile.
    const size_t k = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(steps.size()))) - 1;
    std::nth_element(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(k), steps.end());
    s.p99_step_ms = steps[k];
    s.compute_ms = compute_sum / static_cast<double>(steps.size());
  }
  return s;
}

namespace {

// Marks the wait on the probe for as long as Wait blocks.
class TrackedWork : public CollectiveWork {
 public:
  TrackedWork(std::shared_ptr<CollectiveWork> inner, std::shared_ptr<CollectiveProbe> probe,
              CollectiveProbe::Issued what)
      : inner_(std::move(inner)), probe_(std::move(probe)), what_(what) {}
  absl::Status Wait(absl::Duration timeout) override {
    if (inner_->IsCompleted()) return inner_->Wait(timeout);
    probe_->OnWaitBegin(what_);
    absl::Status s = inner_->Wait(timeout);
    probe_->OnWaitEnd(what_);
    return s;
  }
  absl::Status Wait() override {
    if (inner_->IsCompleted()) return inner_->Wait();
    probe_->OnWaitBegin(what_);
    absl::Status s = inner_->Wait();
    probe_->OnWaitEnd(what_);
    return s;
  }
  bool IsCompleted() override { return inner_->IsCompleted(); }
  std::optional<WorkTimes> times() override { return inner_->times(); }

 private:
  std::shared_ptr<CollectiveWork> inner_;
  std::shared_ptr<CollectiveProbe> probe_;
  CollectiveProbe::Issued what_;
};

}  // namespace

std::shared_ptr<CollectiveWork> TrackedCollectives::AllReduceSum(CommBuffer buffer) {
  const CollectiveProbe::Issued what = probe_->OnIssue(ProbeOp::kAllReduce);
  return std::make_shared<TrackedWork>(inner_->AllReduceSum(std::move(buffer)), probe_, what);
}

std::shared_ptr<CollectiveWork> TrackedCollectives::Broadcast(CommBuffer buffer, int root) {
  const CollectiveProbe::Issued what = probe_->OnIssue(ProbeOp::kBroadcast);
  return std::make_shared<TrackedWork>(inner_->Broadcast(std::move(buffer), root), probe_, what);
}

absl::Status TrackedCollectives::Barrier() {
  const CollectiveProbe::Issued what = probe_->OnIssue(ProbeOp::kBarrier);
  probe_->OnWaitBegin(what);
  absl::Status s = inner_->Barrier();
  probe_->OnWaitEnd(what);
  return s;
}

}  // namespace trainctl::dist

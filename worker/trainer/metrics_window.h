// MetricsWindow: sums over a run of optimizer steps, for the trainer's
// "train" metric (a window of metrics.every_steps steps) and its
// "epoch_end" metric (the whole epoch). The loss sum stays a device tensor
// until a report reads it, so adding costs no host sync per step.
//
// Threading: not thread-safe; the training thread owns its windows.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>

#include "worker/protocol/rank_protocol.h"

namespace trainctl::trainer {

class MetricsWindow {
 public:
  using Clock = std::chrono::steady_clock;

  MetricsWindow(c10::Device device, Clock::time_point start);

  // One micro-batch: its loss (a detached kDouble scalar on the window's
  // device) and how many samples it held.
  void AddMicroBatch(const at::Tensor& loss, int64_t samples);
  // One optimizer step that ran (a rolled-back skip is not one): its data
  // wait, exposed communication and total wall time, in ms.
  void AddStep(double data_ms, double comm_ms, double step_ms);

  int64_t steps() const { return steps_; }
  int64_t micro_batches() const { return micro_batches_; }
  // The window's loss sum (a kDouble scalar on the device).
  const at::Tensor& loss_sum() const { return loss_sum_; }
  // Mean loss per micro-batch (the sum when there were none, i.e. 0); reads
  // the device.
  double MeanLoss() const;
  // Samples per second since the window's start (0 before any time passed).
  double SamplesPerSec(Clock::time_point now) const;
  // Sets m's data_ms, comm_ms and compute_ms (the rest of the step time,
  // never below 0) to means over `steps` steps.
  void FillStepTimes(double steps, rankproto::RankMetric* m) const;

  // Empties the window; it starts again at `start`.
  void Reset(Clock::time_point start);

 private:
  at::Tensor loss_sum_;  // kDouble scalar on the device
  int64_t micro_batches_ = 0;
  int64_t steps_ = 0;
  int64_t samples_ = 0;
  double data_ms_ = 0;
  double comm_ms_ = 0;
  double step_ms_ = 0;
  Clock::time_point start_;
};

}  // namespace trainctl::trainer

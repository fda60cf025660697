// StepTimeline: where one rank's optimizer steps spend their time, written
// for study, not for metrics (issue #49; docs/ddp.md, "Where a step's time
// goes"). Opt-in: trainctl-rank reads TRAINCTL_COMM_TIMELINE=PREFIX once at
// start (TrainerSetup::comm_timeline_prefix); without it the Trainer holds no
// StepTimeline and the loop reads no clock for it.
//
// Per optimizer step it keeps the moments the training loop marks (step
// start, backward start and end of the synced micro-batch, the end of
// FinalizeBackward, the optimizer's start and end, the step's end) and the
// gradient bucketer's StepCommStats with its per-bucket timeline (ready,
// issued, ran on the engine's thread, waited for). Everything stays in memory
// (at most kMaxSteps steps) and is written once, at the end of the run, as
// PREFIX.rankN.jsonl: one JSON object per step, times in ms since the step's
// start (null for a moment that did not happen), plus the step start's
// steady-clock time in ns (t0_ns; CLOCK_MONOTONIC, so ranks on one host line
// up).
//
// Threading: not thread-safe; the training thread only (the bucketer's
// stats are copied in after FinalizeBackward returned).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/dist/gradient_bucketer.h"

namespace trainctl::trainer {

class StepTimeline {
 public:
  using Clock = std::chrono::steady_clock;
  // The variable trainctl-rank reads the prefix from.
  static constexpr char kEnv[] = "TRAINCTL_COMM_TIMELINE";
  // Steps kept; later steps are counted as dropped, not recorded.
  static constexpr size_t kMaxSteps = 100000;

  // The moments the training loop marks, in the order they happen.
  enum Event {
    kStart,           // the step began (before its first batch)
    kBackwardStart,   // backward() of the synced micro-batch was called
    kBackwardEnd,     // backward() returned (FinalizeBackward is entered next)
    kFinalizeEnd,     // FinalizeBackward returned: averaged grads in param.grad()
    kOptimizerStart,  // the gradient check, clipping, optimizer.step(), zero_grad...
    kOptimizerEnd,    // ...are done
    kEnd,             // the step's bookkeeping (metrics, checkpoints) is done
    kNumEvents,
  };
  static const char* EventName(Event e);

  struct Step {
    int64_t step = 0;  // global step, counted from 1
    int64_t micro_batches = 0;
    double data_ms = 0;
    std::array<Clock::time_point, kNumEvents> at{};
    // The bucketer's stats of the synced micro-batch (empty without one).
    dist::StepCommStats comm;
  };

  // `path`: where Write() puts the lines. `comm_name`: the engine
  // ("gloo+shm", "gloo", "nccl"; "none" without collectives).
  StepTimeline(std::string path, int rank, int world_size, std::string comm_name);

  // PREFIX.rankN.jsonl.
  static std::string PathFor(const std::string& prefix, int rank);

  // Sizes of the buckets (GradientBucketer::buckets()), written per bucket.
  void SetBuckets(const std::vector<dist::BucketInfo>& buckets);

  void BeginStep(int64_t global_step);
  void Mark(Event e) { current_.at[e] = Clock::now(); }
  void AddDataMs(double ms) { current_.data_ms += ms; }
  void CountMicroBatch() { ++current_.micro_batches; }
  void SetComm(dist::StepCommStats stats) { current_.comm = std::move(stats); }
  // Marks kEnd and keeps the step.
  void EndStep();

  size_t steps() const { return steps_.size(); }
  size_t dropped() const { return dropped_; }
  const std::string& path() const { return path_; }

  // The JSON line of one step, without its newline.
  std::string FormatStep(const Step& s) const;
  // Replaces path() with one line per kept step.
  absl::Status Write() const;

 private:
  const std::string path_;
  const int rank_;
  const int world_size_;
  const std::string comm_name_;
  std::vector<dist::BucketInfo> buckets_;
  Step current_;
  std::vector<Step> steps_;
  size_t dropped_ = 0;
};

}  // namespace trainctl::trainer

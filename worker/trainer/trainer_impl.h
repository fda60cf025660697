// Trainer::Impl: one rank's training-loop state, shared by the files that
// implement the Trainer (trainer.h is its public face):
//   trainer.cc       - failure kinds, Create, the epoch loop, checkpoints,
//                      the final export
//   trainer_init.cc  - Init: checks, sampler, optimizer, loss scaler, resume,
//                      gradient bucketer
//   trainer_step.cc  - one optimizer step: micro-batches, the gradient check,
//                      the update, the step's bookkeeping and reports
//   trainer_eval.cc  - the loss, the target checks, evaluation
// Internal to trainctl_trainer; include it from those files only.
//
// Threading: not thread-safe, as the Trainer: the training thread only.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/engine/data_loader.h"
#include "worker/engine/distributed_sampler.h"
#include "worker/trainer/loss_scaler.h"
#include "worker/trainer/metrics_window.h"
#include "worker/trainer/powersgd_checkpoint.h"
#include "worker/trainer/step_timeline.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/training_policy.h"

namespace trainctl::trainer {

using TrainerClock = std::chrono::steady_clock;

namespace trainer_internal {

double Ms(TrainerClock::duration d);
// The first line of an exception's text (c10 appends a backtrace).
std::string FirstLine(const std::string& s);
// Statuses the collectives return when a peer failed or the engine broke.
bool IsCommunicationError(const absl::Status& s);
// `s` (unless OK) as a kCollective failure, prefixed with what was running.
absl::Status Collective(absl::Status s, const std::string& what);
// A failed gradient all-reduce: kCollective when a peer failed, else as is.
absl::Status GradientAllReduceFailure(absl::Status s);
// InvalidArgument tagged kConfig.
absl::Status Config(const std::string& message);
std::string LossName(LossKind k);

}  // namespace trainer_internal

// One epoch in progress on this rank.
struct EpochRun {
  EpochRun(int64_t epoch_index, TrainerClock::time_point started, c10::Device device)
      : epoch(epoch_index), start(started), window(device, started), totals(device, started) {}

  int64_t epoch;
  TrainerClock::time_point start;
  std::unique_ptr<engine::DataLoader> loader;
  // The epoch's sample order on this rank; kept only for on_step_samples.
  std::vector<int64_t> order;
  int64_t rank_samples = 0;   // samples this rank takes this epoch
  int64_t consumed_base = 0;  // positions consumed before this attempt continued the epoch
  int64_t batches = 0;
  // A continued epoch counts its steps from where a full one would be.
  int64_t step_offset = 0;
  int64_t step_in_epoch = 0;
  double lr = 0;         // the last step's learning rate
  MetricsWindow window;  // since the last "train" metric
  MetricsWindow totals;  // the whole epoch, for "epoch_end"
};

// One optimizer step's measurements, in ms.
struct StepTimes {
  double data_ms = 0;  // waiting for batches and copying them to the device
  double comm_ms = 0;  // exposed gradient all-reduce time
};

struct Trainer::Impl {
  TrainerSetup setup;
  const TrainingOptions& opt() const { return setup.options; }
  std::shared_ptr<engine::Model> model;
  std::shared_ptr<const engine::Dataset> train;
  std::shared_ptr<const engine::Dataset> eval;
  std::shared_ptr<dist::Collectives> comm;
  TrainerCallbacks callbacks;

  std::vector<at::Tensor> params;  // requires_grad parameters, registration order
  std::unique_ptr<engine::DistributedSampler> sampler;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  LossScaler scaler;
  std::unique_ptr<dist::GradientBucketer> ddp;  // null without collectives
  // Null unless setup.comm_timeline_prefix is set.
  std::unique_ptr<StepTimeline> timeline;

  int64_t batches_per_epoch = 0;
  int64_t steps_per_epoch = 0;
  TrainingPosition position;  // epochs_done = first epoch to run

  // Numerical health: fp16 steps skipped in a row; the step a kNan failure
  // happened at (-1 = none).
  int64_t skipped_in_a_row = 0;
  int64_t nan_step = -1;
  // Preemption (TrainerSetup::preempt_file): whether this rank found the
  // file after its stop flag rose; the global step of the last checkpoint
  // point (-1 = none), so a preemption stop writes none twice. Set on every
  // rank, writer or not, so that every rank takes the same checkpoint
  // decisions (PowerSGD's state is gathered by all of them).
  bool preempt_seen = false;
  int64_t checkpoint_step = -1;
  // comm_hook powersgd: what the resume checkpoint held for this rank, read
  // in Resume and handed to the bucketer in CreateBucketer (then dropped).
  PowerSgdCheckpointRead resumed_powersgd;
  // health.divergence: the detector (made in Init) and, until its baseline
  // is set at the first check, the attempt's first micro-batch loss.
  DivergenceDetector divergence{0};
  at::Tensor first_loss;

  // Metrics state.
  int64_t samples_seen = 0;
  TrainerClock::time_point last_progress{};
  int32_t progress_epoch = 0;  // the epoch of the last Progress call

  // trainer_init.cc
  absl::Status Init();
  absl::Status CheckSetup() const;
  absl::Status BuildSampler();
  void BuildOptimizer();
  absl::Status Resume();
  absl::StatusOr<std::string> ResumeBytes();
  absl::Status CreateBucketer();

  // trainer_eval.cc
  absl::StatusOr<at::Tensor> Loss(const at::Tensor& output, const at::Tensor& target) const;
  absl::Status CheckTargets() const;
  // {loss sum, correct, samples} over the whole eval set (all ranks).
  absl::StatusOr<std::array<double, 3>> Evaluate();

  // trainer.cc: the epoch loop.
  absl::StatusOr<std::unique_ptr<EpochRun>> BeginEpoch(int64_t epoch);
  absl::Status RunEpoch(int64_t epoch, TrainResult* result);
  absl::Status EndEpoch(EpochRun& run, TrainResult* result);
  absl::Status EvaluateInto(rankproto::RankMetric* end, TrainResult* result);
  // At a checkpoint point, on every rank (the points are the same steps
  // everywhere): under PowerSGD every rank first takes part in gathering
  // its state (GatherPowerSgdState); then this host's writer writes.
  absl::Status CheckpointNow();
  // nullopt when no rank writes (one small all-reduce says whether any does).
  absl::StatusOr<std::optional<dist::PowerSgdState>> GatherPowerSgdState();
  absl::Status WriteCheckpointNow(const dist::PowerSgdState* powersgd);
  // After a resume under PowerSGD: hands the checkpoint's state to the
  // bucketer and logs one line saying what was restored, or why not.
  void RestorePowerSgdState();
  // "crc32:xxxxxxxx" of the parameters' bytes in registration order: the
  // same on every rank while the replicas are bit-identical (logged at each
  // epoch's end, so that a divergence shows in the ranks' logs).
  std::string ParameterChecksum() const;
  absl::Status ExportFinalModel(TrainResult* result);
  // Writes the comm timeline, if any, and logs where (or why not).
  void WriteTimeline();
  bool writes_checkpoints() const {
    return setup.checkpoint_writer && !opt().checkpoint.dir.empty();
  }
  absl::Status StoppedError(const std::string& where) const;
  // Preemption: whether the stop flag is raised and the preemption file
  // exists (looked for once the flag rises).
  bool PreemptionSeen();
  // At an agreement point: whether any rank saw a preemption (an all-reduce
  // when there are collectives).
  absl::StatusOr<bool> PreemptionAgreed();
  // The agreed stop: a checkpoint (writers, unless one was just written at
  // this step), then kStopped.
  absl::Status StopForPreemption(const std::string& where);
  // A raised stop flag that waits for the preemption agreement instead of
  // stopping now.
  bool StopWaitsForAgreement() { return comm != nullptr && PreemptionSeen(); }

  // trainer_step.cc: one optimizer step over micro-batches [first, first + group).
  absl::Status RunStep(EpochRun& run, int64_t first, int64_t group);
  absl::Status SkipRolledBackStep(EpochRun& run, int64_t group);
  absl::StatusOr<StepTimes> ForwardBackward(EpochRun& run, int64_t group);
  absl::Status MicroBatch(EpochRun& run, int64_t i, int64_t group, bool inject_nan,
                          StepTimes* times);
  absl::Status ApplyGradients(EpochRun& run);
  // A kNan failure at the current global step (recorded as nan_step).
  absl::Status NanFailure(const std::string& message);
  // At a "train" metric: the window's loss over every rank against
  // health.divergence (a kNan failure at the window's last step when it ran
  // away). Every rank calls it at the same steps (one small all-reduce).
  absl::Status CheckDivergence(EpochRun& run);
  absl::Status AfterStep(EpochRun& run, int64_t first, int64_t group);
  void ReportWindow(EpochRun& run);
  // A metric of `kind` with the fields every metric carries; the loss is
  // `window`'s mean.
  rankproto::RankMetric NewMetric(const EpochRun& run, const char* kind,
                                  const MetricsWindow& window) const;

  void SetLearningRate(double lr);
  void Log(const std::string& line) const {
    if (callbacks.on_log) callbacks.on_log(line);
  }
  void Progress(int32_t epoch, bool force) {
    const auto now = TrainerClock::now();
    progress_epoch = epoch;
    if (!force && now - last_progress < std::chrono::seconds(1)) return;
    last_progress = now;
    if (callbacks.on_progress) callbacks.on_progress(epoch, position.global_step);
  }
  void SetPhase(dist::ProbePhase p) {
    if (setup.probe != nullptr) setup.probe->SetPhase(p);
  }
  // Sets the phase and reports it at once, from this thread (a heartbeat on
  // the status pipe), before any work of the phase: a rank stopped right
  // after entering eval or a checkpoint is named in it, however late the
  // heartbeat thread would have run.
  void EnterPhase(dist::ProbePhase p) {
    SetPhase(p);
    Progress(progress_epoch, /*force=*/true);
  }
  bool StopRequested() const {
    return setup.stop != nullptr && setup.stop->load(std::memory_order_relaxed);
  }
  c10::ScalarType AmpDtype() const {
    return opt().amp.dtype == AmpDtype::kFloat16 ? at::kHalf : at::kBFloat16;
  }
  bool pin_memory() const { return opt().data.pin_memory && setup.device.is_cuda(); }
};

}  // namespace trainctl::trainer

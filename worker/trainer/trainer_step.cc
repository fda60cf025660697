// One optimizer step of the training loop: the micro-batches' forward and
// backward passes (gradients all-reduced in buckets from autograd hooks),
// the NaN/Inf check, the update, the loss-scale health check, and the
// step's bookkeeping: metric windows, the sampler position a checkpoint
// records, step checkpoints, progress and the stop flag.
// Threading: the training thread.
#include <sys/resource.h>
#include <torch/torch.h>
// clip_grad.h needs torch.h's declarations first.
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/torch_compat.h"
#include "worker/trainer/autocast.h"
#include "worker/trainer/lr_schedule.h"
#include "worker/trainer/trainer_impl.h"
#include "worker/trainer/training_policy.h"

namespace trainctl::trainer {
namespace {

using trainer_internal::Collective;
using trainer_internal::Config;
using trainer_internal::GradientAllReduceFailure;
using trainer_internal::Ms;

// Whether the gradients of the last two parameters with one (the output
// layer's weight and bias in registration order) are finite: one reduction
// each, no mask of the gradients' size.
bool OutputGradientsFinite(const std::vector<at::Tensor>& grads) {
  double sum = 0;
  int checked = 0;
  for (auto it = grads.rbegin(); it != grads.rend() && checked < 2; ++it) {
    if (!it->defined()) continue;
    sum += it->sum().item<double>();  // NaN and Inf propagate through a sum
    ++checked;
  }
  return std::isfinite(sum);
}

int64_t PeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

absl::Status Trainer::Impl::RunStep(EpochRun& run, int64_t first, int64_t group) {
  if (IsRolledBackStep(setup.skip_steps, position.global_step))
    return SkipRolledBackStep(run, group);
  const auto step_start = TrainerClock::now();
  if (timeline != nullptr) timeline->BeginStep(position.global_step + 1);
  if (setup.probe != nullptr) {
    setup.probe->BeginStep(position.global_step + 1);
    setup.probe->SetPhase(dist::ProbePhase::kTrain);
  }
  TRAINCTL_ASSIGN_OR_RETURN(StepTimes times, ForwardBackward(run, group));
  TRAINCTL_RETURN_IF_ERROR(ApplyGradients(run));
  ++position.global_step;
  ++run.step_in_epoch;
  if (setup.debug_step_sleep_ms > 0) {
    // Test hook: inside the step, so it counts as compute time.
    std::this_thread::sleep_for(std::chrono::milliseconds(setup.debug_step_sleep_ms));
  }
  const double step_ms = Ms(TrainerClock::now() - step_start);
  if (setup.probe != nullptr) {
    setup.probe->EndStep(step_ms, std::max(0.0, step_ms - times.data_ms - times.comm_ms));
  }
  run.window.AddStep(times.data_ms, times.comm_ms, step_ms);
  run.totals.AddStep(times.data_ms, times.comm_ms, step_ms);
  absl::Status after = AfterStep(run, first, group);
  if (timeline != nullptr) timeline->EndStep();
  return after;
}

// A rollback passes over the step an earlier attempt failed at: its batches
// are consumed (the sampler order stays the same) and nothing else happens,
// on every rank alike.
absl::Status Trainer::Impl::SkipRolledBackStep(EpochRun& run, int64_t group) {
  for (int64_t i = 0; i < group; ++i) {
    TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, run.loader->Next());
    if (!batch.has_value()) return absl::InternalError("data loader ended before its batch count");
  }
  Log(absl::StrCat("skipping step ", position.global_step, " (epoch ", run.epoch,
                   "): rolled back after a NaN there"));
  ++position.skipped_steps;
  ++position.global_step;
  ++run.step_in_epoch;
  return absl::OkStatus();
}

absl::StatusOr<StepTimes> Trainer::Impl::ForwardBackward(EpochRun& run, int64_t group) {
  const bool inject_nan = InjectsNanAt(opt().health, setup.rank, position.global_step);
  StepTimes times;
  for (int64_t i = 0; i < group; ++i) {
    TRAINCTL_RETURN_IF_ERROR(MicroBatch(run, i, group, inject_nan && i == 0, &times));
  }
  return times;
}

// Micro-batch `i` of `group`: every one but the group's last runs under
// NoSync(); the last one's backward launches the all-reduce.
absl::Status Trainer::Impl::MicroBatch(EpochRun& run, int64_t i, int64_t group, bool inject_nan,
                                       StepTimes* times) {
  const auto t0 = TrainerClock::now();
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, run.loader->Next());
  if (!batch.has_value()) return absl::InternalError("data loader ended before its batch count");
  at::Tensor x = batch->input.to(setup.device, pin_memory());
  at::Tensor y = batch->target.to(setup.device, pin_memory());
  const double data_ms = Ms(TrainerClock::now() - t0);
  times->data_ms += data_ms;
  if (timeline != nullptr) {
    timeline->AddDataMs(data_ms);
    timeline->CountMicroBatch();
  }

  const bool sync = i == group - 1;
  std::optional<dist::GradientBucketer::NoSyncGuard> no_sync;
  if (ddp != nullptr && !sync) no_sync.emplace(ddp.get());
  if (ddp != nullptr)
    TRAINCTL_RETURN_IF_ERROR(Collective(ddp->PrepareForward(), "broadcasting buffers"));
  absl::StatusOr<at::Tensor> out;
  {
    AutocastGuard autocast(opt().amp.enabled, setup.device.type(), AmpDtype());
    out = model->Forward(x);
  }
  if (!out.ok())
    return Config(absl::StrCat("model does not fit data.train: ", out.status().message()));
  TRAINCTL_ASSIGN_OR_RETURN(at::Tensor loss, Loss(*out, y));
  if (inject_nan) {
    Log(absl::StrCat("health.debug_nan_at_step: a NaN loss at step ", position.global_step));
    loss = loss * std::numeric_limits<double>::quiet_NaN();
  }
  if (ddp != nullptr && sync && opt().ddp.find_unused_parameters) {
    // Lets buckets of parameters this forward did not use launch early.
    TRAINCTL_RETURN_IF_ERROR(GradientAllReduceFailure(ddp->PrepareForBackward({loss})));
  }
  // The timeline marks the synced micro-batch's backward: the one that
  // communicates.
  StepTimeline* const tl = sync ? timeline.get() : nullptr;
  if (tl != nullptr) tl->Mark(StepTimeline::kBackwardStart);
  try {
    (scaler.Scale(loss) / static_cast<double>(group)).backward();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("backward failed: ", trainer_internal::FirstLine(e.what())));
  }
  if (tl != nullptr) tl->Mark(StepTimeline::kBackwardEnd);
  if (ddp != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(GradientAllReduceFailure(ddp->FinalizeBackward()));
    if (sync) {
      dist::StepCommStats stats = ddp->last_step_stats();
      times->comm_ms += absl::ToDoubleMilliseconds(stats.exposed_comm);
      if (tl != nullptr) tl->SetComm(std::move(stats));
    }
  }
  if (tl != nullptr) tl->Mark(StepTimeline::kFinalizeEnd);
  at::Tensor detached = loss.detach().to(at::kDouble);
  if (divergence.enabled() && !divergence.has_baseline() && !first_loss.defined())
    first_loss = detached;
  run.totals.AddMicroBatch(detached, x.size(0));
  run.window.AddMicroBatch(detached, x.size(0));
  samples_seen += x.size(0);
  return absl::OkStatus();
}

// Checks the all-reduced gradients, then updates (or, for fp16 loss
// scaling, skips the update on inf/NaN) and zeroes them.
absl::Status Trainer::Impl::ApplyGradients(EpochRun& run) {
  if (timeline != nullptr) timeline->Mark(StepTimeline::kOptimizerStart);
  const TrainingOptions& o = opt();
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) grads.push_back(p.grad());
  // The gradients are all-reduced: every rank sees the same NaN/Inf.
  // fp16 loss scaling checks every gradient (PyTorch's GradScaler).
  // Without it, a non-finite loss on any rank makes the all-reduced
  // gradients non-finite everywhere, the output layer's among them, so
  // checking those (the last parameters) costs next to nothing per step,
  // where a pass over every gradient costs a large share of a small
  // model's CPU step.
  const bool found_inf = scaler.enabled() ? scaler.Unscale(grads) : !OutputGradientsFinite(grads);
  if (found_inf && !scaler.enabled()) {
    return NanFailure(absl::StrCat("NaN/Inf gradients at step ", position.global_step, " (epoch ",
                                   run.epoch,
                                   "): the loss or a gradient was not finite on a rank"));
  }
  run.lr = LearningRateAt(o.lr_schedule, o.optimizer.lr, position.global_step,
                          steps_per_epoch * o.epochs);
  if (found_inf) {
    ++position.skipped_steps;
  } else {
    if (o.max_grad_norm > 0) {
      // The total norm comes free with clipping: a non-finite one is a NaN
      // anywhere in the gradients, not only in the output layer's.
      const double norm = torch::nn::utils::clip_grad_norm_(params, o.max_grad_norm);
      if (!std::isfinite(norm)) {
        return NanFailure(absl::StrCat("the gradient norm is ", norm, " at step ",
                                       position.global_step, " (epoch ", run.epoch, ")"));
      }
    }
    SetLearningRate(run.lr);
    optimizer->step();
  }
  scaler.Update(found_inf);
  if (scaler.enabled()) {
    skipped_in_a_row = found_inf ? skipped_in_a_row + 1 : 0;
    const std::string collapse = LossScaleCollapse(o.health, skipped_in_a_row, scaler.scale());
    if (!collapse.empty()) {
      return NanFailure(absl::StrCat("AMP loss scale collapsed at step ", position.global_step,
                                     " (epoch ", run.epoch, "): ", collapse));
    }
  }
  if (ddp != nullptr && o.ddp.gradient_as_bucket_view) {
    // The gradients are slices of the buckets: zeroed there, they stay
    // (LibTorch 2.x's zero_grad() would drop them).
    torch_compat::ZeroGradInPlace(*optimizer);
  } else {
    optimizer->zero_grad();
  }
  if (timeline != nullptr) timeline->Mark(StepTimeline::kOptimizerEnd);
  return absl::OkStatus();
}

absl::Status Trainer::Impl::NanFailure(const std::string& message) {
  nan_step = position.global_step;
  return WithFailureKind(absl::DataLossError(message), FailureKind::kNan);
}

absl::Status Trainer::Impl::CheckDivergence(EpochRun& run) {
  if (!divergence.enabled() || run.window.micro_batches() == 0) return absl::OkStatus();
  const auto dopts = at::TensorOptions().dtype(at::kDouble).device(setup.device);
  const bool first = !divergence.has_baseline();
  std::vector<at::Tensor> parts = {
      run.window.loss_sum(), at::full({}, static_cast<double>(run.window.micro_batches()), dopts)};
  if (first) {
    parts.push_back(first_loss.defined() ? first_loss.to(dopts) : at::zeros({}, dopts));
    parts.push_back(at::full({}, first_loss.defined() ? 1.0 : 0.0, dopts));
  }
  at::Tensor sums = at::stack(parts);
  if (comm != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(Collective(dist::AllReduceSum(*comm, sums)->Wait(),
                                        "all-reducing the loss for health.divergence"));
  }
  at::Tensor cpu = sums.cpu();
  if (first) {
    if (cpu[3].item<double>() > 0)
      divergence.SetBaseline(cpu[2].item<double>() / cpu[3].item<double>());
    first_loss = at::Tensor();
  }
  const std::string why = divergence.AddWindow(cpu[0].item<double>() / cpu[1].item<double>());
  if (why.empty()) return absl::OkStatus();
  absl::Status failed = NanFailure(absl::StrCat("loss diverged at step ", position.global_step - 1,
                                                " (epoch ", run.epoch, "): ", why));
  nan_step = position.global_step - 1;  // the window's last step, which already ran
  return failed;
}

void Trainer::Impl::SetLearningRate(double lr) {
  for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
}

// After a step that ran: the step-samples hook, the position a checkpoint
// would record, the "train" metric, a step checkpoint, progress, the stop
// flag.
absl::Status Trainer::Impl::AfterStep(EpochRun& run, int64_t first, int64_t group) {
  const TrainingOptions& o = opt();
  const bool epoch_done = first + group >= run.batches;
  if (callbacks.on_step_samples) {
    const size_t from = static_cast<size_t>(first * o.data.batch_size);
    const size_t to =
        std::min(run.order.size(), static_cast<size_t>((first + group) * o.data.batch_size));
    callbacks.on_step_samples(
        run.epoch, position.global_step,
        std::vector<int64_t>(run.order.begin() + static_cast<std::ptrdiff_t>(from),
                             run.order.begin() + static_cast<std::ptrdiff_t>(to)));
  }
  position.epoch_consumed =
      EpochConsumed(run.consumed_base, first + group, o.data.batch_size, run.rank_samples,
                    std::max<int64_t>(1, setup.world_size), epoch_done);
  if (MetricsDue(run.step_in_epoch, o.metrics_every_steps, epoch_done)) {
    TRAINCTL_RETURN_IF_ERROR(CheckDivergence(run));
    ReportWindow(run);
  }
  if (CheckpointDueAfterStep(o.checkpoint, position.global_step, epoch_done)) {
    TRAINCTL_RETURN_IF_ERROR(CheckpointNow());
  }
  Progress(static_cast<int32_t>(run.epoch), /*force=*/false);
  // Preemption agreement points: the same steps on every rank (an epoch's
  // last step agrees at the epoch's end instead, after its checkpoint).
  if (!setup.preempt_file.empty() && !epoch_done &&
      (comm == nullptr || position.global_step % kPreemptAgreeEverySteps == 0)) {
    TRAINCTL_ASSIGN_OR_RETURN(bool preempted, PreemptionAgreed());
    if (preempted) return StopForPreemption(absl::StrCat("at epoch ", run.epoch));
  }
  if (StopRequested() && !StopWaitsForAgreement()) {
    return StoppedError(
        absl::StrCat("at epoch ", run.epoch, ", global step ", position.global_step));
  }
  return absl::OkStatus();
}

// The "train" metric over the window since the last one; starts a new window.
void Trainer::Impl::ReportWindow(EpochRun& run) {
  const auto now = TrainerClock::now();
  const double samples_per_sec = run.window.SamplesPerSec(now);
  rankproto::RankMetric metric = NewMetric(run, "train", run.window);
  metric.samples_per_sec = samples_per_sec;
  run.window.FillStepTimes(static_cast<double>(run.window.steps()), &metric);
  if (callbacks.on_metric) callbacks.on_metric(metric);
  run.window.Reset(TrainerClock::now());
}

rankproto::RankMetric Trainer::Impl::NewMetric(const EpochRun& run, const char* kind,
                                               const MetricsWindow& window) const {
  rankproto::RankMetric metric;
  metric.kind = kind;
  metric.epoch = static_cast<int32_t>(run.epoch);
  metric.step = run.step_in_epoch;
  metric.steps_per_epoch = steps_per_epoch;
  metric.loss = window.MeanLoss();
  metric.lr = run.lr;
  metric.loss_scale = scaler.enabled() ? scaler.scale() : 0;
  metric.skipped_steps = position.skipped_steps;
  metric.peak_memory_bytes = PeakRssBytes();
  metric.samples_seen = samples_seen;
  return metric;
}

}  // namespace trainctl::trainer

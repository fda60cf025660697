// The Trainer's public face (trainer.h): failure kinds, Create, and Run's
// epoch loop: each epoch's loader, its steps (trainer_step.cc), its end
// (metric, evaluation, checkpoint, log), and the final export and barrier.
// Threading: the training thread (see trainer.h).
#include "worker/trainer/trainer.h"

#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/jobspec/artifact_names.h"
#include "common/status_macros.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/test_hooks.h"
#include "worker/trainer/trainer_impl.h"
#include "worker/trainer/training_policy.h"

namespace trainctl::trainer {
namespace {

constexpr char kFailurePayload[] = "trainctl.dev/trainer-failure";

}  // namespace

namespace trainer_internal {

double Ms(TrainerClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

bool IsCommunicationError(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s) || absl::IsAborted(s);
}

absl::Status Collective(absl::Status s, const std::string& what) {
  if (s.ok()) return s;
  return WithFailureKind(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())),
                         FailureKind::kCollective);
}

absl::Status GradientAllReduceFailure(absl::Status s) {
  if (s.ok() || !IsCommunicationError(s)) return s;
  return Collective(std::move(s), "gradient all-reduce");
}

absl::Status Config(const std::string& message) {
  return WithFailureKind(absl::InvalidArgumentError(message), FailureKind::kConfig);
}

std::string LossName(LossKind k) { return k == LossKind::kCrossEntropy ? "cross_entropy" : "mse"; }

}  // namespace trainer_internal

using trainer_internal::Collective;

FailureKind FailureKindOf(const absl::Status& status) {
  auto payload = status.GetPayload(kFailurePayload);
  if (!payload.has_value()) return FailureKind::kOther;
  const std::string v(*payload);
  if (v == "config") return FailureKind::kConfig;
  if (v == "collective") return FailureKind::kCollective;
  if (v == "stopped") return FailureKind::kStopped;
  if (v == "disk_full") return FailureKind::kDiskFull;
  if (v == "nan") return FailureKind::kNan;
  if (v == "resume") return FailureKind::kResume;
  return FailureKind::kOther;
}

absl::Status WithFailureKind(absl::Status status, FailureKind kind) {
  if (status.ok()) return status;
  const char* name = kind == FailureKind::kConfig       ? "config"
                     : kind == FailureKind::kCollective ? "collective"
                     : kind == FailureKind::kStopped    ? "stopped"
                     : kind == FailureKind::kDiskFull   ? "disk_full"
                     : kind == FailureKind::kNan        ? "nan"
                     : kind == FailureKind::kResume     ? "resume"
                                                        : "other";
  status.SetPayload(kFailurePayload, absl::Cord(name));
  return status;
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

int64_t Trainer::steps_per_epoch() const { return impl_->steps_per_epoch; }
int64_t Trainer::total_steps() const { return impl_->steps_per_epoch * impl_->opt().epochs; }
int64_t Trainer::start_epoch() const { return impl_->position.epochs_done; }
int64_t Trainer::nan_step() const { return impl_->nan_step; }

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    TrainerSetup setup, std::shared_ptr<engine::Model> model,
    std::shared_ptr<const engine::Dataset> train, std::shared_ptr<const engine::Dataset> eval,
    std::shared_ptr<dist::Collectives> comm, TrainerCallbacks callbacks) {
  if (model == nullptr || train == nullptr)
    return absl::InvalidArgumentError("Trainer: no model or no train set");
  auto impl = std::make_unique<Impl>();
  impl->setup = std::move(setup);
  impl->model = std::move(model);
  impl->train = std::move(train);
  impl->eval = std::move(eval);
  impl->comm = std::move(comm);
  impl->callbacks = std::move(callbacks);
  TRAINCTL_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

absl::StatusOr<TrainResult> Trainer::Run() {
  Impl& m = *impl_;
  // The timeline is written however the run ends: a failed run's steps are
  // the ones worth reading.
  absl::Cleanup write_timeline = [&m] { m.WriteTimeline(); };
  TrainResult result;
  result.start_epoch = m.position.epochs_done;
  for (int64_t epoch = m.position.epochs_done; epoch < m.opt().epochs; ++epoch) {
    TRAINCTL_RETURN_IF_ERROR(m.RunEpoch(epoch, &result));
  }
  result.epochs_done = m.position.epochs_done;
  result.global_step = m.position.global_step;
  result.skipped_steps = m.position.skipped_steps;
  TRAINCTL_RETURN_IF_ERROR(m.ExportFinalModel(&result));
  if (m.comm != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(Collective(m.comm->Barrier(), "final barrier"));
  }
  return result;
}

absl::Status Trainer::Impl::RunEpoch(int64_t epoch, TrainResult* result) {
  TRAINCTL_ASSIGN_OR_RETURN(std::unique_ptr<EpochRun> run, BeginEpoch(epoch));
  if (epoch > result->start_epoch)
    TestPhaseSleep("epoch_start", [this](const std::string& l) { Log(l); });
  const int64_t accumulation = opt().grad_accumulation;
  for (int64_t first = 0; first < run->batches; first += accumulation) {
    TRAINCTL_RETURN_IF_ERROR(
        RunStep(*run, first, std::min<int64_t>(accumulation, run->batches - first)));
  }
  run->loader.reset();
  return EndEpoch(*run, result);
}

// Sets the sampler's epoch and opens a loader over this rank's indices; a
// checkpoint taken inside this epoch continues where it stopped, the rest
// of the epoch's order split over this attempt's ranks.
absl::StatusOr<std::unique_ptr<EpochRun>> Trainer::Impl::BeginEpoch(int64_t epoch) {
  const TrainingOptions& o = opt();
  auto run = std::make_unique<EpochRun>(epoch, TrainerClock::now(), setup.device);
  sampler->set_epoch(epoch);
  run->consumed_base = position.epoch_consumed;
  std::vector<int64_t> indices =
      run->consumed_base > 0 ? sampler->RemainingIndices(run->consumed_base) : sampler->Indices();
  if (run->consumed_base > 0) {
    Log(absl::StrCat("continuing epoch ", epoch + 1, " after ", run->consumed_base, " of its ",
                     sampler->options().dataset_size, " samples, at world size ",
                     std::max<int64_t>(1, setup.world_size), " (", indices.size(),
                     " samples left on this rank)"));
  }
  engine::DataLoaderOptions lo;
  lo.batch_size = o.data.batch_size;
  lo.drop_last = o.data.drop_last;
  lo.num_workers = o.data.num_workers;
  lo.pin_memory = pin_memory();
  if (callbacks.on_step_samples) run->order = indices;
  run->rank_samples = static_cast<int64_t>(indices.size());
  TRAINCTL_ASSIGN_OR_RETURN(run->loader, engine::DataLoader::Create(train, std::move(indices), lo));
  run->batches = run->loader->num_batches();
  const int64_t epoch_steps = (run->batches + o.grad_accumulation - 1) / o.grad_accumulation;
  run->step_offset = std::max<int64_t>(0, steps_per_epoch - epoch_steps);
  run->step_in_epoch = run->step_offset;
  model->SetTraining(true);
  SetPhase(dist::ProbePhase::kInit);  // until its first step: loader start-up
  Progress(static_cast<int32_t>(epoch), /*force=*/true);
  run->window.Reset(TrainerClock::now());
  return run;
}

// After an epoch's last step: the "epoch_end" metric with the evaluation,
// the epoch's checkpoint, the log line, the stop flag.
absl::Status Trainer::Impl::EndEpoch(EpochRun& run, TrainResult* result) {
  const TrainingOptions& o = opt();
  rankproto::RankMetric end = NewMetric(run, "epoch_end", run.totals);
  const auto now = TrainerClock::now();
  const double epoch_secs = std::chrono::duration<double>(now - run.start).count();
  end.samples_per_sec = run.totals.SamplesPerSec(now);
  if (run.step_in_epoch > run.step_offset) {
    run.totals.FillStepTimes(static_cast<double>(run.step_in_epoch - run.step_offset), &end);
  }
  result->last_epoch_loss = end.loss;
  if (eval != nullptr) TRAINCTL_RETURN_IF_ERROR(EvaluateInto(&end, result));

  position.epochs_done = run.epoch + 1;
  position.epoch_consumed = 0;
  // The epoch's end, then its checkpoint: in that order on the job's
  // timeline (`--follow` shows epoch_end N before the checkpoint after it).
  if (callbacks.on_metric) callbacks.on_metric(end);
  if (CheckpointDueAfterEpoch(o.checkpoint, run.epoch, o.epochs)) {
    TRAINCTL_RETURN_IF_ERROR(CheckpointNow());
  }
  Progress(static_cast<int32_t>(run.epoch), /*force=*/true);
  std::string line =
      absl::StrFormat("epoch %d/%d: loss %.5f, lr %.3g, %d steps, %.1f s", run.epoch + 1, o.epochs,
                      end.loss, run.lr, run.step_in_epoch, epoch_secs);
  if (end.has_eval) {
    absl::StrAppendFormat(&line, ", eval loss %.5f, accuracy %.2f%% (%d samples)", end.eval_loss,
                          end.eval_accuracy * 100, end.eval_samples);
  }
  Log(line);
  Log(absl::StrCat("parameters ", ParameterChecksum(), " at global step ", position.global_step));
  if (!setup.preempt_file.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(bool preempted, PreemptionAgreed());
    if (preempted) return StopForPreemption(absl::StrCat("after epoch ", run.epoch));
  }
  if (StopRequested() && !StopWaitsForAgreement())
    return StoppedError(absl::StrCat("after epoch ", run.epoch));
  return absl::OkStatus();
}

absl::Status Trainer::Impl::EvaluateInto(rankproto::RankMetric* end, TrainResult* result) {
  EnterPhase(dist::ProbePhase::kEval);
  TestPhaseSleep("eval", [this](const std::string& l) { Log(l); });
  TRAINCTL_ASSIGN_OR_RETURN(auto sums, Evaluate());
  end->has_eval = true;
  end->eval_samples = static_cast<int64_t>(sums[2]);
  end->eval_loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  end->eval_accuracy = opt().loss == LossKind::kCrossEntropy && sums[2] > 0 ? sums[1] / sums[2] : 0;
  result->has_eval = true;
  result->eval_loss = end->eval_loss;
  result->eval_accuracy = end->eval_accuracy;
  return absl::OkStatus();
}

std::string Trainer::Impl::ParameterChecksum() const {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (const at::Tensor& p : model->Parameters()) {
    const at::Tensor c = p.detach().to(at::kCPU).contiguous();
    crc = crc32_z(crc, static_cast<const Bytef*>(c.data_ptr()), c.nbytes());
  }
  return absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc));
}

absl::Status Trainer::Impl::CheckpointNow() {
  std::optional<dist::PowerSgdState> powersgd;
  if (ddp != nullptr && opt().ddp.comm_hook == dist::CommHook::kPowerSgd) {
    TRAINCTL_ASSIGN_OR_RETURN(powersgd, GatherPowerSgdState());
  }
  checkpoint_step = position.global_step;
  if (!writes_checkpoints()) return absl::OkStatus();
  return WriteCheckpointNow(powersgd.has_value() ? &*powersgd : nullptr);
}

absl::StatusOr<std::optional<dist::PowerSgdState>> Trainer::Impl::GatherPowerSgdState() {
  EnterPhase(dist::ProbePhase::kCheckpoint);
  // Whether a checkpoint dir is set is a per-host setting: agree first.
  at::Tensor writers = at::full({1}, writes_checkpoints() ? 1.0F : 0.0F,
                                at::TensorOptions().dtype(at::kFloat).device(setup.device));
  TRAINCTL_RETURN_IF_ERROR(
      Collective(dist::AllReduceSum(*comm, writers)->Wait(), "agreeing on a checkpoint"));
  if (writers.cpu().item<float>() == 0) return std::optional<dist::PowerSgdState>();
  auto state = ddp->SavePowerSgdState(/*keep_errors=*/writes_checkpoints());
  if (!state.ok()) {
    return trainer_internal::IsCommunicationError(state.status())
               ? Collective(state.status(), "gathering PowerSGD's state for a checkpoint")
               : state.status();
  }
  return std::optional<dist::PowerSgdState>(*std::move(state));
}

// Writes a checkpoint at `position` (the host's writer rank only).
absl::Status Trainer::Impl::WriteCheckpointNow(const dist::PowerSgdState* powersgd) {
  const CheckpointOptions& c = opt().checkpoint;
  EnterPhase(dist::ProbePhase::kCheckpoint);
  TestPhaseSleep("checkpoint", [this](const std::string& l) { Log(l); });
  position.loss_scale = scaler.scale();
  position.scaler_growth_tracker = scaler.growth_tracker();
  auto written = WriteCheckpoint(c.dir, c.prune ? c.keep : 0, setup.manifest, position, *model,
                                 *optimizer, setup.file_env, powersgd);
  if (!written.ok()) {
    const absl::Status& ws = written.status();
    if (absl::IsResourceExhausted(ws)) return WithFailureKind(ws, FailureKind::kDiskFull);
    if (absl::IsFailedPrecondition(ws)) return WithFailureKind(ws, FailureKind::kConfig);
    return ws;
  }
  for (const std::string& left : written->not_pruned) {
    Log(absl::StrCat("warning: an old checkpoint past checkpoint.keep could not be deleted: ",
                     left));
  }
  if (callbacks.on_checkpoint) callbacks.on_checkpoint(*written, position);
  return absl::OkStatus();
}

// Checkpoint writers export <checkpoint dir>/<job id>.model.pt (TorchScript;
// named for the job, as its checkpoints are, so that jobs sharing a
// directory keep their own; model.pt for a rank started by hand, with no
// job id).
absl::Status Trainer::Impl::ExportFinalModel(TrainResult* result) {
  if (!writes_checkpoints()) return absl::OkStatus();
  EnterPhase(dist::ProbePhase::kCheckpoint);
  const std::string& job = setup.manifest.job_id;
  const std::string path = absl::StrCat(
      opt().checkpoint.dir, "/", job.empty() ? std::string("model.pt") : FinalModelFileName(job));
  TRAINCTL_RETURN_IF_ERROR(model->ExportTorchScript(path));
  TRAINCTL_RETURN_IF_ERROR(SyncFileAndDir(path));
  result->exported_model = path;
  Log(absl::StrCat("exported the final model to ", path));
  return absl::OkStatus();
}

bool Trainer::Impl::PreemptionSeen() {
  if (!preempt_seen && !setup.preempt_file.empty() && StopRequested()) {
    preempt_seen = ::access(setup.preempt_file.c_str(), F_OK) == 0;
    if (preempt_seen) Log("preempted: stopping at the next agreed step, after a checkpoint");
  }
  return preempt_seen;
}

absl::StatusOr<bool> Trainer::Impl::PreemptionAgreed() {
  const bool seen = PreemptionSeen();
  if (comm == nullptr) return seen;
  at::Tensor flag =
      at::full({1}, seen ? 1.0F : 0.0F, at::TensorOptions().dtype(at::kFloat).device(setup.device));
  TRAINCTL_RETURN_IF_ERROR(
      Collective(dist::AllReduceSum(*comm, flag)->Wait(), "agreeing on a preemption stop"));
  return flag.cpu().item<float>() > 0;
}

absl::Status Trainer::Impl::StopForPreemption(const std::string& where) {
  if (checkpoint_step != position.global_step) TRAINCTL_RETURN_IF_ERROR(CheckpointNow());
  Log(absl::StrCat("preempted ", where, " (global step ", position.global_step, ")",
                   writes_checkpoints() ? ": checkpoint written" : ""));
  return WithFailureKind(absl::CancelledError(absl::StrCat("preempted ", where)),
                         FailureKind::kStopped);
}

void Trainer::Impl::WriteTimeline() {
  if (timeline == nullptr) return;
  if (absl::Status s = timeline->Write(); !s.ok()) {
    Log(absl::StrCat("comm timeline: not written: ", s.message()));
    return;
  }
  Log(absl::StrCat("comm timeline: ", timeline->steps(), " steps written to ", timeline->path(),
                   timeline->dropped() > 0
                       ? absl::StrCat(" (", timeline->dropped(), " later steps not kept)")
                       : ""));
}

absl::Status Trainer::Impl::StoppedError(const std::string& where) const {
  return WithFailureKind(absl::CancelledError(absl::StrCat("stopped by SIGTERM ", where)),
                         FailureKind::kStopped);
}

}  // namespace trainctl::trainer

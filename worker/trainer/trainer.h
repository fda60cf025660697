// Trainer: one rank's data-parallel training loop, with
// torch.nn.parallel.DistributedDataParallel semantics, for the rank process
// (rank_main.cc) and for in-process tests.
//
// Per epoch e (from the checkpoint's next epoch on a resume):
//   sampler.set_epoch(e); a DataLoader over this rank's indices;
//   per optimizer step, k = training.grad_accumulation micro-batches:
//     PrepareForward (buffer broadcast) -> forward (autocast when AMP is on)
//     -> loss (cross-entropy or MSE, in fp32) / micro-batches in the group
//     -> backward, all-reduced in buckets from autograd hooks; every
//     micro-batch but the group's last runs under NoSync()
//   then FinalizeBackward (waits for the buckets) -> unscale (fp16 loss
//   scaling) -> skip the step on inf/NaN -> clip the global grad norm ->
//   set the scheduled lr -> optimizer.step() -> zero_grad.
//   An epoch's last group may hold fewer than k micro-batches; its loss is
//   divided by its own size, so every step averages its micro-batches.
// After each epoch: evaluation (below), a checkpoint on rank 0
// (checkpoint.h; every checkpoint.every_epochs epochs and after the last),
// an "epoch_end" metric, and on every rank the log line "parameters
// crc32:xxxxxxxx at global step N" (equal on all ranks: replicas stay
// bit-identical, docs/ddp.md). After the last epoch rank 0 exports
// <checkpoint dir>/model.pt (TorchScript, loadable with torch.jit.load), and
// every rank meets at a barrier so that all exit after the export.
//
// Evaluation is sharded without padding: rank r evaluates eval samples
// r, r + W, r + 2W, ... with rank 0's buffers (broadcast first when
// ddp.broadcast_buffers), and the loss sum, correct count and sample count
// are all-reduced, so every rank reports the exact full-eval-set loss and
// accuracy (no sample counted twice, unlike a padded DistributedSampler).
//
// Metrics (via the callback) every metrics.every_steps optimizer steps:
// this rank's mean loss over the window, lr, samples/s, mean data-wait /
// compute / exposed-communication ms per step, loss scale (0 when fp16
// scaling is off), skipped steps, peak RSS (CPU) and samples seen.
//
// Errors are values. The Status returned by Create/Run carries a kind
// (FailureKindOf): kConfig for bad data or a model that does not fit it
// (wrong shapes, label out of range), kCollective for a failed or timed-out
// collective (a peer died), kStopped when the stop flag was raised, kOther
// for anything else. After a kCollective error the communicator is broken.
//
// Numerical health: every optimizer step checks the all-reduced gradients
// for NaN/Inf (identical on every rank, so every rank fails at the same
// step; with fp16 loss scaling that is the scaler's usual skip instead).
// Non-finite gradients without loss scaling, a loss scale below
// health.min_loss_scale, or more than health.max_skipped_steps skipped steps
// in a row end Run with kNan; nan_step() then says at which global step.
// Steps listed in TrainerSetup::skip_steps (a rollback's) consume their
// batches without a forward pass or an update.
//
// Threading: not thread-safe; one training thread calls Create and Run. The
// stop flag may be set from any thread (or a signal handler); it is checked
// at every optimizer-step boundary. Callbacks run on the training thread.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_env.h"
#include "worker/dist/collective_probe.h"
#include "worker/dist/collectives.h"
#include "worker/engine/dataset.h"
#include "worker/engine/model.h"
#include "worker/protocol/rank_protocol.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/rank_config.h"

namespace trainctl::trainer {

enum class FailureKind {
  kOther,       // unexpected error while training
  kConfig,      // bad data or model for this job: restarting cannot help
  kCollective,  // a collective failed or timed out
  kStopped,     // the stop flag was raised (SIGTERM)
  kDiskFull,    // a checkpoint write ran out of space (ENOSPC/EDQUOT)
  kNan,         // non-finite all-reduced gradients or a collapsed loss scale
  kResume,      // the checkpoint to resume from was missing, unreadable or corrupt
};
FailureKind FailureKindOf(const absl::Status& status);
// Returns `status` tagged with `kind` (OK stays OK).
absl::Status WithFailureKind(absl::Status status, FailureKind kind);

struct TrainerCallbacks {
  // A "train" or "epoch_end" metric.
  std::function<void(const rankproto::RankMetric&)> on_metric;
  // Heartbeat: at most about once a second, and at every epoch end.
  std::function<void(int32_t epoch, int64_t global_step)> on_progress;
  // A human-readable log line (per epoch, resume, export).
  std::function<void(const std::string&)> on_log;
  // A checkpoint this rank wrote (after its atomic rename).
  std::function<void(const WrittenCheckpoint&, const TrainingPosition&)> on_checkpoint;
  // Tests: the dataset indices this rank trained on in optimizer step
  // `global_step` (1-based) of `epoch`, after the step. Unset in production.
  std::function<void(int64_t epoch, int64_t global_step, const std::vector<int64_t>& indices)>
      on_step_samples;
};

// How often (in global steps) ranks agree on a preemption stop: one
// all-reduce of a scalar per this many steps while a preemption file is set.
inline constexpr int64_t kPreemptAgreeEverySteps = 10;

struct TrainerSetup {
  TrainingOptions options;
  int rank = 0;
  int world_size = 1;
  c10::Device device = c10::Device(c10::kCPU);
  // Who writes checkpoints (manifest) and whether this rank does: one rank
  // per host (or only rank 0 with a shared directory), chosen by the daemon.
  CheckpointManifest manifest;
  bool checkpoint_writer = true;
  // Checkpoint to resume from ("" = fresh start): the same string on every
  // rank. Rank 0 reads the file (verifying `resume_checksum` when set and the
  // manifest against `resume_job_id` and `manifest.spec_hash`) and
  // broadcasts its bytes, so other ranks need no copy of their own; without
  // collectives (world size 1) the rank reads it itself.
  std::string resume_from;
  std::string resume_checksum;
  std::string resume_job_id;
  // The file system's calls behind checkpoint writes (common/file_env.h):
  // a test's FaultFileEnv fails them. Null: the real ones.
  FileEnv* file_env = nullptr;
  // Raised from outside (SIGTERM): Run returns a kStopped error at the next
  // step boundary. May be null.
  const std::atomic<bool>* stop = nullptr;
  // Preemption (rank_protocol.h kPreemptFile; "" = none): when the stop flag
  // is raised and this file exists, the ranks do not stop at once but agree
  // on a step: every kPreemptAgreeEverySteps global steps and at each
  // epoch's end, one all-reduce of whether any rank saw the file. There the
  // checkpoint writers write a checkpoint (the exact sampler position) and
  // every rank returns kStopped. Without collectives, at the next step.
  std::string preempt_file;
  // Sleep this long at the end of every optimizer step, inside the step's
  // time, so it counts as compute time (tests only: paces a run, or makes a
  // rank a straggler).
  int64_t debug_step_sleep_ms = 0;
  // Global steps whose batches are consumed without a forward pass or an
  // update (a NaN rollback's; sorted). Counted as skipped steps.
  std::vector<int64_t> skip_steps;
  // Told the phase, the step in progress and each step's times, for the
  // rank's heartbeat (hang and straggler detection). May be null. When set,
  // `comm` should be a TrackedCollectives on the same probe.
  std::shared_ptr<dist::CollectiveProbe> probe;
  // The comm timeline (step_timeline.h; trainctl-rank takes it from
  // TRAINCTL_COMM_TIMELINE): when set, every step's timeline is kept and
  // written to PREFIX.rankN.jsonl when Run returns. "" = off.
  std::string comm_timeline_prefix;
};

struct TrainResult {
  int64_t start_epoch = 0;  // > 0 after a resume
  int64_t epochs_done = 0;
  int64_t global_step = 0;
  int64_t skipped_steps = 0;
  double last_epoch_loss = 0;  // this rank's mean training loss of the last epoch
  bool has_eval = false;
  double eval_loss = 0;
  double eval_accuracy = 0;
  std::string
      exported_model;  // checkpoint writers: path of <job id>.model.pt ("" when no checkpoint dir)
};

class Trainer {
 public:
  // Moves the model to the device, builds the sampler, optimizer and loss
  // scaler, loads `resume_from` into them, then (with `comm`) creates the
  // gradient bucketer, which broadcasts rank 0's parameters and buffers.
  // `comm` may be null only for world size 1. `eval` may be null.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      TrainerSetup setup, std::shared_ptr<engine::Model> model,
      std::shared_ptr<const engine::Dataset> train, std::shared_ptr<const engine::Dataset> eval,
      std::shared_ptr<dist::Collectives> comm, TrainerCallbacks callbacks);

  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains the remaining epochs.
  absl::StatusOr<TrainResult> Run();

  int64_t steps_per_epoch() const;
  int64_t total_steps() const;
  int64_t start_epoch() const;
  // After Run failed with kNan: the global step at fault; else -1.
  int64_t nan_step() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainctl::trainer

// Trainer::Impl::Init and its steps: the setup checks, the sampler, the
// optimizer and loss scaler, the resume from a checkpoint (rank 0 reads it,
// every rank receives it), and the gradient bucketer (which broadcasts rank
// 0's parameters). Threading: the training thread, once, from Create.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/test_hooks.h"
#include "worker/trainer/trainer_impl.h"

namespace trainctl::trainer {

using trainer_internal::Collective;
using trainer_internal::Config;
using trainer_internal::IsCommunicationError;

namespace {

// Adam and AdamW take the same options (AdamW applies the weight decay
// decoupled from the gradient).
template <typename Options>
Options AdamFamilyOptions(const OptimizerOptions& oo) {
  Options options(oo.lr);
  options.betas(std::make_tuple(oo.beta1, oo.beta2)).eps(oo.eps).weight_decay(oo.weight_decay);
  return options;
}

}  // namespace

absl::Status Trainer::Impl::Init() {
  TRAINCTL_RETURN_IF_ERROR(CheckSetup());
  TRAINCTL_RETURN_IF_ERROR(CheckTargets());
  if (absl::Status s = model->To(setup.device); !s.ok()) return Config(std::string(s.message()));
  model->SetTraining(true);
  for (const at::Tensor& p : model->Parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty()) return Config("model: no trainable parameters");
  TRAINCTL_RETURN_IF_ERROR(BuildSampler());
  BuildOptimizer();
  divergence = DivergenceDetector(opt().health.divergence_factor);

  LossScalerOptions lso;
  lso.enabled = opt().amp.enabled && opt().amp.dtype == AmpDtype::kFloat16;
  scaler = LossScaler(lso);

  position.data_seed = opt().data.seed;
  position.world_size = setup.world_size;
  if (!setup.resume_from.empty()) TRAINCTL_RETURN_IF_ERROR(Resume());
  if (!setup.comm_timeline_prefix.empty()) {
    timeline = std::make_unique<StepTimeline>(
        StepTimeline::PathFor(setup.comm_timeline_prefix, setup.rank), setup.rank, setup.world_size,
        comm != nullptr ? comm->name() : "none");
  }
  if (comm != nullptr) TRAINCTL_RETURN_IF_ERROR(CreateBucketer());
  return absl::OkStatus();
}

absl::Status Trainer::Impl::CheckSetup() const {
  if (setup.world_size < 1 || setup.rank < 0 || setup.rank >= setup.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", setup.rank, " is outside world size ", setup.world_size));
  }
  if (comm == nullptr && setup.world_size > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", setup.world_size, " needs collectives (run.backend)"));
  }
  if (comm != nullptr && (comm->rank() != setup.rank || comm->world_size() != setup.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("collectives are rank ", comm->rank(), " of ",
                                                   comm->world_size(), ", the trainer rank ",
                                                   setup.rank, " of ", setup.world_size));
  }
  if (opt().amp.enabled && opt().amp.dtype == AmpDtype::kFloat16 && !setup.device.is_cuda()) {
    return Config("training.amp.dtype: fp16 autocast needs CUDA; use bf16 on CPU");
  }
  return absl::OkStatus();
}

absl::Status Trainer::Impl::BuildSampler() {
  const TrainingOptions& o = opt();
  engine::DistributedSamplerOptions so;
  so.dataset_size = train->size();
  so.num_replicas = setup.world_size;
  so.rank = setup.rank;
  so.shuffle = o.data.shuffle;
  so.seed = o.data.seed;
  so.drop_last = o.data.drop_last;
  TRAINCTL_ASSIGN_OR_RETURN(engine::DistributedSampler s, engine::DistributedSampler::Create(so));
  sampler = std::make_unique<engine::DistributedSampler>(std::move(s));
  const int64_t n = sampler->num_samples(), b = o.data.batch_size;
  batches_per_epoch = o.data.drop_last ? n / b : (n + b - 1) / b;
  if (batches_per_epoch == 0) {
    return Config(absl::StrCat("data.batch_size: ", b, " is larger than this rank's ", n,
                               " samples per epoch and data.drop_last drops them all"));
  }
  steps_per_epoch = (batches_per_epoch + o.grad_accumulation - 1) / o.grad_accumulation;
  return absl::OkStatus();
}

void Trainer::Impl::BuildOptimizer() {
  const OptimizerOptions& oo = opt().optimizer;
  switch (oo.kind) {
    case OptimizerKind::kSgd:
      optimizer = std::make_unique<torch::optim::SGD>(
          params,
          torch::optim::SGDOptions(oo.lr).momentum(oo.momentum).weight_decay(oo.weight_decay));
      break;
    case OptimizerKind::kAdam:
      optimizer = std::make_unique<torch::optim::Adam>(
          params, AdamFamilyOptions<torch::optim::AdamOptions>(oo));
      break;
    case OptimizerKind::kAdamW:
      optimizer = std::make_unique<torch::optim::AdamW>(
          params, AdamFamilyOptions<torch::optim::AdamWOptions>(oo));
      break;
  }
}

// Loads setup.resume_from into the model, optimizer, loss scaler and
// position.
absl::Status Trainer::Impl::Resume() {
  const int64_t seed = opt().data.seed;
  TRAINCTL_ASSIGN_OR_RETURN(std::string bytes, ResumeBytes());
  CheckpointManifest expect;
  expect.job_id = setup.resume_job_id;
  expect.spec_hash = setup.manifest.spec_hash;
  const bool powersgd = comm != nullptr && opt().ddp.comm_hook == dist::CommHook::kPowerSgd;
  resumed_powersgd.rank = setup.rank;
  auto p = LoadCheckpoint(bytes, setup.resume_from, expect, *model, *optimizer, setup.device,
                          powersgd ? &resumed_powersgd : nullptr);
  if (!p.ok()) return WithFailureKind(p.status(), FailureKind::kConfig);
  position = *p;
  // The checkpoint keeps the seed as it was stored (uint64_t).
  if (position.data_seed != static_cast<uint64_t>(seed)) {
    Log(absl::StrCat("warning: checkpoint was written with data.seed=", position.data_seed,
                     ", this run uses ", seed));
    position.data_seed = static_cast<uint64_t>(seed);
  }
  position.world_size = setup.world_size;
  scaler.Restore(position.loss_scale, position.scaler_growth_tracker);
  Log(absl::StrCat("resumed from ", setup.resume_from, " at epoch ", position.epochs_done,
                   ", global step ", position.global_step));
  return absl::OkStatus();
}

// The resume checkpoint's bytes on every rank: rank 0 reads and verifies
// the file, then broadcasts its size and contents (other ranks may run on
// hosts without a copy). Any rank whose read fails makes every rank fail.
absl::StatusOr<std::string> Trainer::Impl::ResumeBytes() {
  if (comm == nullptr || setup.world_size == 1) {
    auto b = ReadCheckpointBytes(setup.resume_from, setup.resume_checksum);
    if (!b.ok()) return WithFailureKind(b.status(), FailureKind::kResume);
    return b;
  }
  absl::StatusOr<std::string> bytes = std::string();
  int64_t size = -1;
  if (setup.rank == 0) {
    bytes = ReadCheckpointBytes(setup.resume_from, setup.resume_checksum);
    if (bytes.ok()) size = static_cast<int64_t>(bytes->size());
  }
  auto opts = at::TensorOptions().device(setup.device);
  at::Tensor size_tensor = at::full({1}, size, opts.dtype(at::kLong));
  TRAINCTL_RETURN_IF_ERROR(Collective(dist::BroadcastCoalesced(*comm, {size_tensor}, 0),
                                      "broadcasting the checkpoint's size"));
  size = size_tensor.cpu().item<int64_t>();
  if (size < 0) {
    // Every rank says RESUME, so the coordinator falls back to an older
    // record whichever rank's end it hears first.
    if (setup.rank == 0) return WithFailureKind(bytes.status(), FailureKind::kResume);
    return WithFailureKind(absl::NotFoundError(absl::StrCat(
                               "rank 0 could not read the checkpoint '", setup.resume_from, "'")),
                           FailureKind::kResume);
  }
  TestPhaseSleep("resume", [this](const std::string& l) { Log(l); });
  at::Tensor data = setup.rank == 0
                        ? at::from_blob(bytes->data(), {size}, at::TensorOptions().dtype(at::kByte))
                              .to(setup.device)
                        : at::empty({size}, opts.dtype(at::kByte));
  TRAINCTL_RETURN_IF_ERROR(
      Collective(dist::BroadcastCoalesced(*comm, {data}, 0), "broadcasting the checkpoint"));
  if (setup.rank == 0) return bytes;
  at::Tensor host = data.cpu().contiguous();
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(size));
}

// Creates the gradient bucketer, which broadcasts rank 0's parameters and
// buffers to every rank.
absl::Status Trainer::Impl::CreateBucketer() {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (auto& [name, p] : model->NamedParameters()) {
    if (p.requires_grad()) named.emplace_back(name, p);
  }
  std::vector<at::Tensor> buffers;
  for (auto& [name, t] : model->NamedBuffers()) buffers.push_back(t);
  dist::GradientBucketerOptions options = opt().ddp;
  options.record_timeline = timeline != nullptr;
  auto b = dist::GradientBucketer::Create(std::move(named), std::move(buffers), comm, options);
  if (!b.ok()) {
    return IsCommunicationError(b.status())
               ? Collective(b.status(), "broadcasting the initial parameters from rank 0")
               : b.status();
  }
  ddp = std::move(b).value();
  if (timeline != nullptr) timeline->SetBuckets(ddp->buckets());
  if (setup.rank == 0 && comm->name() == "gloo+shm") {
    const auto& buckets = ddp->buckets();
    const auto shared = std::count_if(buckets.begin(), buckets.end(),
                                      [](const dist::BucketInfo& i) { return i.shared; });
    Log(absl::StrCat("ddp buckets: ", shared, " of ", buckets.size(), " in shared memory",
                     static_cast<size_t>(shared) < buckets.size()
                         ? " (no room in /dev/shm for the rest: copied through the slots)"
                         : ""));
  }
  if (opt().ddp.comm_hook == dist::CommHook::kPowerSgd) {
    const auto plan = ddp->powersgd_plan();
    Log(absl::StrCat("powersgd: ", plan.compressed_tensors, " of ", plan.tensors,
                     " gradient tensors compressed at rank ", opt().ddp.powersgd.rank, "; ",
                     plan.wire_numel, " of ", plan.bucket_numel, " values sent per step from step ",
                     opt().ddp.powersgd.start_iter));
    if (!setup.resume_from.empty()) RestorePowerSgdState();
  }
  return absl::OkStatus();
}

void Trainer::Impl::RestorePowerSgdState() {
  PowerSgdCheckpointRead read = std::move(resumed_powersgd);
  resumed_powersgd = PowerSgdCheckpointRead();
  if (read.state.has_value()) {
    Log(ddp->RestorePowerSgdState(*read.state));
    return;
  }
  Log(absl::StrCat(
      "powersgd: ",
      read.unreadable.empty()
          ? "the checkpoint holds no PowerSGD state (written without powersgd, or "
            "by an older trainctl)"
          : absl::StrCat("the checkpoint's PowerSGD state is not used: ", read.unreadable),
      "; the error feedback starts at zero, Q is drawn afresh, and the warm-up "
      "of ",
      opt().ddp.powersgd.start_iter, " plain steps runs again"));
}

}  // namespace trainctl::trainer

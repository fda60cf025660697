#include "worker/trainer/trainer.h"

#include <sys/resource.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/engine/data_loader.h"
#include "worker/engine/distributed_sampler.h"
#include "worker/trainer/autocast.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/loss_scaler.h"
#include "worker/trainer/lr_schedule.h"

namespace trainctl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kFailurePayload[] = "trainctl.dev/trainer-failure";

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Statuses the collectives return when a peer failed or the engine broke.
bool IsCommunicationError(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s) || absl::IsAborted(s);
}

absl::Status Collective(absl::Status s, const std::string& what) {
  if (s.ok()) return s;
  return WithFailureKind(absl::Status(s.code(), absl::StrCat(what, ": ", s.message())),
                         FailureKind::kCollective);
}

absl::Status Config(const std::string& message) {
  return WithFailureKind(absl::InvalidArgumentError(message), FailureKind::kConfig);
}

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

std::string LossName(LossKind k) { return k == LossKind::kCrossEntropy ? "cross_entropy" : "mse"; }

}  // namespace

FailureKind FailureKindOf(const absl::Status& status) {
  auto payload = status.GetPayload(kFailurePayload);
  if (!payload.has_value()) return FailureKind::kOther;
  const std::string v(*payload);
  if (v == "config") return FailureKind::kConfig;
  if (v == "collective") return FailureKind::kCollective;
  if (v == "stopped") return FailureKind::kStopped;
  if (v == "disk_full") return FailureKind::kDiskFull;
  if (v == "nan") return FailureKind::kNan;
  return FailureKind::kOther;
}

absl::Status WithFailureKind(absl::Status status, FailureKind kind) {
  if (status.ok()) return status;
  const char* name = kind == FailureKind::kConfig       ? "config"
                     : kind == FailureKind::kCollective ? "collective"
                     : kind == FailureKind::kStopped    ? "stopped"
                     : kind == FailureKind::kDiskFull   ? "disk_full"
                     : kind == FailureKind::kNan        ? "nan"
                                                        : "other";
  status.SetPayload(kFailurePayload, absl::Cord(name));
  return status;
}

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

  int64_t batches_per_epoch = 0;
  int64_t steps_per_epoch = 0;
  TrainingPosition position;  // epochs_done = first epoch to run

  // Numerical health: fp16 steps skipped in a row; the step a kNan failure
  // happened at (-1 = none).
  int64_t skipped_in_a_row = 0;
  int64_t nan_step = -1;

  // Metrics state.
  int64_t samples_seen = 0;
  Clock::time_point last_progress{};

  absl::Status Init();
  absl::StatusOr<std::string> ResumeBytes();
  absl::StatusOr<at::Tensor> Loss(const at::Tensor& output, const at::Tensor& target) const;
  absl::Status CheckTargets() const;
  void SetLearningRate(double lr);
  absl::StatusOr<std::array<double, 3>> Evaluate();
  void Log(const std::string& line) const {
    if (callbacks.on_log) callbacks.on_log(line);
  }
  void Progress(int32_t epoch, bool force) {
    const auto now = Clock::now();
    if (!force && now - last_progress < std::chrono::seconds(1)) return;
    last_progress = now;
    if (callbacks.on_progress) callbacks.on_progress(epoch, position.global_step);
  }
  void SetPhase(dist::ProbePhase p) {
    if (setup.probe != nullptr) setup.probe->SetPhase(p);
  }
  bool StopRequested() const {
    return setup.stop != nullptr && setup.stop->load(std::memory_order_relaxed);
  }
  c10::ScalarType AmpDtype() const {
    return opt().amp.dtype == AmpDtype::kFloat16 ? at::kHalf : at::kBFloat16;
  }
};

absl::Status Trainer::Impl::CheckTargets() const {
  for (const auto& [name, ds] : {std::make_pair("data.train", train), std::make_pair("data.eval", eval)}) {
    if (ds == nullptr) continue;
    if (ds->size() == 0) return Config(absl::StrCat(name, ": the dataset is empty"));
    auto ex = ds->Get(0);
    if (!ex.ok()) return Config(absl::StrCat(name, ": ", ex.status().message()));
    const at::Tensor& t = ex->target;
    if (opt().loss == LossKind::kCrossEntropy && (t.is_floating_point() || t.dim() != 0)) {
      return Config(absl::StrCat("training.loss: cross_entropy needs one integer class per sample, but ",
                                 name, " has ", c10::toString(t.scalar_type()), " targets of shape ",
                                 c10::str(t.sizes()), " (use mse for regression targets)"));
    }
    if (opt().loss == LossKind::kMse && !t.is_floating_point()) {
      return Config(absl::StrCat("training.loss: mse needs float targets, but ", name, " has ",
                                 c10::toString(t.scalar_type()), " class labels (use cross_entropy)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Trainer::Impl::Loss(const at::Tensor& output,
                                               const at::Tensor& target) const {
  namespace F = torch::nn::functional;
  at::Tensor out = output.scalar_type() == at::kFloat ? output : output.to(at::kFloat);
  try {
    if (opt().loss == LossKind::kCrossEntropy) return F::cross_entropy(out, target);
    at::Tensor y = target;
    if (y.dim() == 1 && out.dim() == 2 && out.size(1) == 1) y = y.unsqueeze(1);
    if (!out.sizes().equals(y.sizes())) {
      return Config(absl::StrCat("training.loss: mse: the model's output has shape ", c10::str(out.sizes()),
                                 " but the targets have shape ", c10::str(y.sizes())));
    }
    return F::mse_loss(out, y);
  } catch (const std::exception& e) {
    return Config(absl::StrCat("training.loss: ", LossName(opt().loss), " failed on the model's output of shape ",
                               c10::str(out.sizes()), ": ", FirstLine(e.what())));
  }
}

void Trainer::Impl::SetLearningRate(double lr) {
  for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
}

// The resume checkpoint's bytes on every rank: rank 0 reads and verifies
// the file, then broadcasts its size and contents (other ranks may run on
// hosts without a copy). Any rank whose read fails makes every rank fail.
absl::StatusOr<std::string> Trainer::Impl::ResumeBytes() {
  if (comm == nullptr || setup.world_size == 1) {
    auto b = ReadCheckpointBytes(setup.resume_from, setup.resume_checksum);
    if (!b.ok()) return WithFailureKind(b.status(), FailureKind::kConfig);
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
  TRAINCTL_RETURN_IF_ERROR(
      Collective(dist::BroadcastCoalesced(*comm, {size_tensor}, 0), "broadcasting the checkpoint's size"));
  size = size_tensor.cpu().item<int64_t>();
  if (size < 0) {
    if (setup.rank == 0) return WithFailureKind(bytes.status(), FailureKind::kConfig);
    return Config(absl::StrCat("rank 0 could not read the checkpoint '", setup.resume_from, "'"));
  }
  at::Tensor data = setup.rank == 0
                        ? at::from_blob(bytes->data(), {size}, at::TensorOptions().dtype(at::kByte)).to(setup.device)
                        : at::empty({size}, opts.dtype(at::kByte));
  TRAINCTL_RETURN_IF_ERROR(
      Collective(dist::BroadcastCoalesced(*comm, {data}, 0), "broadcasting the checkpoint"));
  if (setup.rank == 0) return bytes;
  at::Tensor host = data.cpu().contiguous();
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(size));
}

absl::Status Trainer::Impl::Init() {
  const TrainingOptions& o = opt();
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
  if (o.amp.enabled && o.amp.dtype == AmpDtype::kFloat16 && !setup.device.is_cuda()) {
    return Config("training.amp.dtype: fp16 autocast needs CUDA; use bf16 on CPU");
  }
  TRAINCTL_RETURN_IF_ERROR(CheckTargets());
  if (absl::Status s = model->To(setup.device); !s.ok()) return Config(std::string(s.message()));
  model->SetTraining(true);
  for (const at::Tensor& p : model->Parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty()) return Config("model: no trainable parameters");

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

  const OptimizerOptions& oo = o.optimizer;
  switch (oo.kind) {
    case OptimizerKind::kSgd:
      optimizer = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(oo.lr).momentum(oo.momentum).weight_decay(oo.weight_decay));
      break;
    case OptimizerKind::kAdam:
      optimizer = std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(oo.lr)
                      .betas(std::make_tuple(oo.beta1, oo.beta2))
                      .eps(oo.eps)
                      .weight_decay(oo.weight_decay));
      break;
    case OptimizerKind::kAdamW:
      optimizer = std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(oo.lr)
                      .betas(std::make_tuple(oo.beta1, oo.beta2))
                      .eps(oo.eps)
                      .weight_decay(oo.weight_decay));
      break;
  }

  LossScalerOptions lso;
  lso.enabled = o.amp.enabled && o.amp.dtype == AmpDtype::kFloat16;
  scaler = LossScaler(lso);

  position.data_seed = o.data.seed;
  position.world_size = setup.world_size;
  if (!setup.resume_from.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(std::string bytes, ResumeBytes());
    CheckpointManifest expect;
    expect.job_id = setup.resume_job_id;
    expect.spec_hash = setup.manifest.spec_hash;
    auto p = LoadCheckpoint(bytes, setup.resume_from, expect, *model, *optimizer, setup.device);
    if (!p.ok()) return WithFailureKind(p.status(), FailureKind::kConfig);
    position = *p;
    if (position.data_seed != o.data.seed) {
      Log(absl::StrCat("warning: checkpoint was written with data.seed=", position.data_seed,
                       ", this run uses ", o.data.seed));
      position.data_seed = o.data.seed;
    }
    position.world_size = setup.world_size;
    scaler.Restore(position.loss_scale, position.scaler_growth_tracker);
    Log(absl::StrCat("resumed from ", setup.resume_from, " at epoch ", position.epochs_done,
                     ", global step ", position.global_step));
  }

  if (comm != nullptr) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (auto& [name, p] : model->NamedParameters()) {
      if (p.requires_grad()) named.emplace_back(name, p);
    }
    std::vector<at::Tensor> buffers;
    for (auto& [name, t] : model->NamedBuffers()) buffers.push_back(t);
    auto b = dist::GradientBucketer::Create(std::move(named), std::move(buffers), comm, o.ddp);
    if (!b.ok()) {
      return IsCommunicationError(b.status())
                 ? Collective(b.status(), "broadcasting the initial parameters from rank 0")
                 : b.status();
    }
    ddp = std::move(b).value();
  }
  return absl::OkStatus();
}

// Returns {loss sum, correct, samples} over the whole eval set (all ranks).
absl::StatusOr<std::array<double, 3>> Trainer::Impl::Evaluate() {
  const TrainingOptions& o = opt();
  if (comm != nullptr && o.ddp.broadcast_buffers) {
    std::vector<at::Tensor> buffers;
    for (auto& [name, t] : model->NamedBuffers()) buffers.push_back(t);
    if (!buffers.empty()) {
      TRAINCTL_RETURN_IF_ERROR(
          Collective(dist::BroadcastCoalesced(*comm, buffers, 0), "broadcasting buffers for eval"));
    }
  }
  std::vector<int64_t> indices;
  for (int64_t i = setup.rank; i < eval->size(); i += setup.world_size) indices.push_back(i);
  engine::DataLoaderOptions lo;
  lo.batch_size = o.data.batch_size;
  lo.num_workers = o.data.num_workers;
  lo.pin_memory = o.data.pin_memory && setup.device.is_cuda();
  TRAINCTL_ASSIGN_OR_RETURN(auto loader, engine::DataLoader::Create(eval, std::move(indices), lo));

  model->SetTraining(false);
  const auto dopts = at::TensorOptions().dtype(at::kDouble).device(setup.device);
  at::Tensor loss_sum = at::zeros({}, dopts), correct = at::zeros({}, dopts);
  int64_t samples = 0;
  {
    torch::NoGradGuard no_grad;
    namespace F = torch::nn::functional;
    while (true) {
      TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, loader->Next());
      if (!batch.has_value()) break;
      at::Tensor x = batch->input.to(setup.device, lo.pin_memory);
      at::Tensor y = batch->target.to(setup.device, lo.pin_memory);
      absl::StatusOr<at::Tensor> out;
      {
        AutocastGuard autocast(o.amp.enabled, setup.device.type(), AmpDtype());
        out = model->Forward(x);
      }
      if (!out.ok()) {
        model->SetTraining(true);
        return Config(absl::StrCat("data.eval: ", out.status().message()));
      }
      at::Tensor logits = out->to(at::kFloat);
      const int64_t count = x.size(0);
      try {
        if (o.loss == LossKind::kCrossEntropy) {
          loss_sum.add_(F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                            .to(at::kDouble));
          correct.add_(logits.argmax(1).eq(y).sum().to(at::kDouble));
        } else {
          if (y.dim() == 1 && logits.dim() == 2 && logits.size(1) == 1) y = y.unsqueeze(1);
          at::Tensor per = F::mse_loss(logits, y, F::MSELossFuncOptions().reduction(torch::kNone));
          loss_sum.add_(per.reshape({count, -1}).mean(1).sum().to(at::kDouble));
        }
      } catch (const std::exception& e) {
        model->SetTraining(true);
        return Config(absl::StrCat("data.eval: ", LossName(o.loss), " failed: ", FirstLine(e.what())));
      }
      samples += count;
    }
  }
  model->SetTraining(true);
  at::Tensor sums = at::stack({loss_sum, correct, at::full({}, static_cast<double>(samples), dopts)});
  if (comm != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(Collective(dist::AllReduceSum(*comm, sums)->Wait(), "all-reducing eval metrics"));
  }
  at::Tensor cpu = sums.cpu();
  return std::array<double, 3>{cpu[0].item<double>(), cpu[1].item<double>(), cpu[2].item<double>()};
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
  if (model == nullptr || train == nullptr) return absl::InvalidArgumentError("Trainer: no model or no train set");
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
  const TrainingOptions& o = m.opt();
  const int64_t total_steps = m.steps_per_epoch * o.epochs;
  const bool pin = o.data.pin_memory && m.setup.device.is_cuda();
  TrainResult result;
  result.start_epoch = m.position.epochs_done;

  // Writes a checkpoint at m.position (the host's writer rank only).
  auto write_checkpoint = [&]() -> absl::Status {
    m.SetPhase(dist::ProbePhase::kCheckpoint);
    m.position.loss_scale = m.scaler.scale();
    m.position.scaler_growth_tracker = m.scaler.growth_tracker();
    auto written =
        WriteCheckpoint(o.checkpoint.dir, o.checkpoint.keep, m.setup.manifest, m.position, *m.model, *m.optimizer);
    if (!written.ok()) {
      const absl::Status& ws = written.status();
      if (absl::IsResourceExhausted(ws)) return WithFailureKind(ws, FailureKind::kDiskFull);
      if (absl::IsFailedPrecondition(ws)) return WithFailureKind(ws, FailureKind::kConfig);
      return ws;
    }
    if (m.callbacks.on_checkpoint) m.callbacks.on_checkpoint(*written, m.position);
    return absl::OkStatus();
  };
  const bool writes_checkpoints = m.setup.checkpoint_writer && !o.checkpoint.dir.empty();
  const int64_t world = std::max<int64_t>(1, m.setup.world_size);

  for (int64_t epoch = m.position.epochs_done; epoch < o.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    m.sampler->set_epoch(epoch);
    // A checkpoint taken inside this epoch: continue where it stopped, the
    // rest of the epoch's order split over this attempt's ranks.
    const int64_t consumed_base = m.position.epoch_consumed;
    std::vector<int64_t> indices =
        consumed_base > 0 ? m.sampler->RemainingIndices(consumed_base) : m.sampler->Indices();
    if (consumed_base > 0) {
      m.Log(absl::StrCat("continuing epoch ", epoch + 1, " after ", consumed_base, " of its ",
                         m.sampler->options().dataset_size, " samples, at world size ", world, " (",
                         indices.size(), " samples left on this rank)"));
    }
    engine::DataLoaderOptions lo;
    lo.batch_size = o.data.batch_size;
    lo.drop_last = o.data.drop_last;
    lo.num_workers = o.data.num_workers;
    lo.pin_memory = pin;
    // Only the on_step_samples hook (tests) needs the order after this.
    std::vector<int64_t> order;
    if (m.callbacks.on_step_samples) order = indices;
    const int64_t rank_samples = static_cast<int64_t>(indices.size());
    TRAINCTL_ASSIGN_OR_RETURN(auto loader, engine::DataLoader::Create(m.train, std::move(indices), lo));
    const int64_t batches = loader->num_batches();
    const int64_t epoch_steps = (batches + o.grad_accumulation - 1) / o.grad_accumulation;
    // A continued epoch counts its steps from where a full one would be.
    const int64_t step_offset = std::max<int64_t>(0, m.steps_per_epoch - epoch_steps);
    m.model->SetTraining(true);
    m.SetPhase(dist::ProbePhase::kInit);  // until its first step: loader start-up
    m.Progress(static_cast<int32_t>(epoch), /*force=*/true);

    // Epoch and metric-window accumulators. Losses stay on the device until
    // a report needs them (no host sync per step).
    at::Tensor epoch_loss = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(m.setup.device));
    int64_t epoch_micro = 0, epoch_samples = 0;
    double epoch_data_ms = 0, epoch_comm_ms = 0, epoch_step_ms = 0;
    at::Tensor window_loss = at::zeros_like(epoch_loss);
    int64_t window_micro = 0, window_steps = 0, window_samples = 0;
    double window_data_ms = 0, window_comm_ms = 0, window_step_ms = 0;
    auto window_start = Clock::now();
    double lr = 0;

    int64_t step_in_epoch = step_offset;
    for (int64_t first = 0; first < batches; first += o.grad_accumulation) {
      const int64_t group = std::min<int64_t>(o.grad_accumulation, batches - first);
      if (std::binary_search(m.setup.skip_steps.begin(), m.setup.skip_steps.end(), m.position.global_step)) {
        // A rollback passes over the step an earlier attempt failed at: its
        // batches are consumed (the sampler order stays the same) and
        // nothing else happens, on every rank alike.
        for (int64_t i = 0; i < group; ++i) {
          TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, loader->Next());
          if (!batch.has_value()) return absl::InternalError("data loader ended before its batch count");
        }
        m.Log(absl::StrCat("skipping step ", m.position.global_step, " (epoch ", epoch,
                           "): rolled back after a NaN there"));
        ++m.position.skipped_steps;
        ++m.position.global_step;
        ++step_in_epoch;
        continue;
      }
      const bool inject_nan = m.setup.rank == 0 && o.health.debug_nan_at_step > 0 &&
                              m.position.global_step == o.health.debug_nan_at_step;
      const auto step_start = Clock::now();
      if (m.setup.probe != nullptr) {
        m.setup.probe->BeginStep(m.position.global_step + 1);
        m.setup.probe->SetPhase(dist::ProbePhase::kTrain);
      }
      double data_ms = 0, step_comm_ms = 0;
      for (int64_t i = 0; i < group; ++i) {
        const auto t0 = Clock::now();
        TRAINCTL_ASSIGN_OR_RETURN(std::optional<engine::Example> batch, loader->Next());
        if (!batch.has_value()) return absl::InternalError("data loader ended before its batch count");
        at::Tensor x = batch->input.to(m.setup.device, pin);
        at::Tensor y = batch->target.to(m.setup.device, pin);
        data_ms += Ms(Clock::now() - t0);

        const bool sync = i == group - 1;
        std::optional<dist::GradientBucketer::NoSyncGuard> no_sync;
        if (m.ddp != nullptr && !sync) no_sync.emplace(m.ddp.get());
        if (m.ddp != nullptr) {
          TRAINCTL_RETURN_IF_ERROR(Collective(m.ddp->PrepareForward(), "broadcasting buffers"));
        }
        absl::StatusOr<at::Tensor> out;
        {
          AutocastGuard autocast(o.amp.enabled, m.setup.device.type(), m.AmpDtype());
          out = m.model->Forward(x);
        }
        if (!out.ok()) return Config(absl::StrCat("model does not fit data.train: ", out.status().message()));
        TRAINCTL_ASSIGN_OR_RETURN(at::Tensor loss, m.Loss(*out, y));
        if (inject_nan && i == 0) {
          m.Log(absl::StrCat("health.debug_nan_at_step: a NaN loss at step ", m.position.global_step));
          loss = loss * std::numeric_limits<double>::quiet_NaN();
        }
        if (m.ddp != nullptr && sync && o.ddp.find_unused_parameters) {
          // Lets buckets of parameters this forward did not use launch early.
          absl::Status s = m.ddp->PrepareForBackward({loss});
          if (!s.ok()) return IsCommunicationError(s) ? Collective(s, "gradient all-reduce") : s;
        }
        if (m.setup.debug_compute_sleep_ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(m.setup.debug_compute_sleep_ms));
        }
        try {
          (m.scaler.Scale(loss) / static_cast<double>(group)).backward();
        } catch (const std::exception& e) {
          return absl::InternalError(absl::StrCat("backward failed: ", FirstLine(e.what())));
        }
        if (m.ddp != nullptr) {
          absl::Status s = m.ddp->FinalizeBackward();
          if (!s.ok()) {
            return IsCommunicationError(s) ? Collective(s, "gradient all-reduce") : s;
          }
          if (sync) {
            const double comm_ms = absl::ToDoubleMilliseconds(m.ddp->last_step_stats().exposed_comm);
            step_comm_ms += comm_ms;
            window_comm_ms += comm_ms;
            epoch_comm_ms += comm_ms;
          }
        }
        at::Tensor detached = loss.detach().to(at::kDouble);
        epoch_loss += detached;
        window_loss += detached;
        ++epoch_micro;
        ++window_micro;
        window_samples += x.size(0);
        epoch_samples += x.size(0);
        m.samples_seen += x.size(0);
      }

      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : m.params) grads.push_back(p.grad());
      // The gradients are all-reduced: every rank sees the same NaN/Inf.
      // fp16 loss scaling checks every gradient (PyTorch's GradScaler).
      // Without it, a non-finite loss on any rank makes the all-reduced
      // gradients non-finite everywhere, the output layer's among them, so
      // checking those (the last parameters) costs next to nothing per step,
      // where a pass over every gradient costs a large share of a small
      // model's CPU step.
      const bool found_inf = m.scaler.enabled() ? m.scaler.Unscale(grads) : !OutputGradientsFinite(grads);
      if (found_inf && !m.scaler.enabled()) {
        m.nan_step = m.position.global_step;
        return WithFailureKind(
            absl::DataLossError(absl::StrCat("NaN/Inf gradients at step ", m.position.global_step, " (epoch ",
                                             epoch, "): the loss or a gradient was not finite on a rank")),
            FailureKind::kNan);
      }
      lr = LearningRateAt(o.lr_schedule, o.optimizer.lr, m.position.global_step, total_steps);
      if (found_inf) {
        ++m.position.skipped_steps;
      } else {
        if (o.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(m.params, o.max_grad_norm);
        m.SetLearningRate(lr);
        m.optimizer->step();
      }
      m.scaler.Update(found_inf);
      if (m.scaler.enabled()) {
        m.skipped_in_a_row = found_inf ? m.skipped_in_a_row + 1 : 0;
        std::string collapse;
        if (o.health.max_skipped_steps > 0 && m.skipped_in_a_row > o.health.max_skipped_steps) {
          collapse = absl::StrCat(m.skipped_in_a_row, " steps in a row had NaN/Inf gradients (health.max_skipped_steps: ",
                                  o.health.max_skipped_steps, ")");
        } else if (o.health.min_loss_scale > 0 && m.scaler.scale() < o.health.min_loss_scale) {
          collapse = absl::StrFormat("the loss scale fell to %g, below health.min_loss_scale %g",
                                     m.scaler.scale(), o.health.min_loss_scale);
        }
        if (!collapse.empty()) {
          m.nan_step = m.position.global_step;
          return WithFailureKind(absl::DataLossError(absl::StrCat("AMP loss scale collapsed at step ",
                                                                  m.position.global_step, " (epoch ", epoch,
                                                                  "): ", collapse)),
                                 FailureKind::kNan);
        }
      }
      m.optimizer->zero_grad();
      ++m.position.global_step;
      ++step_in_epoch;
      ++window_steps;
      const double step_ms = Ms(Clock::now() - step_start);
      if (m.setup.probe != nullptr) {
        m.setup.probe->EndStep(step_ms, std::max(0.0, step_ms - data_ms - step_comm_ms));
      }
      window_data_ms += data_ms;
      window_step_ms += step_ms;
      epoch_data_ms += data_ms;
      epoch_step_ms += step_ms;

      const bool epoch_done = first + group >= batches;
      if (m.callbacks.on_step_samples) {
        const size_t from = static_cast<size_t>(first * o.data.batch_size);
        const size_t to = std::min(order.size(), static_cast<size_t>((first + group) * o.data.batch_size));
        m.callbacks.on_step_samples(epoch, m.position.global_step,
                                    std::vector<int64_t>(order.begin() + static_cast<std::ptrdiff_t>(from),
                                                         order.begin() + static_cast<std::ptrdiff_t>(to)));
      }
      // Every rank took the same number of positions (skipped steps too).
      m.position.epoch_consumed =
          epoch_done ? 0 : consumed_base + std::min((first + group) * o.data.batch_size, rank_samples) * world;
      if (step_in_epoch % o.metrics_every_steps == 0 || epoch_done) {
        const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        rankproto::RankMetric metric;
        metric.kind = "train";
        metric.epoch = static_cast<int32_t>(epoch);
        metric.step = step_in_epoch;
        metric.steps_per_epoch = m.steps_per_epoch;
        metric.loss = window_loss.item<double>() / static_cast<double>(std::max<int64_t>(window_micro, 1));
        metric.lr = lr;
        metric.samples_per_sec = secs > 0 ? static_cast<double>(window_samples) / secs : 0;
        metric.data_ms = window_data_ms / static_cast<double>(window_steps);
        metric.comm_ms = window_comm_ms / static_cast<double>(window_steps);
        metric.compute_ms =
            std::max(0.0, (window_step_ms - window_data_ms - window_comm_ms) / static_cast<double>(window_steps));
        metric.loss_scale = m.scaler.enabled() ? m.scaler.scale() : 0;
        metric.skipped_steps = m.position.skipped_steps;
        metric.peak_memory_bytes = PeakRssBytes();
        metric.samples_seen = m.samples_seen;
        if (m.callbacks.on_metric) m.callbacks.on_metric(metric);
        window_loss.zero_();
        window_micro = window_steps = window_samples = 0;
        window_data_ms = window_comm_ms = window_step_ms = 0;
        window_start = Clock::now();
      }
      if (writes_checkpoints && !epoch_done && o.checkpoint.every_steps > 0 &&
          m.position.global_step % o.checkpoint.every_steps == 0) {
        TRAINCTL_RETURN_IF_ERROR(write_checkpoint());
      }
      m.Progress(static_cast<int32_t>(epoch), /*force=*/false);
      if (m.setup.debug_step_sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(m.setup.debug_step_sleep_ms));
      }
      if (m.StopRequested()) {
        return WithFailureKind(absl::CancelledError(absl::StrCat("stopped by SIGTERM at epoch ", epoch,
                                                                 ", global step ", m.position.global_step)),
                               FailureKind::kStopped);
      }
    }
    loader.reset();

    rankproto::RankMetric end;
    end.kind = "epoch_end";
    end.epoch = static_cast<int32_t>(epoch);
    end.step = step_in_epoch;
    end.steps_per_epoch = m.steps_per_epoch;
    end.loss = epoch_loss.item<double>() / static_cast<double>(std::max<int64_t>(epoch_micro, 1));
    end.lr = lr;
    const double epoch_secs = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    end.samples_per_sec =
        epoch_secs > 0 ? static_cast<double>(epoch_samples) / epoch_secs : 0;
    if (step_in_epoch > step_offset) {
      const double steps = static_cast<double>(step_in_epoch - step_offset);
      end.data_ms = epoch_data_ms / steps;
      end.comm_ms = epoch_comm_ms / steps;
      end.compute_ms = std::max(0.0, (epoch_step_ms - epoch_data_ms - epoch_comm_ms) / steps);
    }
    end.loss_scale = m.scaler.enabled() ? m.scaler.scale() : 0;
    end.skipped_steps = m.position.skipped_steps;
    end.peak_memory_bytes = PeakRssBytes();
    end.samples_seen = m.samples_seen;
    result.last_epoch_loss = end.loss;
    if (m.eval != nullptr) {
      m.SetPhase(dist::ProbePhase::kEval);
      TRAINCTL_ASSIGN_OR_RETURN(auto sums, m.Evaluate());
      end.has_eval = true;
      end.eval_samples = static_cast<int64_t>(sums[2]);
      end.eval_loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
      end.eval_accuracy = o.loss == LossKind::kCrossEntropy && sums[2] > 0 ? sums[1] / sums[2] : 0;
      result.has_eval = true;
      result.eval_loss = end.eval_loss;
      result.eval_accuracy = end.eval_accuracy;
    }

    m.position.epochs_done = epoch + 1;
    m.position.epoch_consumed = 0;
    const bool last = epoch + 1 == o.epochs;
    const int64_t every = o.checkpoint.every_epochs;
    if (writes_checkpoints && (last || (every > 0 && (epoch + 1) % every == 0))) {
      TRAINCTL_RETURN_IF_ERROR(write_checkpoint());
    }
    if (m.callbacks.on_metric) m.callbacks.on_metric(end);
    m.Progress(static_cast<int32_t>(epoch), /*force=*/true);
    std::string line = absl::StrFormat("epoch %d/%d: loss %.5f, lr %.3g, %d steps, %.1f s", epoch + 1,
                                       o.epochs, end.loss, lr, step_in_epoch, epoch_secs);
    if (end.has_eval) {
      absl::StrAppendFormat(&line, ", eval loss %.5f, accuracy %.4f (%d samples)", end.eval_loss,
                            end.eval_accuracy, end.eval_samples);
    }
    m.Log(line);
    if (m.StopRequested()) {
      return WithFailureKind(absl::CancelledError(absl::StrCat("stopped by SIGTERM after epoch ", epoch)),
                             FailureKind::kStopped);
    }
  }

  result.epochs_done = m.position.epochs_done;
  result.global_step = m.position.global_step;
  result.skipped_steps = m.position.skipped_steps;
  if (m.setup.checkpoint_writer && !o.checkpoint.dir.empty()) {
    m.SetPhase(dist::ProbePhase::kCheckpoint);
    const std::string path = o.checkpoint.dir + "/model.pt";
    TRAINCTL_RETURN_IF_ERROR(m.model->ExportTorchScript(path));
    TRAINCTL_RETURN_IF_ERROR(SyncFileAndDir(path));
    result.exported_model = path;
    m.Log(absl::StrCat("exported the final model to ", path));
  }
  if (m.comm != nullptr) {
    TRAINCTL_RETURN_IF_ERROR(Collective(m.comm->Barrier(), "final barrier"));
  }
  return result;
}

}  // namespace trainctl::trainer

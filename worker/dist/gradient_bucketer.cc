#include "worker/dist/gradient_bucketer.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <c10/core/GradMode.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/dist/bucket_assignment.h"
#include "worker/dist/tensor_collectives.h"

namespace trainctl::dist {
namespace {

using Clock = std::chrono::steady_clock;

// A zeroed bucket of `total` elements like `like`: in memory the engine
// reduces without copies when it has some (a CPU bucket on a shared-memory
// Gloo engine; *shared says so), else private memory. The tensor keeps that
// memory alive, also as param.grad() views after the bucketer is gone.
absl::StatusOr<at::Tensor> NewBucketMemory(Collectives& comm, int64_t total, const at::Tensor& like,
                                           bool* shared) {
  const auto options = like.options().requires_grad(false);
  *shared = false;
  if (like.is_cpu() && comm.device() == CommDevice::kCpu) {
    TRAINCTL_ASSIGN_OR_RETURN(
        std::shared_ptr<void> mem,
        comm.AllocateShared(static_cast<size_t>(total) * like.element_size()));
    if (mem != nullptr) {
      *shared = true;
      return at::from_blob(
                 mem.get(), {total}, [mem](void*) mutable { mem.reset(); }, options)
          .zero_();
    }
  }
  return at::zeros({total}, options);
}

absl::Duration Since(Clock::time_point t) { return absl::FromChrono(Clock::now() - t); }

// Whether `grad` is the bucket slot `view` itself (gradient_as_bucket_view).
bool IsBucketSlot(const at::Tensor& grad, const at::Tensor& view) {
  return grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
         grad.strides() == view.strides() && grad.scalar_type() == view.scalar_type();
}

std::string GroupOf(const at::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), "@", t.device().str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradientBucketer>> GradientBucketer::Create(
    torch::nn::Module& module, std::shared_ptr<Collectives> comm,
    const GradientBucketerOptions& options) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    // Shared parameters are synchronised once, under their first name (DDP).
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    named.emplace_back(item.key(), p);
  }
  std::vector<at::Tensor> buffers;
  for (const auto& b : module.buffers(/*recurse=*/true)) buffers.push_back(b);
  return Create(std::move(named), std::move(buffers), std::move(comm), options);
}

absl::StatusOr<std::unique_ptr<GradientBucketer>> GradientBucketer::Create(
    std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<at::Tensor> buffers,
    std::shared_ptr<Collectives> comm, const GradientBucketerOptions& options) {
  if (comm == nullptr) return absl::InvalidArgumentError("GradientBucketer: no collectives");
  if (!(options.bucket_cap_mb > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GradientBucketer: bucket_cap_mb must be > 0, got ", options.bucket_cap_mb));
  }
  if (options.first_bucket_bytes == 0) {
    return absl::InvalidArgumentError("GradientBucketer: first_bucket_bytes must be > 0");
  }
  if (options.comm_hook == CommHook::kPowerSgd) {
    const PowerSgdOptions& o = options.powersgd;
    if (o.rank < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: powersgd rank must be >= 1, got ", o.rank));
    }
    if (o.start_iter < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: powersgd start_iter must be >= 0, got ", o.start_iter));
    }
    if (!std::isfinite(o.min_compression_rate) || o.min_compression_rate < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: powersgd min_compression_rate must be >= 1, got ",
                       o.min_compression_rate));
    }
  }
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  for (auto& [name, p] : named_params) {
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GradientBucketer: parameter '", name, "' must be a defined leaf tensor requiring grad"));
    }
    if (p.layout() != at::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: parameter '", name, "' is not dense"));
    }
    const CommDevice device = p.is_cuda() ? CommDevice::kCuda : CommDevice::kCpu;
    if (!(p.is_cpu() || p.is_cuda()) || device != comm->device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: parameter '", name, "' is on ", p.device().str(),
                       " but the ", comm->name(), " collectives take ",
                       comm->device() == CommDevice::kCuda ? "CUDA" : "CPU", " tensors"));
    }
    if (auto t = CommDataTypeOf(p); !t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: parameter '", name, "': ", t.status().message()));
    }
    names.push_back(std::move(name));
    params.push_back(std::move(p));
  }
  std::unique_ptr<GradientBucketer> b(new GradientBucketer(
      std::move(names), std::move(params), std::move(buffers), std::move(comm), options));
  TRAINCTL_RETURN_IF_ERROR(b->Init());
  return b;
}

GradientBucketer::GradientBucketer(std::vector<std::string> names, std::vector<at::Tensor> params,
                                   std::vector<at::Tensor> buffers,
                                   std::shared_ptr<Collectives> comm,
                                   const GradientBucketerOptions& options)
    : options_(options),
      comm_(std::move(comm)),
      names_(std::move(names)),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      powersgd_rng_(options.powersgd.seed) {}

absl::Status GradientBucketer::Init() {
  // Every rank starts from rank 0's parameters and buffers.
  std::vector<at::Tensor> state(params_.begin(), params_.end());
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  TRAINCTL_RETURN_IF_ERROR(BroadcastCoalesced(*comm_, state, /*root=*/0));

  // Reverse registration order approximates the order backward produces
  // gradients in, so the first bucket is the first to be complete.
  const size_t n = params_.size();
  std::vector<size_t> order(n);
  std::vector<BucketTensorInfo> infos(n);
  for (size_t k = 0; k < n; ++k) {
    order[k] = n - 1 - k;
    const auto& p = params_[order[k]];
    infos[k] = {static_cast<size_t>(p.numel()) * p.element_size(), GroupOf(p)};
  }
  const size_t cap = static_cast<size_t>(options_.bucket_cap_mb * 1024 * 1024);
  const auto specs =
      ComputeBucketAssignment(infos, {options_.first_bucket_bytes, std::max<size_t>(cap, 1)});

  if (options_.record_timeline) comm_->RecordWorkTimes();
  absl::MutexLock l(&mu_);
  locations_.resize(n);
  c10::NoGradGuard no_grad;
  for (const auto& spec : specs) {
    Bucket bucket;
    BucketInfo info;
    info.size_limit = spec.size_limit;
    int64_t total = 0;
    for (size_t k : spec.indices) {
      bucket.params.push_back(order[k]);
      total += params_[order[k]].numel();
    }
    const auto& first = params_[bucket.params.front()];
    TRAINCTL_ASSIGN_OR_RETURN(bucket.flat, NewBucketMemory(*comm_, total, first, &info.shared));
    if (CastsTo16Bits(options_.comm_hook))
      bucket.compressed = NewCompressedBuffer(bucket.flat, options_.comm_hook);
    int64_t offset = 0;
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      const auto& p = params_[bucket.params[slot]];
      if (options_.gradient_as_bucket_view) {
        at::Tensor v = at::empty({0}, bucket.flat.options());
        v.set_(bucket.flat.storage(), bucket.flat.storage_offset() + offset, p.sizes(),
               c10::contiguous_strides(p.sizes()));
        bucket.views.push_back(std::move(v));
      } else {
        bucket.views.push_back(bucket.flat.narrow(0, offset, p.numel()).view(p.sizes()));
      }
      offset += p.numel();
      locations_[bucket.params[slot]] = {buckets_.size(), slot};
    }
    // Other dtypes are divided and summed as during PowerSGD's warm-up.
    if (options_.comm_hook == CommHook::kPowerSgd && bucket.flat.scalar_type() == at::kFloat) {
      bucket.powersgd =
          std::make_unique<PowerSgdBucket>(bucket.flat, bucket.views, options_.powersgd);
    }
    info.params = bucket.params;
    info.bytes = static_cast<size_t>(total) * first.element_size();
    bucket_infos_.push_back(std::move(info));
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(n, 0);
  locally_used_.assign(n, 0);
  ResetStepLocked();

  // Post-hooks on the gradient accumulators fire once a parameter's gradient
  // has been accumulated into param.grad(), while backward still runs.
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (acc == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("GradientBucketer: parameter '", names_[i],
                                                     "' has no gradient accumulator"));
    }
    hook_keys_.push_back(
        acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              OnGradReady(i);
              return outputs;
            })));
    accumulators_.push_back(std::move(acc));
  }
  return absl::OkStatus();
}

GradientBucketer::~GradientBucketer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

void GradientBucketer::set_require_backward_grad_sync(bool sync) {
  absl::MutexLock l(&mu_);
  require_sync_ = sync;
}

bool GradientBucketer::require_backward_grad_sync() const {
  absl::MutexLock l(&mu_);
  return require_sync_;
}

StepCommStats GradientBucketer::last_step_stats() const {
  absl::MutexLock l(&mu_);
  return last_;
}

GradientBucketer::PowerSgdPlan GradientBucketer::powersgd_plan() const {
  absl::MutexLock l(&mu_);
  PowerSgdPlan plan;
  for (const auto& b : buckets_) {
    if (b.powersgd == nullptr) continue;
    plan.compressed_tensors += b.powersgd->compressed_tensors();
    plan.tensors += b.params.size();
    plan.wire_numel += b.powersgd->wire_numel();
    plan.bucket_numel += b.powersgd->bucket_numel();
  }
  return plan;
}

std::string GradientBucketer::DescribeParams(const std::vector<size_t>& indices) const {
  std::vector<std::string> parts;
  for (size_t k = 0; k < indices.size() && k < 10; ++k) {
    parts.push_back(absl::StrCat(indices[k], " '", names_[indices[k]], "'"));
  }
  std::string s = absl::StrJoin(parts, ", ");
  if (indices.size() > 10) absl::StrAppend(&s, " and ", indices.size() - 10, " more");
  return s;
}

void GradientBucketer::ResetStepLocked() {
  step_started_ = false;
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
    b.q_work.reset();
  }
  next_bucket_ = 0;
  grads_ready_ = 0;
  step_error_ = absl::OkStatus();
  current_ = StepCommStats{};
  current_.num_params = params_.size();
  if (options_.record_timeline) current_.timeline.resize(buckets_.size());
}

void GradientBucketer::StartStepLocked() {
  step_started_ = true;
  current_.buffer_broadcast = pending_buffer_broadcast_;
  pending_buffer_broadcast_ = absl::ZeroDuration();
}

void GradientBucketer::OnGradReady(size_t index) {
  absl::MutexLock l(&mu_);
  // Under no_sync the gradient just stays accumulated in param.grad().
  if (!require_sync_) return;
  if (!step_started_) StartStepLocked();
  if (ready_[index]) {
    if (step_error_.ok()) {
      step_error_ = absl::FailedPreconditionError(absl::StrCat(
          "GradientBucketer: parameter ", DescribeParams({index}),
          " received a gradient twice in one synced step (a second backward before "
          "FinalizeBackward(), or a parameter used by reentrant backward/checkpointing)"));
    }
    return;
  }
  MarkReadyLocked(index, /*unused=*/false, /*from_hook=*/true);
  if (!options_.launch_after_backward) LaunchReadyBucketsLocked(/*from_hook=*/true);
}

void GradientBucketer::MarkReadyLocked(size_t index, bool unused, bool from_hook) {
  const ParamLocation loc = locations_[index];
  Bucket& bucket = buckets_[loc.bucket];
  at::Tensor& view = bucket.views[loc.slot];
  c10::NoGradGuard no_grad;
  const at::Tensor& grad = params_[index].grad();
  if (unused && grad.defined() && IsBucketSlot(grad, view)) {
    // The bucket slot is zeroed below, but a parameter no rank used keeps
    // its gradient: move it out of the bucket first.
    params_[index].mutable_grad() = grad.clone();
  }
  if (unused || !grad.defined()) {
    view.zero_();
  } else if (grad.layout() != at::kStrided) {
    view.zero_();
    if (step_error_.ok()) {
      step_error_ = absl::InvalidArgumentError(
          absl::StrCat("GradientBucketer: parameter ", DescribeParams({index}),
                       " has a sparse gradient; only dense gradients are synchronised"));
    }
  } else if (Compresses(options_.comm_hook)) {
    // As PyTorch's reducer with a comm hook registered: the raw gradient;
    // the hook divides (CompressBucket). With gradient_as_bucket_view
    // backward put it there already, and the hook's result (cast back, or
    // PowerSGD's approximation) lands in param.grad() with it.
    if (!IsBucketSlot(grad, view)) {
      view.copy_(grad);
      UseBucketSlotAsGradLocked(index, view);
    }
  } else {
    // As PyTorch's reducer: divide while copying into the bucket, so the sum
    // all-reduce yields the average and the gradient is scanned once. The
    // same multiplication in place when backward accumulated into the bucket
    // itself (gradient_as_bucket_view): the same bytes either way.
    at::Tensor scale = c10::scalar_to_tensor(c10::Scalar(1.0 / comm_->world_size()));
    scale.unsafeGetTensorImpl()->set_wrapped_number(true);
    if (IsBucketSlot(grad, view)) {
      view.mul_(scale);
    } else {
      at::mul_out(view, grad, scale);
      UseBucketSlotAsGradLocked(index, view);
    }
  }
  ready_[index] = 1;
  ++grads_ready_;
  if (!unused) locally_used_[index] = 1;
  if (from_hook) ++current_.grads_from_hooks;
  if (unused) ++current_.unused_params;
  --bucket.pending;
  if (options_.record_timeline && bucket.pending == 0)
    current_.timeline[loc.bucket].ready = Clock::now();
}

void GradientBucketer::UseBucketSlotAsGradLocked(size_t index, const at::Tensor& view) {
  // From now on backward accumulates into the bucket. A non-contiguous
  // parameter keeps its own gradient (the slot is laid out contiguously).
  if (options_.gradient_as_bucket_view && params_[index].is_contiguous())
    params_[index].mutable_grad() = view;
}

bool GradientBucketer::PowerSgdStepLocked() const {
  // PyTorch's state.iter < start_powerSGD_iter: the steps before run the
  // plain all-reduce.
  return options_.comm_hook == CommHook::kPowerSgd && synced_steps_ >= options_.powersgd.start_iter;
}

void GradientBucketer::LaunchReadyBucketsLocked(bool from_hook) {
  const bool powersgd = PowerSgdStepLocked();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    // Before the engine can take it (its thread may start at once).
    if (options_.record_timeline) current_.timeline[next_bucket_].issued = Clock::now();
    if (b.compressed.defined()) {
      CompressBucket(b.flat, comm_->world_size(), b.compressed);
      b.work = AllReduceSum(*comm_, b.compressed);
    } else if (powersgd && b.powersgd != nullptr) {
      b.work = AllReduceSum(*comm_, b.powersgd->Compress(b.flat, powersgd_rng_));
    } else if (options_.comm_hook == CommHook::kPowerSgd) {
      // The hook's vanilla all-reduce (default._allreduce_fut): divide, sum.
      DivideByWorldSize(b.flat, comm_->world_size());
      b.work = AllReduceSum(*comm_, b.flat);
    } else {
      b.work = AllReduceSum(*comm_, b.flat);
    }
    current_.launches.push_back(
        BucketLaunchRecord{next_bucket_, Clock::now(), from_hook, grads_ready_});
    ++next_bucket_;
  }
}

absl::Status GradientBucketer::PrepareForward() {
  {
    absl::MutexLock l(&mu_);
    if (step_started_) {
      return absl::FailedPreconditionError(
          "GradientBucketer: the previous synced backward was not finalized; call "
          "FinalizeBackward() after backward() and before the next forward");
    }
    if (!options_.broadcast_buffers || !require_forward_param_sync_ || buffers_.empty() ||
        comm_->world_size() == 1) {
      return absl::OkStatus();
    }
  }
  const auto start = Clock::now();
  TRAINCTL_RETURN_IF_ERROR(BroadcastCoalesced(*comm_, buffers_, /*root=*/0));
  absl::MutexLock l(&mu_);
  pending_buffer_broadcast_ = Since(start);
  return absl::OkStatus();
}

absl::Status GradientBucketer::PrepareForBackward(const std::vector<at::Tensor>& outputs) {
  absl::MutexLock l(&mu_);
  if (!require_sync_ || !options_.find_unused_parameters) return absl::OkStatus();
  if (step_started_) {
    return absl::FailedPreconditionError(
        "GradientBucketer: PrepareForBackward() after backward already started, or the previous "
        "synced backward was not finalized");
  }
  StartStepLocked();
  // Walk the autograd graph from the outputs; a parameter whose accumulator
  // is not reached gets no gradient this step (PyTorch's
  // prepare_for_backward with find_unused_parameters).
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    std::shared_ptr<torch::autograd::Node> fn =
        out.grad_fn() ? out.grad_fn() : torch::autograd::impl::try_get_grad_accumulator(out);
    if (fn && seen.insert(fn.get()).second) stack.push_back(fn.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      torch::autograd::Node* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen.count(accumulators_[i].get()))
      MarkReadyLocked(i, /*unused=*/true, /*from_hook=*/false);
  }
  LaunchReadyBucketsLocked(/*from_hook=*/false);
  return absl::OkStatus();
}

absl::Status GradientBucketer::FinalizeBackward() {
  absl::MutexLock l(&mu_);
  const auto backward_end = Clock::now();
  if (!require_sync_) {
    // A no_sync micro-step: nothing was communicated, and the next forward
    // does not re-broadcast buffers (DDP's require_forward_param_sync).
    last_ = StepCommStats{};
    last_.step = synced_steps_;
    last_.num_params = params_.size();
    last_.backward_end = backward_end;
    require_forward_param_sync_ = false;
    return absl::OkStatus();
  }
  if (!step_started_) StartStepLocked();
  current_.backward_end = backward_end;

  absl::Status status = step_error_;
  if (status.ok()) status = HandleMissingGradsLocked();
  if (status.ok() && options_.launch_after_backward) LaunchReadyBucketsLocked(/*from_hook=*/false);
  if (status.ok()) status = WaitBucketsLocked();
  at::Tensor globally_used;
  if (status.ok() && options_.find_unused_parameters) {
    absl::StatusOr<at::Tensor> used = GloballyUsedLocked();
    if (used.ok()) {
      globally_used = *std::move(used);
    } else {
      status = used.status();
    }
  }
  current_.exposed_comm = Since(backward_end);

  if (status.ok()) {
    CopyBucketGradsLocked(globally_used);
    current_.synced = true;
    current_.step = ++synced_steps_;
    require_forward_param_sync_ = true;
  }
  // On error the launched all-reduces may still be running; the buffers they
  // write are kept alive by the engine, and the attempt is expected to end.
  last_ = current_;
  ResetStepLocked();
  return status;
}

absl::Status GradientBucketer::HandleMissingGradsLocked() {
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  if (missing.empty()) return absl::OkStatus();
  if (options_.find_unused_parameters) {
    for (size_t i : missing) MarkReadyLocked(i, /*unused=*/true, /*from_hook=*/false);
    LaunchReadyBucketsLocked(/*from_hook=*/false);
    return absl::OkStatus();
  }
  // Buckets holding these never launched, so the ranks would disagree on
  // what to all-reduce next; fail here instead of hanging.
  return absl::FailedPreconditionError(absl::StrCat(
      "GradientBucketer: ", missing.size(), " of ", params_.size(),
      " parameters received no gradient in this backward pass: ", DescribeParams(missing),
      ". Every parameter must take part in producing the loss, or set "
      "find_unused_parameters=true (the model has parameters unused in forward)"));
}

absl::Status GradientBucketer::WaitBucketsLocked() {
  // Every bucket's first all-reduce was issued before the first Q round is,
  // in bucket order, so the ranks issue the same collectives in one order.
  const bool powersgd = PowerSgdStepLocked();
  const bool timed = options_.record_timeline;
  if (timed) current_.wait_start = Clock::now();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    absl::Status st = b.work ? b.work->Wait() : absl::InternalError("bucket never launched");
    if (!st.ok()) return st;
    if (timed) {
      current_.timeline[i].waited = Clock::now();
      current_.timeline[i].ran = b.work->times();
    }
    if (b.compressed.defined()) DecompressBucket(b.compressed, b.flat);
    if (powersgd && b.powersgd != nullptr) {
      at::Tensor& q = b.powersgd->ComputeQ(comm_->world_size());
      if (q.numel() > 0) b.q_work = AllReduceSum(*comm_, q);
    }
  }
  if (!powersgd) {
    if (timed) current_.wait_end = Clock::now();
    return absl::OkStatus();
  }
  for (auto& b : buckets_) {
    if (b.powersgd == nullptr) continue;
    if (b.q_work != nullptr) TRAINCTL_RETURN_IF_ERROR(b.q_work->Wait());
    b.powersgd->Decompress(b.flat, comm_->world_size());
  }
  current_.powersgd = true;
  if (timed) current_.wait_end = Clock::now();
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> GradientBucketer::GloballyUsedLocked() {
  // Which parameters did any rank use? A parameter no rank used keeps its
  // gradient untouched, as in PyTorch.
  at::Tensor used = at::tensor(std::vector<int32_t>(locally_used_.begin(), locally_used_.end()),
                               at::TensorOptions().dtype(at::kInt));
  if (comm_->device() == CommDevice::kCuda) used = used.to(params_[0].device());
  TRAINCTL_RETURN_IF_ERROR(AllReduceSum(*comm_, used)->Wait());
  return used.cpu();
}

void GradientBucketer::CopyBucketGradsLocked(const at::Tensor& globally_used) {
  c10::NoGradGuard no_grad;
  for (auto& b : buckets_) {
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const size_t i = b.params[slot];
      if (globally_used.defined() && globally_used.data_ptr<int32_t>()[i] == 0) continue;
      at::Tensor& grad = params_[i].mutable_grad();
      if (grad.defined() && IsBucketSlot(grad, b.views[slot])) {
        continue;  // gradient_as_bucket_view: the average is already there
      } else if (grad.defined()) {
        grad.copy_(b.views[slot]);
      } else {
        grad = b.views[slot].clone();
      }
    }
  }
}

}  // namespace trainctl::dist

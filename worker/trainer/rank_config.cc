#include "worker/trainer/rank_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/spec_bounds.h"
#include "common/status_macros.h"

namespace trainctl::trainer {
namespace {

using rankproto::FlatConfig;
namespace rk = rankproto::run_keys;

absl::Status Bad(const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", why));
}

// Every job key is required: the worker writes the whole resolved spec
// (JobSpecToFlat), so a missing one is a broken config, not a default.

// Integer key checked against [lo, hi].
absl::StatusOr<int64_t> IntIn(const FlatConfig& c, const std::string& key, int64_t lo, int64_t hi) {
  TRAINCTL_ASSIGN_OR_RETURN(int64_t v, rankproto::GetInt(c, key));
  if (v < lo || v > hi) {
    std::string range =
        hi == INT64_MAX ? absl::StrCat(">= ", lo) : absl::StrCat("in [", lo, ", ", hi, "]");
    return Bad(key, absl::StrCat("must be ", range, ", got ", v));
  }
  return v;
}

// A run key the protocol lets the worker leave out (rank_protocol.h says what
// its absence means): `absent` then, else checked against [lo, hi].
absl::StatusOr<int64_t> OptionalIntIn(const FlatConfig& c, const std::string& key, int64_t absent,
                                      int64_t lo, int64_t hi) {
  if (c.find(key) == c.end()) return absent;
  return IntIn(c, key, lo, hi);
}

// Integer key in its spec_bounds.h range (the validator's, at submit).
absl::StatusOr<int64_t> BoundedInt(const FlatConfig& c, const std::string& key) {
  const spec_bounds::IntBound* b = spec_bounds::FindBound(key);
  if (b == nullptr) return absl::InternalError(absl::StrCat(key, ": no bound in spec_bounds.h"));
  return IntIn(c, key, b->lo, b->hi);
}

// Double key that must be finite and >= lo (and < hi when given).
absl::StatusOr<double> DoubleAtLeast(const FlatConfig& c, const std::string& key, double lo,
                                     double hi = INFINITY, bool hi_open = true) {
  TRAINCTL_ASSIGN_OR_RETURN(double v, rankproto::GetDouble(c, key));
  if (!std::isfinite(v) || v < lo || (hi_open ? v >= hi : v > hi)) {
    std::string range = std::isinf(hi) ? absl::StrCat(">= ", lo)
                                       : absl::StrCat("in [", lo, ", ", hi, hi_open ? ")" : "]");
    return Bad(key, absl::StrCat("must be ", range, ", got ", v));
  }
  return v;
}

// Double key that must be finite and > 0.
absl::StatusOr<double> Positive(const FlatConfig& c, const std::string& key) {
  TRAINCTL_ASSIGN_OR_RETURN(double v, rankproto::GetDouble(c, key));
  if (!std::isfinite(v) || v <= 0) return Bad(key, absl::StrCat("must be > 0, got ", v));
  return v;
}

// A key whose value is one of `names`; returns its index.
absl::StatusOr<int> OneOf(const FlatConfig& c, const std::string& key,
                          const std::vector<std::string>& names) {
  TRAINCTL_ASSIGN_OR_RETURN(std::string v, rankproto::GetString(c, key));
  for (size_t i = 0; i < names.size(); ++i) {
    if (v == names[i]) return static_cast<int>(i);
  }
  return Bad(key,
             absl::StrCat("unknown value '", v, "'; expected one of ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::string> RequiredNonEmpty(const FlatConfig& c, const std::string& key,
                                             const char* what = "empty") {
  TRAINCTL_ASSIGN_OR_RETURN(std::string v, rankproto::GetString(c, key));
  if (v.empty()) return Bad(key, what);
  return v;
}

absl::StatusOr<std::string> RequiredPath(const FlatConfig& c, const std::string& key) {
  return RequiredNonEmpty(c, key, "empty path");
}

absl::StatusOr<engine::ModelOptions> ParseModel(const FlatConfig& c) {
  engine::ModelOptions m;
  TRAINCTL_ASSIGN_OR_RETURN(m.name, rankproto::GetString(c, "model.name"));
  if (m.name == "mlp") {
    TRAINCTL_ASSIGN_OR_RETURN(m.mlp.input_dim, BoundedInt(c, "model.input_dim"));
    TRAINCTL_ASSIGN_OR_RETURN(m.mlp.output_dim, BoundedInt(c, "model.classes"));
    TRAINCTL_ASSIGN_OR_RETURN(std::string hidden, rankproto::GetString(c, "model.hidden"));
    for (absl::string_view part : absl::StrSplit(hidden, ',', absl::SkipWhitespace())) {
      int64_t width;
      if (!absl::SimpleAtoi(part, &width) || width < 1) {
        return Bad("model.hidden",
                   absl::StrCat("'", std::string(part),
                                "' is not a positive layer width (expected e.g. 64,32)"));
      }
      m.mlp.hidden_sizes.push_back(width);
    }
  } else if (m.name == "cnn") {
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.classes, BoundedInt(c, "model.classes"));
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.batch_norm, rankproto::GetBool(c, "model.batch_norm"));
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.conv1_channels, BoundedInt(c, "model.conv1_channels"));
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.conv2_channels, BoundedInt(c, "model.conv2_channels"));
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.hidden, BoundedInt(c, "model.hidden"));
    TRAINCTL_ASSIGN_OR_RETURN(m.cnn.image_size, BoundedInt(c, "model.image_size"));
  } else if (m.name == "torchscript") {
    TRAINCTL_ASSIGN_OR_RETURN(m.torchscript.path, RequiredPath(c, "model.path"));
  } else {
    return Bad("model.name",
               absl::StrCat("unknown model '", m.name, "'; expected mlp, cnn or torchscript"));
  }
  return m;
}

absl::StatusOr<DatasetSpec> ParseDataset(const FlatConfig& c, const std::string& prefix) {
  DatasetSpec d;
  d.key_prefix = prefix;
  auto key = [&](const char* field) { return absl::StrCat(prefix, ".", field); };
  TRAINCTL_ASSIGN_OR_RETURN(std::string format, rankproto::GetString(c, key("format")));
  if (format == "synthetic") {
    d.format = DatasetSpec::Format::kSynthetic;
    TRAINCTL_ASSIGN_OR_RETURN(d.length, IntIn(c, key("length"), 1, INT64_MAX));
    TRAINCTL_ASSIGN_OR_RETURN(d.size, IntIn(c, key("size"), 1, INT32_MAX));
    TRAINCTL_ASSIGN_OR_RETURN(d.classes, IntIn(c, key("classes"), 0, INT32_MAX));
    TRAINCTL_ASSIGN_OR_RETURN(d.target_dim, IntIn(c, key("target_dim"), 0, INT32_MAX));
    TRAINCTL_ASSIGN_OR_RETURN(int64_t seed, IntIn(c, key("seed"), 0, INT64_MAX));
    d.seed = static_cast<uint64_t>(seed);
  } else if (format == "idx") {
    d.format = DatasetSpec::Format::kIdx;
    TRAINCTL_ASSIGN_OR_RETURN(d.images, RequiredPath(c, key("images")));
    TRAINCTL_ASSIGN_OR_RETURN(d.labels, RequiredPath(c, key("labels")));
  } else if (format == "csv") {
    d.format = DatasetSpec::Format::kCsv;
    TRAINCTL_ASSIGN_OR_RETURN(d.path, RequiredPath(c, key("path")));
    TRAINCTL_ASSIGN_OR_RETURN(d.label_column, rankproto::GetString(c, key("label_column")));
    TRAINCTL_ASSIGN_OR_RETURN(d.header, rankproto::GetBool(c, key("header")));
  } else if (format == "tensors") {
    d.format = DatasetSpec::Format::kTensors;
    TRAINCTL_ASSIGN_OR_RETURN(d.path, RequiredPath(c, key("path")));
    TRAINCTL_ASSIGN_OR_RETURN(d.inputs_key, RequiredNonEmpty(c, key("inputs_key")));
    TRAINCTL_ASSIGN_OR_RETURN(d.targets_key, RequiredNonEmpty(c, key("targets_key")));
  } else {
    return Bad(key("format"), absl::StrCat("unknown format '", format,
                                           "'; expected synthetic, idx, csv or tensors"));
  }
  return d;
}

absl::StatusOr<TrainingOptions> ParseTraining(const FlatConfig& c) {
  TrainingOptions t;
  // data.*
  DataOptions& d = t.data;
  TRAINCTL_ASSIGN_OR_RETURN(d.batch_size, BoundedInt(c, "data.batch_size"));
  TRAINCTL_ASSIGN_OR_RETURN(d.shuffle, rankproto::GetBool(c, "data.shuffle"));
  TRAINCTL_ASSIGN_OR_RETURN(int64_t seed, IntIn(c, "data.seed", 0, INT64_MAX));
  d.seed = static_cast<uint64_t>(seed);
  TRAINCTL_ASSIGN_OR_RETURN(d.drop_last, rankproto::GetBool(c, "data.drop_last"));
  TRAINCTL_ASSIGN_OR_RETURN(int64_t workers, BoundedInt(c, "data.num_workers"));
  d.num_workers = static_cast<int>(workers);
  TRAINCTL_ASSIGN_OR_RETURN(d.pin_memory, rankproto::GetBool(c, "data.pin_memory"));

  // training.*
  TRAINCTL_ASSIGN_OR_RETURN(t.epochs, BoundedInt(c, "training.epochs"));
  TRAINCTL_ASSIGN_OR_RETURN(int loss, OneOf(c, "training.loss", {"cross_entropy", "mse"}));
  t.loss = loss == 0 ? LossKind::kCrossEntropy : LossKind::kMse;

  OptimizerOptions& o = t.optimizer;
  TRAINCTL_ASSIGN_OR_RETURN(int opt, OneOf(c, "training.optimizer.name", {"sgd", "adam", "adamw"}));
  o.kind = opt == 0 ? OptimizerKind::kSgd : opt == 1 ? OptimizerKind::kAdam : OptimizerKind::kAdamW;
  TRAINCTL_ASSIGN_OR_RETURN(o.lr, Positive(c, "training.optimizer.lr"));
  TRAINCTL_ASSIGN_OR_RETURN(o.weight_decay, DoubleAtLeast(c, "training.optimizer.weight_decay", 0));
  TRAINCTL_ASSIGN_OR_RETURN(o.momentum, DoubleAtLeast(c, "training.optimizer.momentum", 0, 1));
  TRAINCTL_ASSIGN_OR_RETURN(o.beta1, DoubleAtLeast(c, "training.optimizer.beta1", 0, 1));
  TRAINCTL_ASSIGN_OR_RETURN(o.beta2, DoubleAtLeast(c, "training.optimizer.beta2", 0, 1));
  TRAINCTL_ASSIGN_OR_RETURN(o.eps, Positive(c, "training.optimizer.eps"));

  LrScheduleOptions& s = t.lr_schedule;
  TRAINCTL_ASSIGN_OR_RETURN(int sched,
                            OneOf(c, "training.lr_schedule.name", {"constant", "step", "cosine"}));
  s.kind = sched == 0   ? ScheduleKind::kConstant
           : sched == 1 ? ScheduleKind::kStep
                        : ScheduleKind::kCosine;
  TRAINCTL_ASSIGN_OR_RETURN(s.warmup_steps, BoundedInt(c, "training.lr_schedule.warmup_steps"));
  TRAINCTL_ASSIGN_OR_RETURN(s.step_size,
                            IntIn(c, "training.lr_schedule.step_size", 0,
                                  spec_bounds::FindBound("training.lr_schedule.step_size")->hi));
  if (s.kind == ScheduleKind::kStep && s.step_size < 1) {
    return Bad("training.lr_schedule.step_size", "must be > 0 for the step schedule");
  }
  TRAINCTL_ASSIGN_OR_RETURN(s.gamma, rankproto::GetDouble(c, "training.lr_schedule.gamma"));
  if (!(s.gamma > 0 && s.gamma <= 1)) {
    return Bad("training.lr_schedule.gamma", absl::StrCat("must be in (0, 1], got ", s.gamma));
  }
  TRAINCTL_ASSIGN_OR_RETURN(s.min_lr, DoubleAtLeast(c, "training.lr_schedule.min_lr", 0));

  TRAINCTL_ASSIGN_OR_RETURN(t.grad_accumulation, BoundedInt(c, "training.grad_accumulation"));
  TRAINCTL_ASSIGN_OR_RETURN(t.max_grad_norm, DoubleAtLeast(c, "training.max_grad_norm", 0));
  TRAINCTL_ASSIGN_OR_RETURN(t.amp.enabled, rankproto::GetBool(c, "training.amp.enabled"));
  TRAINCTL_ASSIGN_OR_RETURN(int amp_dtype, OneOf(c, "training.amp.dtype", {"bf16", "fp16"}));
  t.amp.dtype = amp_dtype == 0 ? AmpDtype::kBFloat16 : AmpDtype::kFloat16;

  // ddp.*
  TRAINCTL_ASSIGN_OR_RETURN(t.ddp.bucket_cap_mb, Positive(c, "ddp.bucket_cap_mb"));
  TRAINCTL_ASSIGN_OR_RETURN(t.ddp.broadcast_buffers,
                            rankproto::GetBool(c, "ddp.broadcast_buffers"));
  TRAINCTL_ASSIGN_OR_RETURN(t.ddp.find_unused_parameters,
                            rankproto::GetBool(c, "ddp.find_unused_parameters"));
  // "unspecified": a spec resolved before ddp.comm_hook existed (no hook).
  TRAINCTL_ASSIGN_OR_RETURN(
      int hook, OneOf(c, "ddp.comm_hook",
                      {"none", "fp16_compress", "bf16_compress", "powersgd", "unspecified"}));
  constexpr dist::CommHook kHooks[] = {dist::CommHook::kNone, dist::CommHook::kFp16Compress,
                                       dist::CommHook::kBf16Compress, dist::CommHook::kPowerSgd,
                                       dist::CommHook::kNone};
  t.ddp.comm_hook = kHooks[hook];
  // Absent in a spec resolved before the field existed: the copying path
  // that such a job trained with until then.
  TRAINCTL_ASSIGN_OR_RETURN(t.ddp.gradient_as_bucket_view,
                            rankproto::GetBool(c, "ddp.gradient_as_bucket_view", false));
  // ddp.powersgd.*: a spec resolved before they existed keeps PyTorch's
  // defaults (those of dist::PowerSgdOptions, which job_defaults.cc writes).
  dist::PowerSgdOptions& ps = t.ddp.powersgd;
  auto has = [&](const char* key) { return c.find(key) != c.end(); };
  if (has("ddp.powersgd.rank")) {
    TRAINCTL_ASSIGN_OR_RETURN(ps.rank, BoundedInt(c, "ddp.powersgd.rank"));
  }
  if (has("ddp.powersgd.start_iter")) {
    TRAINCTL_ASSIGN_OR_RETURN(ps.start_iter, BoundedInt(c, "ddp.powersgd.start_iter"));
  }
  if (has("ddp.powersgd.min_compression_rate")) {
    TRAINCTL_ASSIGN_OR_RETURN(ps.min_compression_rate,
                              DoubleAtLeast(c, "ddp.powersgd.min_compression_rate", 1));
  }
  if (has("ddp.powersgd.use_error_feedback")) {
    TRAINCTL_ASSIGN_OR_RETURN(ps.use_error_feedback,
                              rankproto::GetBool(c, "ddp.powersgd.use_error_feedback"));
  }
  if (has("ddp.powersgd.warm_start")) {
    TRAINCTL_ASSIGN_OR_RETURN(ps.warm_start, rankproto::GetBool(c, "ddp.powersgd.warm_start"));
  }

  // checkpoint.* (run.checkpoint_dir wins over checkpoint.dir; see ParseRankConfig)
  TRAINCTL_ASSIGN_OR_RETURN(t.checkpoint.every_epochs, BoundedInt(c, "checkpoint.every_epochs"));
  TRAINCTL_ASSIGN_OR_RETURN(t.checkpoint.every_steps, BoundedInt(c, "checkpoint.every_steps"));
  TRAINCTL_ASSIGN_OR_RETURN(t.checkpoint.keep, BoundedInt(c, "checkpoint.keep"));
  TRAINCTL_ASSIGN_OR_RETURN(t.metrics_every_steps, BoundedInt(c, "metrics.every_steps"));

  // health.* (on_nan and max_rollbacks are the coordinator's)
  TRAINCTL_ASSIGN_OR_RETURN(t.health.min_loss_scale, DoubleAtLeast(c, "health.min_loss_scale", 0));
  TRAINCTL_ASSIGN_OR_RETURN(t.health.max_skipped_steps, BoundedInt(c, "health.max_skipped_steps"));
  // Optional: a spec resolved before the key existed keeps the default.
  if (c.find("health.divergence.factor") != c.end()) {
    TRAINCTL_ASSIGN_OR_RETURN(t.health.divergence_factor,
                              DoubleAtLeast(c, "health.divergence.factor", 0));
  }
  if (t.health.divergence_factor > 0 && t.health.divergence_factor <= 1) {
    return Bad("health.divergence.factor",
               absl::StrCat("must be 0 (off) or > 1, got ", t.health.divergence_factor));
  }
  TRAINCTL_ASSIGN_OR_RETURN(t.health.debug_nan_at_step,
                            IntIn(c, "health.debug_nan_at_step", 0, INT64_MAX));
  return t;
}

absl::StatusOr<RunOptions> ParseRun(const FlatConfig& c) {
  RunOptions r;
  TRAINCTL_ASSIGN_OR_RETURN(int64_t world, IntIn(c, rk::kWorldSize, 1, 1 << 20));
  r.world_size = static_cast<int>(world);
  TRAINCTL_ASSIGN_OR_RETURN(int64_t rank, IntIn(c, rk::kRank, 0, world - 1));
  r.rank = static_cast<int>(rank);
  TRAINCTL_ASSIGN_OR_RETURN(int64_t local_rank, IntIn(c, rk::kLocalRank, 0, 1 << 20));
  r.local_rank = static_cast<int>(local_rank);
  TRAINCTL_ASSIGN_OR_RETURN(int64_t local_world, IntIn(c, rk::kLocalWorldSize, 1, 1 << 20));
  r.local_world_size = static_cast<int>(local_world);
  TRAINCTL_ASSIGN_OR_RETURN(int device, OneOf(c, rk::kDevice, {"cpu", "cuda"}));
  r.device = device == 0 ? "cpu" : "cuda";
  std::string cuda_device = rankproto::GetString(c, rk::kCudaDevice, "");
  if (!cuda_device.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(int64_t idx, IntIn(c, rk::kCudaDevice, 0, 1024));
    r.cuda_device = static_cast<int>(idx);
  } else {
    r.cuda_device = r.local_rank;
  }
  TRAINCTL_ASSIGN_OR_RETURN(int backend, OneOf(c, rk::kBackend, {"", "gloo", "nccl"}));
  r.backend = backend == 0 ? "" : backend == 1 ? "gloo" : "nccl";
  if (r.backend.empty() && r.world_size > 1) {
    return Bad(rk::kBackend,
               absl::StrCat("missing; world size ", r.world_size, " needs gloo or nccl"));
  }
  if (r.backend == "nccl" && r.device != "cuda")
    return Bad(rk::kBackend, "nccl needs run.device=cuda");
  r.store_address = rankproto::GetString(c, rk::kStoreAddress, "");
  if (r.backend == "gloo" && r.rank != 0 && r.store_address.empty()) {
    return Bad(rk::kStoreAddress, "missing; every rank but 0 dials rank 0's store");
  }
  r.store_secret = rankproto::GetString(c, rk::kStoreSecret, "");
  if (r.backend == "gloo" && r.store_secret.size() < 16) {
    return Bad(rk::kStoreSecret,
               "missing or shorter than 16 characters; the daemon passes the attempt's secret");
  }
  TRAINCTL_ASSIGN_OR_RETURN(r.advertise_host, rankproto::GetString(c, rk::kAdvertiseHost));
  if (r.advertise_host.empty()) r.advertise_host = "127.0.0.1";  // the protocol's "": loopback
  // Absent or 0: any free port (rank_protocol.h); other ranks have none.
  TRAINCTL_ASSIGN_OR_RETURN(int64_t store_port, OptionalIntIn(c, rk::kStorePort, 0, 0, 65535));
  r.store_port = static_cast<int>(store_port);
  r.nccl_unique_id_hex = rankproto::GetString(c, rk::kNcclUniqueId, "");
  if (r.backend == "nccl" && r.nccl_unique_id_hex.empty()) return Bad(rk::kNcclUniqueId, "missing");
  // Identity for logs and checkpoint manifests; a rank started by hand may have none.
  r.job_id = rankproto::GetString(c, rk::kJobId, "");
  TRAINCTL_ASSIGN_OR_RETURN(r.attempt, OptionalIntIn(c, rk::kAttempt, 0, 0, INT32_MAX));
  TRAINCTL_ASSIGN_OR_RETURN(r.work_dir, rankproto::GetString(c, rk::kWorkDir));
  r.preempt_file = rankproto::GetString(c, rk::kPreemptFile, "");
  TRAINCTL_ASSIGN_OR_RETURN(int64_t fd, IntIn(c, rk::kStatusFd, -1, INT32_MAX));
  r.status_fd = static_cast<int>(fd);
  // The worker's --rank-timeout-s: the rank has no timeout of its own.
  TRAINCTL_ASSIGN_OR_RETURN(r.timeout_s, rankproto::GetDouble(c, rk::kTimeoutSeconds));
  if (!std::isfinite(r.timeout_s) || r.timeout_s < 1) {
    return Bad(rk::kTimeoutSeconds, absl::StrCat("must be >= 1, got ", r.timeout_s));
  }
  TRAINCTL_ASSIGN_OR_RETURN(int64_t threads, OptionalIntIn(c, "run.num_threads", 1, 1, 1024));
  r.num_threads = static_cast<int>(threads);
  TRAINCTL_ASSIGN_OR_RETURN(r.debug_step_sleep_ms,
                            OptionalIntIn(c, "run.debug.step_sleep_ms", 0, 0, 60000));
  for (absl::string_view item :
       absl::StrSplit(rankproto::GetString(c, rk::kSkipSteps, ""), ',', absl::SkipEmpty())) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(item, &step) || step < 0) {
      return Bad(rk::kSkipSteps,
                 absl::StrCat("'", item, "' is not a step number (a comma-separated list)"));
    }
    r.skip_steps.push_back(step);
  }
  std::sort(r.skip_steps.begin(), r.skip_steps.end());
  return r;
}

}  // namespace

BatchPlan KeepGlobalBatch(int64_t batch_size, int64_t grad_accumulation, int64_t max_world,
                          int64_t world) {
  BatchPlan p{batch_size, grad_accumulation, true};
  if (world <= 0 || world >= max_world) return p;
  const int64_t global = batch_size * grad_accumulation * max_world;
  const int64_t least = (grad_accumulation * max_world + world - 1) / world;
  for (int64_t acc = least; acc * world <= global; ++acc) {
    if (global % (acc * world) == 0) return BatchPlan{global / (acc * world), acc, true};
  }
  p.grad_accumulation = std::max<int64_t>(1, (grad_accumulation * max_world + world / 2) / world);
  p.exact = false;
  return p;
}

absl::StatusOr<RankConfig> ParseRankConfig(const FlatConfig& config) {
  RankConfig rc;
  TRAINCTL_ASSIGN_OR_RETURN(rc.model, ParseModel(config));
  TRAINCTL_ASSIGN_OR_RETURN(rc.train, ParseDataset(config, "data.train"));
  if (config.find("data.eval.format") != config.end()) {
    TRAINCTL_ASSIGN_OR_RETURN(DatasetSpec eval, ParseDataset(config, "data.eval"));
    rc.eval = std::move(eval);
  }
  TRAINCTL_ASSIGN_OR_RETURN(rc.training, ParseTraining(config));
  TRAINCTL_ASSIGN_OR_RETURN(rc.run, ParseRun(config));
  TRAINCTL_ASSIGN_OR_RETURN(
      bool keep_global,
      rankproto::GetBool(config, "elastic.keep_global_batch", /*no elastic section*/ false));
  if (keep_global) {
    TRAINCTL_ASSIGN_OR_RETURN(int64_t max_world, IntIn(config, "world_size", 1, 1 << 20));
    const BatchPlan plan = KeepGlobalBatch(
        rc.training.data.batch_size, rc.training.grad_accumulation, max_world, rc.run.world_size);
    if (plan.batch_size != rc.training.data.batch_size ||
        plan.grad_accumulation != rc.training.grad_accumulation) {
      rc.notes.push_back(absl::StrCat(
          "elastic.keep_global_batch: at ", rc.run.world_size, " of ", max_world, " ranks, batch ",
          plan.batch_size, " x accumulation ", plan.grad_accumulation, " per rank (was ",
          rc.training.data.batch_size, " x ", rc.training.grad_accumulation, ")",
          plan.exact ? "" : "; the global batch cannot be kept exactly, accumulation rounded"));
    }
    rc.training.data.batch_size = plan.batch_size;
    rc.training.grad_accumulation = plan.grad_accumulation;
  }

  CheckpointOptions& ck = rc.training.checkpoint;
  ck.dir = rankproto::GetString(config, rankproto::run_keys::kCheckpointDir, "");
  if (ck.dir.empty()) {
    TRAINCTL_ASSIGN_OR_RETURN(ck.dir, rankproto::GetString(config, "checkpoint.dir"));
  }
  if (ck.dir.empty()) ck.dir = rc.run.work_dir;
  // Without run.checkpoint_writer, rank 0 writes (a rank started by hand).
  TRAINCTL_ASSIGN_OR_RETURN(
      ck.writer,
      rankproto::GetBool(config, rankproto::run_keys::kCheckpointWriter, rc.run.rank == 0));
  ck.resume_from = rankproto::GetString(config, rankproto::run_keys::kResumeFrom, "");
  ck.resume_checksum = rankproto::GetString(config, rankproto::run_keys::kResumeChecksum, "");
  ck.resume_job_id = rankproto::GetString(config, rankproto::run_keys::kResumeJobId, "");
  ck.spec_hash = rankproto::GetString(config, rankproto::run_keys::kSpecHash, "");
  TRAINCTL_ASSIGN_OR_RETURN(
      ck.prune, rankproto::GetBool(config, rankproto::run_keys::kCheckpointPrune, true));
  ck.writer_tag = rankproto::GetString(config, rankproto::run_keys::kCheckpointWriterTag, "");
  if (!ck.writer_tag.empty() && CheckpointWriterTag(ck.writer_tag) != ck.writer_tag) {
    return Bad(rankproto::run_keys::kCheckpointWriterTag, "at most 128 of [A-Za-z0-9._-]");
  }
  if (rc.training.amp.enabled && rc.training.amp.dtype == AmpDtype::kFloat16 &&
      rc.run.device != "cuda") {
    return Bad("training.amp.dtype", "fp16 autocast needs run.device=cuda; use bf16 on CPU");
  }
  if (rc.training.loss == LossKind::kCrossEntropy) {
    if (rc.train.format == DatasetSpec::Format::kSynthetic && rc.train.classes == 0) {
      return Bad("data.train.classes", "0 (regression targets) but training.loss is cross_entropy");
    }
  }
  return rc;
}

}  // namespace trainctl::trainer

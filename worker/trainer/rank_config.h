// RankConfig: everything one rank process needs, as plain typed structs,
// parsed from the flat `key=value` config the worker daemon writes
// (worker/protocol/rank_protocol.h). Job keys are the job.yaml paths of the
// resolved spec (see JobSpecToFlat in common/jobspec/job_spec.cc); run keys
// start with "run.".
//
// Callers: rank_main.cc parses the config once at start-up and hands the
// sections to the dataset loaders (datasets.h), CreateModel and the Trainer.
// Tests build the structs directly.
//
// Defaults live in one place, ResolveJobSpecDefaults (common/jobspec): the
// worker writes every key of the resolved spec, and this parser has no
// defaults of its own. A missing job key is an error naming it ("training.
// epochs: missing"); the only absences with a meaning are structural (no
// data.eval.* = no eval split, no elastic.* = not elastic) and the run keys
// rank_protocol.h marks optional (store_port, store_address, store_secret,
// nccl_unique_id, resume_*, skip_steps, cuda_device: the local rank,
// checkpoint_writer: rank 0, job_id / attempt, num_threads: 1 and the
// run.debug.* test hooks). Tests start from a resolved spec's keys
// (common/jobspec/testdata/resolved_defaults.conf, checked by job_spec_test).
// Field initialisers below serve tests that build the structs directly;
// ParseRankConfig sets every field from the config.
//
// Errors: InvalidArgument naming the key and the reason ("training.loss:
// unknown value 'l1'; expected one of cross_entropy, mse").
//
// Threading: plain value types and a stateless function; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/engine/model.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::trainer {

// One dataset split (data.train or data.eval).
struct DatasetSpec {
  enum class Format { kSynthetic, kIdx, kCsv, kTensors };
  std::string key_prefix;  // "data.train" or "data.eval", for error messages
  Format format = Format::kSynthetic;
  // synthetic
  int64_t length = 0;
  int64_t size = 0;
  int64_t classes = 0;     // 0: regression targets
  int64_t target_dim = 1;  // regression target width
  uint64_t seed = 0;
  // idx
  std::string images;
  std::string labels;
  // csv and tensors
  std::string path;
  std::string label_column;             // csv: header name, 0-based index as text, or "" = last
  bool header = true;                   // csv
  std::string inputs_key = "inputs";    // tensors
  std::string targets_key = "targets";  // tensors
};

struct DataOptions {
  int64_t batch_size = 32;  // per rank, per micro-batch
  bool shuffle = true;
  uint64_t seed = 0;  // sampler seed (epoch e uses seed + e); also seeds model init
  bool drop_last = false;
  int num_workers = 0;
  bool pin_memory = true;
};

enum class LossKind { kCrossEntropy, kMse };
enum class OptimizerKind { kSgd, kAdam, kAdamW };
enum class ScheduleKind { kConstant, kStep, kCosine };
enum class AmpDtype { kBFloat16, kFloat16 };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 0.001;
  double weight_decay = 0;
  double momentum = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

struct LrScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // linear warm-up from 0 to lr, every schedule
  int64_t step_size = 0;     // kStep: period in optimizer steps (> 0)
  double gamma = 0.1;        // kStep: factor in (0, 1]
  double min_lr = 0;         // kCosine: lr at the last step
};

struct AmpOptions {
  bool enabled = false;
  AmpDtype dtype = AmpDtype::kBFloat16;
};

struct CheckpointOptions {
  // Where this host's writer rank puts checkpoints and the final model.pt; "" = nowhere.
  std::string dir;
  int64_t every_epochs = 1;  // 0: only after the last epoch
  int64_t every_steps = 0;   // > 0: also every N optimizer steps inside an epoch
  int64_t keep = 2;          // >= 1
  // The rank deletes all but `keep` of its checkpoints itself
  // (run.checkpoint_prune; false under a worker daemon: the coordinator
  // decides).
  bool prune = true;
  // Per-host copies: the writer tag in file names (run.checkpoint_writer_tag).
  std::string writer_tag;
  bool writer = false;  // this rank writes (run.checkpoint_writer)
  // The coordinator's record to resume from (run.resume_*); "" = fresh start.
  std::string resume_from;
  std::string resume_checksum;
  std::string resume_job_id;
  std::string spec_hash;  // run.spec_hash, written into each manifest
};

// Numerical health (job.yaml health.*; docs/failures.md). The trainer only
// detects and reports (FailureKind::kNan); whether the job rolls back or
// fails is the coordinator's decision (health.on_nan, health.max_rollbacks).
struct HealthOptions {
  // fp16 loss scaling: a scale below this is a collapse; 0 = never.
  double min_loss_scale = 1e-4;
  // fp16 loss scaling: more than this many skipped steps in a row is a
  // collapse; 0 = never.
  int64_t max_skipped_steps = 50;
  // A "train" window's loss (mean over every rank) above this many times the
  // running median (DivergenceDetector) is a divergence; 0 = never.
  double divergence_factor = 1e4;
  // Test hook (health.debug_nan_at_step): rank 0 multiplies its loss by NaN
  // at this global step; 0 = never.
  int64_t debug_nan_at_step = 0;
};

// The training loop's options (everything but the model and the data).
struct TrainingOptions {
  int64_t epochs = 1;
  LossKind loss = LossKind::kCrossEntropy;
  OptimizerOptions optimizer;
  LrScheduleOptions lr_schedule;
  int64_t grad_accumulation = 1;  // micro-batches per optimizer step
  double max_grad_norm = 0;       // 0 = no clipping
  AmpOptions amp;
  DataOptions data;
  dist::GradientBucketerOptions ddp;
  CheckpointOptions checkpoint;
  int64_t metrics_every_steps = 20;  // optimizer steps per "train" metric
  HealthOptions health;
};

// The run.* keys.
struct RunOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string device;  // "cpu" or "cuda"
  int cuda_device = 0;
  std::string backend;  // "gloo", "nccl", or "" (no communicator; world size 1 only)
  std::string store_address;
  std::string advertise_host;  // "" in the config: 127.0.0.1
  int store_port = 0;          // rank 0: port to host the store on (0 = any free one)
  std::string store_secret;    // gloo: the attempt's rendezvous secret
  std::string nccl_unique_id_hex;
  std::string job_id;
  int64_t attempt = 0;
  std::string work_dir;
  // run.preempt_file ("" = none; TrainerSetup::preempt_file).
  std::string preempt_file;
  int status_fd = -1;    // -1: no status pipe (status lines go nowhere)
  double timeout_s = 0;  // run.timeout_s: the worker's --rank-timeout-s
  // Intra-op threads per rank (run.num_threads; absent: 1, ranks share a host).
  int num_threads = 1;
  // Test hook (run.debug.step_sleep_ms): sleep this long after every optimizer
  // step, so tests can interrupt a run at a known point. 0 in production.
  int64_t debug_step_sleep_ms = 0;
  // Global steps to skip (run.skip_steps, sorted): steps earlier attempts
  // failed at with a NaN, which this attempt's rollback passes over.
  std::vector<int64_t> skip_steps;
};

struct RankConfig {
  engine::ModelOptions model;
  DatasetSpec train;
  std::optional<DatasetSpec> eval;
  TrainingOptions training;
  RunOptions run;
  // Said once in the rank's log (e.g. an elastic batch adjustment).
  std::vector<std::string> notes;
};

// Elastic jobs with elastic.keep_global_batch: at `world` ranks of at most
// `max_world`, the per-rank batch and accumulation that keep the global
// batch (batch × accumulation × max_world). The smallest accumulation of at
// least accumulation × max_world / world whose batch divides exactly;
// `exact` false (batch kept, accumulation rounded) when none does.
struct BatchPlan {
  int64_t batch_size = 0;
  int64_t grad_accumulation = 0;
  bool exact = true;
};
BatchPlan KeepGlobalBatch(int64_t batch_size, int64_t grad_accumulation, int64_t max_world,
                          int64_t world);

// Parses and validates the whole config.
absl::StatusOr<RankConfig> ParseRankConfig(const rankproto::FlatConfig& config);

}  // namespace trainctl::trainer

// The contract between a worker daemon and the rank processes it launches.
//
// A rank process holds LibTorch and nothing of gRPC or of trainctl's
// protobuf API (so the two libraries' protobuf copies never meet, and a
// crashing rank cannot take RPC state with it). It learns everything from:
//
//  * a config file (argv: `trainctl-rank --config PATH`): `key=value` lines.
//    Job keys are the job.yaml paths of the resolved spec ("data.batch_size",
//    "model.name", "model.hidden" as "64,32"); run keys start with "run."
//    (run.rank, run.world_size, run.store_address, ... see RunKeys below);
//  * the torchrun environment contract, set as well: RANK, LOCAL_RANK,
//    WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
//    CUDA_VISIBLE_DEVICES on GPU hosts).
//
// It reports on a status pipe (file descriptor in run.status_fd), one line
// per message, never blocking training for long (the daemon reads it
// continuously):
//
//   rendezvous HOST:PORT          rank 0, CPU: where its store listens
//   ready                         communicator initialised
//   progress EPOCH GLOBAL_STEP [k=v ...]
//                                 heartbeat of training progress; the k=v
//                                 words (RankHeartbeat) come from the
//                                 engine's reporter thread about once a
//                                 second, also while a collective blocks
//   metric k=v k=v ...            see RankMetric
//   checkpoint EPOCHS STEP BYTES CHECKSUM CONSUMED PATH
//                                 a checkpoint writer finished a checkpoint
//                                 (after its atomic rename); PATH last
//   model PATH                    rank 0 exported the final model (after
//                                 its last epoch, before it exits 0)
//   error KIND[:STEP] MESSAGE     before a non-zero exit: why (KIND below);
//                                 STEP (nan only): the optimizer step at fault
//
// stdout/stderr are captured by the daemon as the rank's logs. The daemon
// stops a rank with SIGTERM, then SIGKILL after a grace period.
//
// Plain C++ and abseil; used by trainctl-worker and trainctl-rank.
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainctl::rankproto {

using FlatConfig = std::map<std::string, std::string>;

// Keys the daemon sets besides the job's own.
namespace run_keys {
inline constexpr char kJobId[] = "run.job_id";
inline constexpr char kAttempt[] = "run.attempt";
inline constexpr char kRank[] = "run.rank";
inline constexpr char kLocalRank[] = "run.local_rank";
inline constexpr char kWorldSize[] = "run.world_size";
inline constexpr char kLocalWorldSize[] = "run.local_world_size";
inline constexpr char kNodeRank[] = "run.node_rank";
// "cpu" or "cuda" (resolved from device: auto).
inline constexpr char kDevice[] = "run.device";
// CUDA device index the rank uses (after CUDA_VISIBLE_DEVICES), "" on CPU.
inline constexpr char kCudaDevice[] = "run.cuda_device";
// "gloo" or "nccl" (resolved from backend: auto).
inline constexpr char kBackend[] = "run.backend";
// Gloo: host:port of rank 0's store ("" for rank 0 itself, which hosts it).
inline constexpr char kStoreAddress[] = "run.store_address";
// Host rank 0 advertises its store on (rank 0 only).
inline constexpr char kAdvertiseHost[] = "run.advertise_host";
// Port rank 0 hosts its store on (rank 0 only; 0 or absent: a free port,
// reported back with a `rendezvous` status line). The daemon reserves the
// port beforehand so that every rank can start at once.
inline constexpr char kStorePort[] = "run.store_port";
// Gloo: the attempt's rendezvous secret (every rank; the store refuses a
// connection that does not prove it). Only in the config file, which
// WriteConfigFile makes readable by its owner alone; never on argv or in the
// environment.
inline constexpr char kStoreSecret[] = "run.store_secret";
// NCCL: the 128-byte unique id, hex encoded.
inline constexpr char kNcclUniqueId[] = "run.nccl_unique_id";
// Directory for this rank's scratch files.
inline constexpr char kWorkDir[] = "run.work_dir";
// Preemption (docs/queues.md): the daemon makes this file before the
// SIGTERM of a preemption. A rank that finds it when its stop flag is
// raised does not stop at once: the ranks agree on a step (the next
// multiple of kPreemptAgreeEverySteps, or the epoch's end), the checkpoint
// writers write a checkpoint there, and every rank stops. Unset = every
// stop is immediate.
inline constexpr char kPreemptFile[] = "run.preempt_file";
// Checkpoints (shared by the job's ranks on one host).
inline constexpr char kCheckpointDir[] = "run.checkpoint_dir";
// Absolute directory rank 0 writes TensorBoard event files to; unset = none.
inline constexpr char kTensorBoardDir[] = "run.tensorboard_dir";
// "true" for the rank that writes this host's checkpoints (the first rank on
// each host, or only rank 0 when checkpoint.shared is set).
inline constexpr char kCheckpointWriter[] = "run.checkpoint_writer";
// A per-host copy's writer tag (the worker id) in its file names; unset for
// the one copy of a shared directory.
inline constexpr char kCheckpointWriterTag[] = "run.checkpoint_writer_tag";
// "false": the rank never deletes checkpoints (the coordinator decides from
// its records and tells the worker daemon); unset or "true": the rank keeps
// checkpoint.keep itself (a rank started by hand).
inline constexpr char kCheckpointPrune[] = "run.checkpoint_prune";
// The coordinator's record to resume from ("" = fresh start): the file on
// rank 0's host, its checksum and the job that wrote it. Rank 0 reads and
// verifies it and broadcasts it to the other ranks.
inline constexpr char kResumeFrom[] = "run.resume_from";
inline constexpr char kResumeChecksum[] = "run.resume_checksum";
inline constexpr char kResumeJobId[] = "run.resume_job_id";
// Hash of the spec fields that shape model and optimizer state (the
// checkpoint manifest's spec_hash).
inline constexpr char kSpecHash[] = "run.spec_hash";
// File descriptor of the status pipe.
inline constexpr char kStatusFd[] = "run.status_fd";
// Optimizer steps to skip ("57,63"; NaN rollbacks: Attempt.skip_steps).
inline constexpr char kSkipSteps[] = "run.skip_steps";
// Seconds a collective or the rendezvous may take before it is an error.
inline constexpr char kTimeoutSeconds[] = "run.timeout_s";
}  // namespace run_keys

// Why a rank exits non-zero (the `error` line), mapped by the daemon to
// trainctl.v1.FailureKind.
enum class ErrorKind {
  // Bad configuration or data: restarting cannot help.
  kConfig,
  // A collective failed or timed out (a peer died).
  kCollective,
  // The rendezvous did not complete.
  kRendezvous,
  // A checkpoint write ran out of disk space.
  kDiskFull,
  // A data file is missing, unreadable or malformed.
  kData,
  // An allocation failed (std::bad_alloc, RLIMIT_AS, CUDA out of memory).
  kOutOfMemory,
  // The all-reduced gradients were NaN/Inf, or the AMP loss scale collapsed
  // (numerical health; the error line carries the step).
  kNan,
  // The checkpoint to resume from was missing, unreadable or corrupt.
  kResume,
  // Anything else (an exception while training).
  kExit,
};
const char* ErrorKindName(ErrorKind k);

// One metric report. Fields mirror trainctl.v1.MetricPoint.
struct RankMetric {
  // "train", "epoch_end" or "eval" (a command job's evaluation).
  std::string kind = "train";
  int32_t epoch = 0;
  int64_t step = 0;
  int64_t steps_per_epoch = 0;
  double loss = 0;
  double lr = 0;
  double samples_per_sec = 0;
  double data_ms = 0;
  double compute_ms = 0;
  double comm_ms = 0;
  double loss_scale = 0;
  int64_t skipped_steps = 0;
  int64_t peak_memory_bytes = 0;
  int64_t samples_seen = 0;
  bool has_eval = false;
  double eval_loss = 0;
  double eval_accuracy = 0;
  int64_t eval_samples = 0;
  // Custom scalars, `s.NAME=VALUE` on the line (MetricPoint.scalars): NAME
  // 1-64 of [A-Za-z0-9_./-] (IsScalarName), at most kMaxScalars, finite.
  std::vector<std::pair<std::string, double>> scalars;
  // Which numeric fields after kind, epoch and step the report carries, by
  // their keys on the line ("loss", "eval_accuracy"). nullopt: every one
  // (eval_* when has_eval), as the engine's reports are. ParseStatusLine
  // sets the keys the line had: a command job's trainctl.report names only
  // what it was given, and an absent field is not a 0.
  std::optional<std::set<std::string, std::less<>>> reported;
  // Whether field `key` was reported (see `reported`).
  bool Reports(std::string_view key) const;
};
inline constexpr size_t kMaxScalars = 32;
bool IsScalarName(std::string_view name);

// A checkpoint a rank wrote.
struct CheckpointNote {
  int64_t epochs_done = 0;
  int64_t global_step = 0;
  int64_t epoch_consumed = 0;  // > 0: taken inside epoch `epochs_done`
  int64_t size_bytes = 0;
  std::string checksum;
  std::string path;
};

// What a training rank is doing, for hang and straggler detection (the
// optional k=v words of a `progress` line). Unknown keys are ignored, so
// either side may add some.
struct RankHeartbeat {
  bool present = false;     // the line had k=v words
  std::string phase;        // phase=init|train|eval|checkpoint
  int64_t seq = 0;          // seq=: collectives issued so far
  int64_t waiting_seq = 0;  // wait=: the collective the rank is blocked in, 0 = none
  std::string op;           // op=allreduce|broadcast|barrier|none: waiting_seq's, else seq's
  int64_t op_step = 0;      // op_step=: optimizer step (1-based) of that op
  int32_t op_bucket = -1;   // bucket=: gradient bucket of an all-reduce, -1 otherwise
  int64_t waiting_ms = 0;   // wait_ms=: how long it has been blocked
  double p99_step_ms = 0;   // p99_ms=: recent step-time 99th percentile
  double compute_ms = 0;    // compute_ms=: recent mean compute time per step
  // A command job's Python rank (its start-up hook,
  // python/trainctl/_rank_boot/sitecustomize.py) sends these instead of the
  // collective words:
  int64_t stack_moves = 0;    // moves=: times its main thread's stack changed
  int64_t torch_wait_ms = 0;  // torch_ms=: how long its main thread has been in torch's
                              // collective/autograd code, 0 = not there
};

struct StatusMessage {
  enum class Type { kRendezvous, kReady, kProgress, kMetric, kError, kCheckpoint, kModel };
  Type type = Type::kReady;
  std::string address;                      // kRendezvous
  int32_t epoch = 0;                        // kProgress
  RankHeartbeat heartbeat;                  // kProgress
  RankMetric metric;                        // kMetric
  ErrorKind error_kind = ErrorKind::kExit;  // kError
  std::string message;                      // kError
  // kProgress: the global step; kError: the step at fault (kNan), else 0.
  int64_t step = 0;
  CheckpointNote checkpoint;  // kCheckpoint
  std::string path;           // kModel
};

// --- config file --------------------------------------------------------------
// "key=value\n" per entry, sorted; newlines and backslashes in values escaped.
std::string FormatConfig(const FlatConfig& config);
// INVALID_ARGUMENT naming the line for a malformed one.
absl::StatusOr<FlatConfig> ParseConfig(std::string_view text);
absl::Status WriteConfigFile(const std::string& path, const FlatConfig& config);
absl::StatusOr<FlatConfig> ReadConfigFile(const std::string& path);
// The config from an fd the daemon opened and the rank inherited (read from
// its current offset to EOF; the fd stays open). The daemon hands rank.conf
// over this way so that a rank needs no permission on the file: it runs as
// another user (--rank-user) than the daemon that owns it.
absl::StatusOr<FlatConfig> ReadConfigFd(int fd);

// Typed look-ups with errors that name the key.
absl::StatusOr<std::string> GetString(const FlatConfig& c, const std::string& key);
absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key);
absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key);
absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key);
// Value or `fallback` when the key is absent (a present but bad value is an error).
absl::StatusOr<int64_t> GetInt(const FlatConfig& c, const std::string& key, int64_t fallback);
absl::StatusOr<double> GetDouble(const FlatConfig& c, const std::string& key, double fallback);
absl::StatusOr<bool> GetBool(const FlatConfig& c, const std::string& key, bool fallback);
std::string GetString(const FlatConfig& c, const std::string& key, const std::string& fallback);

// --- status lines ---------------------------------------------------------------
// Each returns one line, newline included.
std::string FormatRendezvous(const std::string& address);
std::string FormatReady();
std::string FormatProgress(int32_t epoch, int64_t global_step);
std::string FormatProgress(int32_t epoch, int64_t global_step, const RankHeartbeat& hb);
std::string FormatMetric(const RankMetric& m);
// `step` > 0 is sent as KIND:STEP (the step a kNan failure happened at).
std::string FormatError(ErrorKind kind, std::string_view message, int64_t step = 0);
std::string FormatCheckpoint(const CheckpointNote& c);
std::string FormatModel(const std::string& path);
// Parses one line (with or without its newline).
absl::StatusOr<StatusMessage> ParseStatusLine(std::string_view line);

// Writes a whole line to a file descriptor (retrying on EINTR/partial writes).
// Used by the rank process; false when the daemon end is closed.
bool WriteLine(int fd, const std::string& line);

}  // namespace trainctl::rankproto

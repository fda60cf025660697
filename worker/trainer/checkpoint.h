// Checkpoints: the state a restarted attempt needs to continue training as if
// nothing had happened, in one file per checkpoint.
//
// A checkpoint holds a manifest (format version, the job id and attempt that
// wrote it, a hash of the spec fields that shape model and optimizer state),
// the model's parameters and buffers (by name), the optimizer state
// (torch::optim's own serialization), the loss scaler, the training position
// (epochs completed, global optimizer step, skipped steps, and how many
// positions of the next epoch's global order were consumed), the sampler's
// seed and world size, the CPU RNG state, and under comm_hook powersgd
// PowerSGD's state with every rank's error feedback (powersgd_checkpoint.h;
// gathered by every rank at each checkpoint point, Trainer::CheckpointNow).
// A checkpoint taken after an epoch has consumed 0 and a resumed run starts
// at the next epoch (the DistributedSampler's order is a function of seed +
// epoch); one taken inside an epoch (checkpoint.every_steps) lets a resumed
// run continue that epoch where it stopped, at any world size
// (DistributedSampler::RemainingIndices).
//
// Identity: the file is named for its job (<dir>/<job>.ckpt-epoch-NNNNNN.pt,
// NNNNNN = epochs completed; <dir>/<job>.ckpt-epoch-NNNNNN-CCCCCCCCCC.pt
// inside an epoch, CCCCCCCCCC = positions consumed; a per-host copy adds
// ".<worker id>" before ".pt", so hosts sharing one directory never write
// one path) and `keep` deletes only that job's files. Under a worker
// daemon `keep` is 0: the coordinator decides from its records which files
// go (fencing, docs/failures.md), never a rank on its own. The
// writer returns the file's size and CRC-32 checksum; the coordinator records
// them, and a resume reads exactly the recorded file, verifies the checksum
// and the manifest (job, spec hash) before loading anything. Nothing here ever
// picks "the newest file in a directory" for a resume.
//
// Writing: the archive is serialised in memory (so its size is known), written
// to a unique temporary file, fsync'ed, renamed over the final name, and the
// directory fsync'ed: a crash at any point leaves either the old set of
// checkpoints or the new one, never a torn file. A failed write removes its
// temporary file and says why: ENOSPC/EDQUOT come back as RESOURCE_EXHAUSTED
// naming the path, the errno text, the bytes needed and the bytes free.
//
// Callers: the Trainer (write after an epoch on each host's writer rank;
// read and broadcast at start-up), tests.
//
// Threading: stateless functions; callers serialise writes to one directory.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_env.h"
#include "worker/engine/model.h"
#include "worker/trainer/powersgd_checkpoint.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace trainctl::trainer {

struct TrainingPosition {
  int64_t epochs_done = 0;    // the next epoch to run
  int64_t global_step = 0;    // optimizer steps taken (or skipped) so far
  int64_t skipped_steps = 0;  // steps skipped on inf/NaN gradients
  double loss_scale = 1.0;
  int64_t scaler_growth_tracker = 0;
  uint64_t data_seed = 0;  // the sampler seed the run used
  int64_t world_size = 1;  // of the attempt that wrote it (informational)
  // Positions of epoch `epochs_done`'s global order (the sampler's
  // permutation for seed + epoch, before padding) already trained on; 0 at
  // an epoch boundary.
  int64_t epoch_consumed = 0;
};

// Who wrote a checkpoint and for which model/optimizer layout.
struct CheckpointManifest {
  std::string job_id;     // the job that wrote it ("" in tests)
  int64_t attempt = 0;    // its attempt
  std::string spec_hash;  // hash of the spec fields that shape the state ("" = unchecked)
  // A per-host copy's writer (the worker id, in the file name); "" for the
  // one copy of a shared directory or a rank started by hand.
  std::string writer;
};

// What WriteCheckpoint produced.
struct WrittenCheckpoint {
  std::string path;
  int64_t size_bytes = 0;
  std::string checksum;  // ChecksumOf(file contents)
  // Older checkpoints past `keep` that could not be deleted, with why
  // (the write itself succeeded; the caller logs these).
  std::vector<std::string> not_pruned;
};

// "<dir>/<job_id>.ckpt-epoch-NNNNNN.pt" ("<dir>/ckpt-epoch-NNNNNN.pt" for an
// empty id); with epoch_consumed > 0 "...-NNNNNN-CCCCCCCCCC.pt"; with a
// writer "....<writer>.pt".
std::string CheckpointPath(const std::string& dir, const std::string& job_id, int64_t epochs_done,
                           int64_t epoch_consumed = 0, const std::string& writer = "");

// Complete checkpoints of `job_id` in `dir` (any writer), oldest first by
// (epochs done, positions consumed) (temporary files and other jobs' files
// ignored). An absent directory holds none.
std::vector<std::string> ListCheckpoints(const std::string& dir, const std::string& job_id);

// The newest complete checkpoint of `job_id` in `dir`, or "" (tests).
std::string LatestCheckpoint(const std::string& dir, const std::string& job_id);

// "crc32:xxxxxxxx" of `bytes` (zlib's CRC-32).
std::string ChecksumOf(std::string_view bytes);

// Creates `dir` if needed and checks that a file can be created in it.
// FAILED_PRECONDITION naming the directory and the reason when not (a
// configuration error: retrying cannot help).
absl::Status CheckCheckpointDir(const std::string& dir);

// Writes a checkpoint atomically (creating `dir`), then, with keep > 0,
// deletes all but the newest `keep` of this job's checkpoints by this
// writer (keep 0 deletes nothing). RESOURCE_EXHAUSTED when the disk
// is full (see above), FAILED_PRECONDITION when the directory cannot be
// created, INTERNAL on other I/O errors; no temporary file is left behind.
// `powersgd` (may be null) is saved beside the model.
absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(
    const std::string& dir, int64_t keep, const CheckpointManifest& manifest,
    const TrainingPosition& position, engine::Model& model, torch::optim::Optimizer& optimizer,
    FileEnv* env = nullptr, const dist::PowerSgdState* powersgd = nullptr);

// Reads the whole file at `path`; with a non-empty `expected_checksum`,
// DATA_LOSS when the contents do not match it.
absl::StatusOr<std::string> ReadCheckpointBytes(const std::string& path,
                                                const std::string& expected_checksum);

// Loads a checkpoint's bytes (`name` is used in errors) into `model` (in place,
// so the optimizer's tensors stay valid) and `optimizer`, and returns the
// position. INVALID_ARGUMENT naming the file when it is unreadable, was
// written by another job than `expect.job_id` (when set) or for another spec
// (`expect.spec_hash`, when both are set), or for another model. Tensors are
// mapped to `device` (where the model and the optimizer state live).
// `powersgd` (may be null): reads PowerSGD's state for powersgd->rank into
// it; its absence or a malformed entry never fails the load.
absl::StatusOr<TrainingPosition> LoadCheckpoint(const std::string& bytes, const std::string& name,
                                                const CheckpointManifest& expect,
                                                engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device,
                                                PowerSgdCheckpointRead* powersgd = nullptr);

// ReadCheckpointBytes + LoadCheckpoint without expectations (tests).
absl::StatusOr<TrainingPosition> ReadCheckpoint(const std::string& path, engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device);

// fsyncs the file at `path` and its directory (after a rename into place), so
// the file survives a machine crash. Used for the exported final model.
absl::Status SyncFileAndDir(const std::string& path);

}  // namespace trainctl::trainer

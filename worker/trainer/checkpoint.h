// Checkpoints: the state a restarted attempt needs to continue training as if
// nothing had happened, in one file per checkpoint that rank 0 writes
// atomically and every rank reads.
//
// A checkpoint holds the model's parameters and buffers (by name), the
// optimizer state (torch::optim's own serialization), the loss scaler, the
// training position (epochs completed, global optimizer step, skipped steps),
// the sampler's seed and world size, and the CPU RNG state. Positions are
// epoch boundaries: a checkpoint is taken after an epoch, and a resumed run
// starts at the next epoch (the DistributedSampler's order is a function of
// seed + epoch, so the sampler position is the epoch number).
//
// Files: <dir>/ckpt-epoch-NNNNNN.pt, NNNNNN = epochs completed. Writing goes to
// a ".tmp" file that is fsync'ed, renamed over the final name, and the
// directory fsync'ed, so a crash at any point leaves either the old set of
// checkpoints or the new one, never a torn file. The newest `keep` files stay.
//
// Callers: the Trainer (write after an epoch on rank 0; read at start-up on
// every rank), rank_main.cc (find the newest checkpoint to resume from).
//
// Threading: stateless functions; callers serialise writes to one directory.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/model.h"

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
};

// "<dir>/ckpt-epoch-NNNNNN.pt".
std::string CheckpointPath(const std::string& dir, int64_t epochs_done);

// Complete checkpoints in `dir`, oldest first (temporary files ignored). An
// absent directory holds none.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// The newest complete checkpoint, or "" when there is none.
std::string LatestCheckpoint(const std::string& dir);

// Writes a checkpoint atomically (creating `dir`), then deletes all but the
// newest `keep`. Internal on I/O errors.
absl::Status WriteCheckpoint(const std::string& dir, int64_t keep, const TrainingPosition& position,
                             engine::Model& model, torch::optim::Optimizer& optimizer);

// Loads `path` into `model` (in place, so the optimizer's tensors stay valid)
// and `optimizer`, and returns the position. InvalidArgument naming the file
// when it is unreadable or was written for another model. Tensors are mapped
// to `device` (where the model and the optimizer state live).
absl::StatusOr<TrainingPosition> ReadCheckpoint(const std::string& path, engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device);

// fsyncs the file at `path` and its directory (after a rename into place), so
// the file survives a machine crash. Used for the exported final model.
absl::Status SyncFileAndDir(const std::string& path);

}  // namespace trainctl::trainer

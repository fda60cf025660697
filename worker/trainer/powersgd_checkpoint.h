// PowerSGD's state inside a checkpoint (checkpoint.h): the nested archive
// "powersgd" of the one file the checkpoint writer writes, beside the model
// and optimizer. It holds the step count, the random-Q generator, the
// buckets' layout, Q (the same on every rank), and every rank's error
// feedback under its own key ("e<rank>_<bucket>"), so that the file stays
// one file registered by record while each rank of a resume reads only its
// own part. Older checkpoints have no "powersgd" entry and load as before.
//
// Callers: checkpoint.cc (WriteCheckpoint, LoadCheckpoint), tests.
// Threading: stateless functions.
#pragma once

#include <optional>
#include <string>

#include "worker/dist/powersgd.h"

namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace trainctl::trainer {

// What LoadCheckpoint reads of PowerSGD's state for rank `rank`.
struct PowerSgdCheckpointRead {
  int rank = 0;  // in: whose error feedback to read
  // out: the state, with only row `rank` of errors filled (the others
  // undefined); nullopt when the checkpoint holds none.
  std::optional<dist::PowerSgdState> state;
  // out: why a "powersgd" entry that is present could not be read ("" when
  // it was read, or is absent); the caller starts PowerSGD afresh.
  std::string unreadable;
};

// Writes `state` as the nested archive "powersgd" of `archive`.
void WritePowerSgdState(torch::serialize::OutputArchive& archive, const dist::PowerSgdState& state);

// Reads "powersgd" from `archive` into `read` (see PowerSgdCheckpointRead).
// Never throws: a malformed entry is reported in read->unreadable.
void ReadPowerSgdState(torch::serialize::InputArchive& archive, PowerSgdCheckpointRead* read);

}  // namespace trainctl::trainer

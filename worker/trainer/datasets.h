// Loads the dataset a DatasetSpec (rank_config.h) names, with the engine's
// loaders (worker/engine/*_dataset.h), into an immutable in-memory Dataset
// the DataLoader can share between its worker threads.
//
// Called by rank_main.cc once per split at start-up, before the rendezvous,
// so that a missing or corrupt file fails fast as a configuration error.
//
// Threading: a stateless function; thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/engine/dataset.h"
#include "worker/trainer/rank_config.h"

namespace trainctl::trainer {

// `classes` > 0: a classification split whose labels must lie in
// [0, classes) (IDX, CSV); 0: regression targets (CSV only). Errors keep the
// engine's code (NotFound, InvalidArgument) and are prefixed with the key
// that named the file, e.g. "data.train.images: ... no such file '...'".
absl::StatusOr<std::shared_ptr<const engine::Dataset>> LoadDataset(const DatasetSpec& spec,
                                                                   int64_t classes);

}  // namespace trainctl::trainer

// IDX datasets: the MNIST / Fashion-MNIST file format (an images file and a
// labels file, each optionally gzipped; gzip is detected by its magic bytes,
// not the file name).
//
// Called by the rank process when a job's data format is "idx". The whole
// split is decoded up front: images become float32 [N, 1, H, W] scaled to
// [0, 1], labels int64 [N]. Unsigned-byte IDX data (type 0x08) is supported,
// which is what MNIST-family files use.
//
// Threading: LoadIdxDataset is a free function, safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/dataset.h"

namespace trainctl::engine {

struct IdxDataOptions {
  std::string images_path;  // e.g. .../train-images-idx3-ubyte.gz
  std::string labels_path;  // e.g. .../train-labels-idx1-ubyte.gz
  int64_t classes = 10;     // every label must lie in [0, classes); 0 = no check
  int64_t max_samples = 0;  // > 0: keep only the first max_samples examples
};

// NotFound for a missing file; InvalidArgument naming the file for a wrong
// magic, unsupported type, truncated data, an image/label count mismatch or a
// label out of range.
absl::StatusOr<std::unique_ptr<TensorDataset>> LoadIdxDataset(const IdxDataOptions& options);

}  // namespace trainctl::engine

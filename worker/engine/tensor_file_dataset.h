// Datasets saved from Python with torch.save: either a dict holding an inputs
// and a targets tensor, or a tuple/list of exactly two tensors (inputs,
// targets), e.g.
//   torch.save({"inputs": x, "targets": y}, "train.pt")
//   torch.save((x, y), "train.pt")
//
// Called by the rank process when a job's data format is "torch". The file is
// read with torch::pickle_load, which understands the zip format torch.save
// writes by default since PyTorch 1.6 (the legacy pre-1.6 format is not
// supported). Tensors are copied to contiguous CPU memory.
//
// Threading: LoadTensorFileDataset is a free function, safe from any thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/dataset.h"

namespace trainctl::engine {

struct TensorFileDataOptions {
  std::string path;
  // Keys used when the file holds a dict.
  std::string inputs_key = "inputs";
  std::string targets_key = "targets";
};

// NotFound for a missing file; InvalidArgument naming the file when it is not
// a torch.save file, holds something other than a dict/tuple of two tensors,
// misses a key, or the tensors' first dimensions differ.
absl::StatusOr<std::unique_ptr<TensorDataset>> LoadTensorFileDataset(
    const TensorFileDataOptions& options);

}  // namespace trainctl::engine

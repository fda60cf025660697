// CSV datasets: one example per line, numeric feature columns and one label
// column chosen by name (needs a header line) or by index.
//
// Called by the rank process when a job's data format is "csv". The whole
// file is parsed up front into float32 inputs [N, features] and targets:
// int64 [N] class ids when `classes` > 0 (classification), float32 [N, 1]
// otherwise (regression). Empty lines are skipped; fields may be surrounded
// by spaces or double quotes. A bad cell is reported with its line number.
//
// Threading: LoadCsvDataset is a free function, safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/dataset.h"
#include "worker/engine/dataset_formats.h"

namespace trainctl::engine {

// NotFound for a missing file; InvalidArgument naming the file (and line and
// column where it applies) for an unknown label column, a non-numeric cell, a
// row with the wrong number of fields, a bad label, or no data rows.
absl::StatusOr<std::unique_ptr<TensorDataset>> LoadCsvDataset(const CsvDataOptions& options);

}  // namespace trainctl::engine

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

namespace trainctl::engine {

struct CsvDataOptions {
  std::string path;
  bool has_header = true;  // first non-empty line names the columns
  // The label column: by name (has_header must be true) when non-empty,
  // otherwise by 0-based index; -1 means the last column.
  std::string label_column;
  int64_t label_column_index = -1;
  char delimiter = ',';
  // > 0: classification; labels must be integers in [0, classes).
  // 0: regression; labels are any finite number.
  int64_t classes = 0;
};

// NotFound for a missing file; InvalidArgument naming the file (and line and
// column where it applies) for an unknown label column, a non-numeric cell, a
// row with the wrong number of fields, a bad label, or no data rows.
absl::StatusOr<std::unique_ptr<TensorDataset>> LoadCsvDataset(const CsvDataOptions& options);

}  // namespace trainctl::engine

// The byte-level readers of the dataset formats, without LibTorch: an IDX
// file's header and elements (after gunzip) and a CSV file's cells. The
// loaders (idx_dataset, csv_dataset) turn what these return into tensors;
// the fuzz targets (fuzz/) feed them arbitrary bytes.
//
// Threading: stateless free functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainctl::engine {

// An IDX array of unsigned bytes.
struct IdxArray {
  std::vector<char> bytes;    // the whole (decompressed) file
  std::vector<int64_t> dims;  // from the header
  size_t data_offset = 0;     // where the elements start in `bytes`
};

// Decodes the bytes of an IDX file (gzip or not) with `expected_dims`
// dimensions. A gzip file may inflate to no more than its header declares.
// InvalidArgument naming `what` and `path` for a bad magic number, element
// type or dimension count, a truncated header or data, or corrupt gzip.
absl::StatusOr<IdxArray> DecodeIdx(std::vector<char> raw, int expected_dims,
                                   const std::string& path, absl::string_view what);

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

// The cells of a CSV file: features row by row, and either class labels
// (classes > 0) or float labels.
struct CsvTable {
  int64_t rows = 0;
  int64_t columns = 0;  // features + 1
  std::vector<float> features;
  std::vector<float> float_labels;
  std::vector<int64_t> class_labels;
};

// Parses `text` (the file's contents; `options.path` names it in errors).
// InvalidArgument for bad options, an unknown label column, a non-numeric
// cell, a row with the wrong number of fields, a bad label, or no data rows.
absl::StatusOr<CsvTable> ParseCsv(absl::string_view text, const CsvDataOptions& options);

}  // namespace trainctl::engine

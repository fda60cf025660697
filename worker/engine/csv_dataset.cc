#include "worker/engine/csv_dataset.h"

#include <ATen/Functions.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {
namespace {

absl::string_view CleanField(absl::string_view field) {
  field = absl::StripAsciiWhitespace(field);
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"') {
    field = absl::StripAsciiWhitespace(field.substr(1, field.size() - 2));
  }
  return field;
}

std::string Shorten(absl::string_view s) {
  return s.size() <= 40 ? std::string(s) : absl::StrCat(s.substr(0, 40), "...");
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorDataset>> LoadCsvDataset(const CsvDataOptions& options) {
  if (options.classes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("csv classes must be >= 0, got ", options.classes));
  }
  if (!options.label_column.empty() && !options.has_header) {
    return absl::InvalidArgumentError(absl::StrCat("csv label_column '", options.label_column,
                                                   "' is a name but has_header is false"));
  }
  if (options.label_column.empty() && options.label_column_index < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("csv label_column_index must be >= -1, got ", options.label_column_index));
  }
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> bytes, ReadFileBytes(options.path, "CSV file"));
  const absl::string_view text(bytes.data(), bytes.size());
  const std::string& path = options.path;

  int64_t columns = -1;  // fixed by the header or the first data row
  int64_t label = -1;    // resolved label column
  bool header_pending = options.has_header;
  std::vector<float> features;
  std::vector<float> float_labels;
  std::vector<int64_t> class_labels;
  int64_t rows = 0;
  int64_t line_no = 0;

  auto resolve_label_index = [&](int64_t ncols, int64_t line) -> absl::Status {
    if (ncols < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV file '", path, "' line ", line,
                       ": need at least 2 columns (features and a label), got ", ncols));
    }
    label = options.label_column_index == -1 ? ncols - 1 : options.label_column_index;
    if (label >= ncols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "csv label_column_index ", label, " is outside the ", ncols, " columns of '", path, "'"));
    }
    return absl::OkStatus();
  };

  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, options.delimiter);
    const int64_t n = static_cast<int64_t>(fields.size());
    if (header_pending) {
      header_pending = false;
      columns = n;
      if (!options.label_column.empty()) {
        for (int64_t i = 0; i < n; ++i) {
          if (CleanField(fields[i]) == options.label_column) label = i;
        }
        if (label < 0) {
          return absl::InvalidArgumentError(absl::StrCat("csv label_column '", options.label_column,
                                                         "' is not in the header of '", path, "'"));
        }
        if (n < 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "CSV file '", path, "' needs at least 2 columns (features and a label)"));
        }
      } else {
        TRAINCTL_RETURN_IF_ERROR(resolve_label_index(n, line_no));
      }
      continue;
    }
    if (columns < 0) {
      columns = n;
      TRAINCTL_RETURN_IF_ERROR(resolve_label_index(n, line_no));
    }
    if (n != columns) {
      return absl::InvalidArgumentError(absl::StrCat("CSV file '", path, "' line ", line_no,
                                                     ": expected ", columns, " fields, got ", n));
    }
    for (int64_t i = 0; i < n; ++i) {
      const absl::string_view cell = CleanField(fields[i]);
      double value = 0;
      if (!absl::SimpleAtod(cell, &value) || !std::isfinite(value)) {
        return absl::InvalidArgumentError(absl::StrCat("CSV file '", path, "' line ", line_no,
                                                       " column ", i + 1, ": '", Shorten(cell),
                                                       "' is not a finite number"));
      }
      if (i != label) {
        features.push_back(static_cast<float>(value));
      } else if (options.classes > 0) {
        if (value != std::floor(value) || value < 0 || value >= options.classes) {
          return absl::InvalidArgumentError(
              absl::StrCat("CSV file '", path, "' line ", line_no, ": label ", Shorten(cell),
                           " is not a class id in [0, ", options.classes, ")"));
        }
        class_labels.push_back(static_cast<int64_t>(value));
      } else {
        float_labels.push_back(static_cast<float>(value));
      }
    }
    ++rows;
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("CSV file '", path, "' has no data rows"));
  }
  const int64_t feature_count = columns - 1;
  at::Tensor inputs = at::from_blob(features.data(), {rows, feature_count}, at::kFloat).clone();
  at::Tensor targets = options.classes > 0
                           ? at::from_blob(class_labels.data(), {rows}, at::kLong).clone()
                           : at::from_blob(float_labels.data(), {rows, 1}, at::kFloat).clone();
  return TensorDataset::Create(std::move(inputs), std::move(targets));
}

}  // namespace trainctl::engine

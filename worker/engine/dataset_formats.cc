#include "worker/engine/dataset_formats.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {
namespace {

constexpr unsigned char kUnsignedByte = 0x08;

// The size an IDX file's header declares (header + elements), or the
// header's own size when it cannot be read (the caller then reports why).
size_t DeclaredIdxBytes(const std::vector<char>& head, int expected_dims) {
  const size_t header = 4 + 4 * static_cast<size_t>(expected_dims);
  if (head.size() < header) return head.size();
  const auto* b = reinterpret_cast<const unsigned char*>(head.data());
  unsigned __int128 total = header;
  unsigned __int128 elements = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const unsigned char* p = b + 4 + 4 * d;
    elements *=
        (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
  }
  total += elements;
  return total > SIZE_MAX ? SIZE_MAX : static_cast<size_t>(total);
}

}  // namespace

absl::StatusOr<IdxArray> DecodeIdx(std::vector<char> raw, int expected_dims,
                                   const std::string& path, absl::string_view what) {
  IdxArray a;
  if (IsGzip(raw)) {
    // Inflate the header first; the whole file may inflate to no more than
    // the header declares (a small file must not expand without bound).
    TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> head,
                              Gunzip(raw, path, 4 + 4 * 3, /*prefix_only=*/true));
    TRAINCTL_ASSIGN_OR_RETURN(a.bytes, Gunzip(raw, path, DeclaredIdxBytes(head, expected_dims)));
  } else {
    a.bytes = std::move(raw);
  }
  const auto* b = reinterpret_cast<const unsigned char*>(a.bytes.data());
  if (a.bytes.size() < 4 || b[0] != 0 || b[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is not an IDX file (bad magic number)"));
  }
  if (b[2] != kUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' has IDX element type 0x",
                                                   absl::Hex(b[2]),
                                                   "; only unsigned bytes (0x08) are supported"));
  }
  if (b[3] != expected_dims) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' has ",
                                                   static_cast<int>(b[3]), " dimensions, expected ",
                                                   expected_dims));
  }
  a.data_offset = 4 + 4 * static_cast<size_t>(expected_dims);
  if (a.bytes.size() < a.data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' is truncated inside its header"));
  }
  // Up to three 32-bit dimensions: the product fits in 128 bits.
  unsigned __int128 elements = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const unsigned char* p = b + 4 + 4 * d;
    const uint32_t v =
        (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
    a.dims.push_back(static_cast<int64_t>(v));
    elements *= v;
  }
  const size_t available = a.bytes.size() - a.data_offset;
  if (elements > available) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", path, "' is truncated: its header promises more data (",
        absl::StrJoin(a.dims, "x"), " bytes) than the file holds (", available, " bytes)"));
  }
  return a;
}

namespace {

absl::string_view CleanField(absl::string_view field) {
  field = absl::StripAsciiWhitespace(field);
  if (field.size() >= 2 && field.front() == '"' && field.back() == '"') {
    field = absl::StripAsciiWhitespace(field.substr(1, field.size() - 2));
  }
  return field;
}

absl::Status CheckCsvOptions(const CsvDataOptions& options) {
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("csv classes", options.classes, 0));
  if (!options.label_column.empty() && !options.has_header) {
    return absl::InvalidArgumentError(absl::StrCat("csv label_column '", options.label_column,
                                                   "' is a name but has_header is false"));
  }
  if (options.label_column.empty()) {
    TRAINCTL_RETURN_IF_ERROR(
        CheckAtLeast("csv label_column_index", options.label_column_index, -1));
  }
  return absl::OkStatus();
}

// Builds a CsvTable from a CSV file's lines, fed in order.
class CsvReader {
 public:
  explicit CsvReader(const CsvDataOptions& options)
      : o_(options), header_pending_(options.has_header) {
    t_.columns = -1;  // until the header or the first data row fixes it
  }

  // One line (without its '\n'), numbered from 1.
  absl::Status Line(absl::string_view line, int64_t line_no) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) return absl::OkStatus();
    std::vector<absl::string_view> fields = absl::StrSplit(line, o_.delimiter);
    const int64_t n = static_cast<int64_t>(fields.size());
    if (header_pending_) {
      header_pending_ = false;
      t_.columns = n;
      return o_.label_column.empty() ? ResolveLabelIndex(n, line_no) : FindLabelColumn(fields);
    }
    if (t_.columns < 0) {
      t_.columns = n;
      TRAINCTL_RETURN_IF_ERROR(ResolveLabelIndex(n, line_no));
    }
    if (n != t_.columns) {
      return absl::InvalidArgumentError(absl::StrCat("CSV file '", o_.path, "' line ", line_no,
                                                     ": expected ", t_.columns, " fields, got ",
                                                     n));
    }
    for (int64_t i = 0; i < n; ++i)
      TRAINCTL_RETURN_IF_ERROR(Cell(CleanField(fields[i]), i, line_no));
    ++t_.rows;
    return absl::OkStatus();
  }

  absl::StatusOr<CsvTable> Finish() && {
    if (t_.rows == 0) {
      return absl::InvalidArgumentError(absl::StrCat("CSV file '", o_.path, "' has no data rows"));
    }
    return std::move(t_);
  }

 private:
  // label_column names a header column.
  absl::Status FindLabelColumn(const std::vector<absl::string_view>& header) {
    const int64_t n = static_cast<int64_t>(header.size());
    for (int64_t i = 0; i < n; ++i) {
      if (CleanField(header[i]) == o_.label_column) label_ = i;
    }
    if (label_ < 0) {
      return absl::InvalidArgumentError(absl::StrCat("csv label_column '", o_.label_column,
                                                     "' is not in the header of '", o_.path, "'"));
    }
    if (n < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV file '", o_.path, "' needs at least 2 columns (features and a label)"));
    }
    return absl::OkStatus();
  }

  // label_column_index (-1: the last column) among `ncols` columns.
  absl::Status ResolveLabelIndex(int64_t ncols, int64_t line_no) {
    if (ncols < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV file '", o_.path, "' line ", line_no,
                       ": need at least 2 columns (features and a label), got ", ncols));
    }
    label_ = o_.label_column_index == -1 ? ncols - 1 : o_.label_column_index;
    if (label_ >= ncols) {
      return absl::InvalidArgumentError(absl::StrCat("csv label_column_index ", label_,
                                                     " is outside the ", ncols, " columns of '",
                                                     o_.path, "'"));
    }
    return absl::OkStatus();
  }

  // Column i's cell: a feature, a class id or a float label.
  absl::Status Cell(absl::string_view cell, int64_t i, int64_t line_no) {
    double value = 0;
    if (!absl::SimpleAtod(cell, &value) || !std::isfinite(value)) {
      // Never the cell itself: the error reaches every viewer of the job,
      // and a data path may name a file that is not the job's to show.
      return absl::InvalidArgumentError(absl::StrCat("CSV file '", o_.path, "' line ", line_no,
                                                     " column ", i + 1, ": not a finite number"));
    }
    if (i != label_) {
      t_.features.push_back(static_cast<float>(value));
    } else if (o_.classes > 0) {
      if (value != std::floor(value) || value < 0 || value >= o_.classes) {
        return absl::InvalidArgumentError(
            absl::StrCat("CSV file '", o_.path, "' line ", line_no, " column ", i + 1,
                         ": the label is not a class id in [0, ", o_.classes, ")"));
      }
      t_.class_labels.push_back(static_cast<int64_t>(value));
    } else {
      t_.float_labels.push_back(static_cast<float>(value));
    }
    return absl::OkStatus();
  }

  const CsvDataOptions& o_;
  bool header_pending_;
  int64_t label_ = -1;  // resolved label column
  CsvTable t_;
};

}  // namespace

absl::StatusOr<CsvTable> ParseCsv(absl::string_view text, const CsvDataOptions& options) {
  TRAINCTL_RETURN_IF_ERROR(CheckCsvOptions(options));
  CsvReader reader(options);
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    TRAINCTL_RETURN_IF_ERROR(reader.Line(line, ++line_no));
  }
  return std::move(reader).Finish();
}

}  // namespace trainctl::engine

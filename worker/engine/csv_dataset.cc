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
#include "worker/engine/dataset_formats.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {

absl::StatusOr<std::unique_ptr<TensorDataset>> LoadCsvDataset(const CsvDataOptions& options) {
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> bytes, ReadFileBytes(options.path, "CSV file"));
  TRAINCTL_ASSIGN_OR_RETURN(CsvTable t,
                            ParseCsv(absl::string_view(bytes.data(), bytes.size()), options));
  const int64_t feature_count = t.columns - 1;
  at::Tensor inputs = at::from_blob(t.features.data(), {t.rows, feature_count}, at::kFloat).clone();
  at::Tensor targets = options.classes > 0
                           ? at::from_blob(t.class_labels.data(), {t.rows}, at::kLong).clone()
                           : at::from_blob(t.float_labels.data(), {t.rows, 1}, at::kFloat).clone();
  return TensorDataset::Create(std::move(inputs), std::move(targets));
}

}  // namespace trainctl::engine

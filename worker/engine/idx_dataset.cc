#include "worker/engine/idx_dataset.h"

#include <ATen/Functions.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/engine/dataset_formats.h"
#include "worker/engine/engine_errors.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {
namespace {

// Reads an IDX file of unsigned bytes with `expected_dims` dimensions.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims,
                                 absl::string_view what) {
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> raw, ReadFileBytes(path, what));
  return DecodeIdx(std::move(raw), expected_dims, path, what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorDataset>> LoadIdxDataset(const IdxDataOptions& options) {
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("idx classes", options.classes, 0));
  TRAINCTL_RETURN_IF_ERROR(CheckAtLeast("idx max_samples", options.max_samples, 0));
  TRAINCTL_ASSIGN_OR_RETURN(IdxArray images, ReadIdx(options.images_path, 3, "IDX images file"));
  TRAINCTL_ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(options.labels_path, 1, "IDX labels file"));
  const int64_t n_images = images.dims[0];
  const int64_t n_labels = labels.dims[0];
  if (n_images != n_labels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX images file '", options.images_path, "' holds ", n_images, " images but labels file '",
        options.labels_path, "' holds ", n_labels, " labels"));
  }
  const int64_t n = options.max_samples > 0 ? std::min(n_images, options.max_samples) : n_images;
  const int64_t h = images.dims[1];
  const int64_t w = images.dims[2];

  const auto* label_bytes =
      reinterpret_cast<const uint8_t*>(labels.bytes.data() + labels.data_offset);
  if (options.classes > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (label_bytes[i] >= options.classes) {
        return absl::InvalidArgumentError(absl::StrCat("IDX labels file '", options.labels_path,
                                                       "': the label of example ", i,
                                                       " is outside [0, ", options.classes, ")"));
      }
    }
  }
  // from_blob borrows the buffers; the conversions below copy out of them.
  at::Tensor image_u8 =
      at::from_blob(images.bytes.data() + images.data_offset, {n, 1, h, w}, at::kByte);
  at::Tensor label_u8 = at::from_blob(labels.bytes.data() + labels.data_offset, {n}, at::kByte);
  at::Tensor inputs = image_u8.to(at::kFloat).div_(255.0);
  at::Tensor targets = label_u8.to(at::kLong);
  return TensorDataset::Create(std::move(inputs), std::move(targets));
}

}  // namespace trainctl::engine

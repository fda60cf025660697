#include "worker/engine/idx_dataset.h"

#include <ATen/Functions.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {
namespace {

constexpr unsigned char kUnsignedByte = 0x08;

struct IdxArray {
  std::vector<char> bytes;    // the whole (decompressed) file
  std::vector<int64_t> dims;  // from the header
  size_t data_offset = 0;     // where the elements start in `bytes`
};

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
    elements *= (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
  }
  total += elements;
  return total > SIZE_MAX ? SIZE_MAX : static_cast<size_t>(total);
}

// Reads an IDX file of unsigned bytes with `expected_dims` dimensions.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int expected_dims,
                                 absl::string_view what) {
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> raw, ReadFileBytes(path, what));
  IdxArray a;
  if (IsGzip(raw)) {
    // Inflate the header first; the whole file may inflate to no more than
    // the header declares (a small file must not expand without bound).
    TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> head, Gunzip(raw, path, 4 + 4 * 3, /*prefix_only=*/true));
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

}  // namespace

absl::StatusOr<std::unique_ptr<TensorDataset>> LoadIdxDataset(const IdxDataOptions& options) {
  if (options.classes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("idx classes must be >= 0, got ", options.classes));
  }
  if (options.max_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("idx max_samples must be >= 0, got ", options.max_samples));
  }
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
        return absl::InvalidArgumentError(
            absl::StrCat("IDX labels file '", options.labels_path, "': label ", int{label_bytes[i]},
                         " of example ", i, " is outside [0, ", options.classes, ")"));
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

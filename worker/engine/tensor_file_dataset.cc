#include "worker/engine/tensor_file_dataset.h"

#include <torch/serialize.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine/engine_errors.h"
#include "worker/engine/file_bytes.h"

namespace trainctl::engine {

absl::StatusOr<std::unique_ptr<TensorDataset>> LoadTensorFileDataset(
    const TensorFileDataOptions& options) {
  const std::string& path = options.path;
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<char> bytes, ReadFileBytes(path, "tensor file"));
  // torch.save's zip archives start with the local-file-header magic "PK\3\4";
  // checking first gives a clear error instead of an unpickler exception.
  if (bytes.size() < 4 || bytes[0] != 'P' || bytes[1] != 'K' || bytes[2] != 3 || bytes[3] != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor file '", path,
                     "' is not a torch.save zip archive (legacy pre-1.6 files are not supported)"));
  }
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor file '", path, "' cannot be loaded: ", FirstLine(e.what())));
  }
  at::Tensor inputs;
  at::Tensor targets;
  if (value.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
    auto get = [&](const std::string& key, at::Tensor* out) -> absl::Status {
      for (const auto& entry : dict) {
        if (entry.key().isString() && entry.key().toStringRef() == key) {
          if (!entry.value().isTensor()) {
            return absl::InvalidArgumentError(absl::StrCat("tensor file '", path, "': key '", key,
                                                           "' holds a ", entry.value().tagKind(),
                                                           ", not a tensor"));
          }
          *out = entry.value().toTensor();
          return absl::OkStatus();
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("tensor file '", path, "' has no key '", key, "'"));
    };
    TRAINCTL_RETURN_IF_ERROR(get(options.inputs_key, &inputs));
    TRAINCTL_RETURN_IF_ERROR(get(options.targets_key, &targets));
  } else if (value.isTuple() || value.isList()) {
    std::vector<c10::IValue> items;
    if (value.isTuple()) {
      for (const auto& v : value.toTupleRef().elements()) items.push_back(v);
    } else {
      for (const auto& v : value.toListRef()) items.push_back(v);
    }
    if (items.size() != 2 || !items[0].isTensor() || !items[1].isTensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor file '", path, "' holds a ", items.size(),
                       "-element tuple/list; expected exactly two tensors (inputs, targets)"));
    }
    inputs = items[0].toTensor();
    targets = items[1].toTensor();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor file '", path, "' holds a ", value.tagKind(), "; expected a dict {'",
                     options.inputs_key, "': tensor, '", options.targets_key,
                     "': tensor} or a tuple (inputs, targets)"));
  }
  auto dataset = TensorDataset::Create(std::move(inputs), std::move(targets));
  if (!dataset.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor file '", path, "': ", dataset.status().message()));
  }
  return dataset;
}

}  // namespace trainctl::engine

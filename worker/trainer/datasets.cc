#include "worker/trainer/datasets.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/csv_dataset.h"
#include "worker/engine/idx_dataset.h"
#include "worker/engine/tensor_file_dataset.h"

namespace trainctl::trainer {
namespace {

// Prefixes an engine error with the key that named the file.
absl::Status WithKey(const absl::Status& s, const std::string& key) {
  return absl::Status(s.code(), absl::StrCat(key, ": ", s.message()));
}

template <typename T>
absl::StatusOr<std::shared_ptr<const engine::Dataset>> Shared(absl::StatusOr<std::unique_ptr<T>> d,
                                                              const std::string& key) {
  if (!d.ok()) return WithKey(d.status(), key);
  return std::shared_ptr<const engine::Dataset>(std::move(d).value());
}

}  // namespace

absl::StatusOr<std::shared_ptr<const engine::Dataset>> LoadDataset(const DatasetSpec& spec,
                                                                   int64_t classes) {
  const std::string& p = spec.key_prefix;
  switch (spec.format) {
    case DatasetSpec::Format::kSynthetic: {
      engine::SyntheticDataOptions o;
      o.length = spec.length;
      o.size = spec.size;
      o.seed = spec.seed;
      if (spec.classes > 0) {
        o.task = engine::SyntheticTask::kClassification;
        o.classes = spec.classes;
      } else {
        o.task = engine::SyntheticTask::kRegression;
        o.target_dim = spec.target_dim;
      }
      return Shared(engine::MakeSyntheticDataset(o), p);
    }
    case DatasetSpec::Format::kIdx: {
      engine::IdxDataOptions o;
      o.images_path = spec.images;
      o.labels_path = spec.labels;
      o.classes = classes;
      auto d = engine::LoadIdxDataset(o);
      if (!d.ok()) {
        // The engine names the file; say which key held it.
        const std::string msg(d.status().message());
        const bool labels = msg.find(spec.labels) != std::string::npos &&
                            msg.find(spec.images) == std::string::npos;
        return WithKey(d.status(), absl::StrCat(p, labels ? ".labels" : ".images"));
      }
      return std::shared_ptr<const engine::Dataset>(std::move(d).value());
    }
    case DatasetSpec::Format::kCsv: {
      engine::CsvDataOptions o;
      o.path = spec.path;
      o.has_header = spec.header;
      o.classes = classes;
      int64_t index;
      if (spec.label_column.empty()) {
        o.label_column_index = -1;
      } else if (absl::SimpleAtoi(spec.label_column, &index)) {
        o.label_column_index = index;
      } else {
        o.label_column = spec.label_column;
      }
      return Shared(engine::LoadCsvDataset(o), absl::StrCat(p, ".path"));
    }
    case DatasetSpec::Format::kTensors: {
      engine::TensorFileDataOptions o;
      o.path = spec.path;
      o.inputs_key = spec.inputs_key;
      o.targets_key = spec.targets_key;
      return Shared(engine::LoadTensorFileDataset(o), absl::StrCat(p, ".path"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(p, ".format: unknown"));
}

}  // namespace trainctl::trainer

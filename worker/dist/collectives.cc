#include "worker/dist/collectives.h"

namespace trainctl::dist {

size_t CommDataTypeSize(CommDataType type) {
  switch (type) {
    case CommDataType::kFloat32:
      return 4;
    case CommDataType::kFloat64:
      return 8;
    case CommDataType::kFloat16:
      return 2;
    case CommDataType::kBFloat16:
      return 2;
    case CommDataType::kInt32:
      return 4;
    case CommDataType::kInt64:
      return 8;
    case CommDataType::kUInt8:
      return 1;
  }
  return 0;
}

const char* CommDataTypeName(CommDataType type) {
  switch (type) {
    case CommDataType::kFloat32:
      return "float32";
    case CommDataType::kFloat64:
      return "float64";
    case CommDataType::kFloat16:
      return "float16";
    case CommDataType::kBFloat16:
      return "bfloat16";
    case CommDataType::kInt32:
      return "int32";
    case CommDataType::kInt64:
      return "int64";
    case CommDataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

namespace {

class CompletedWorkImpl final : public CollectiveWork {
 public:
  explicit CompletedWorkImpl(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait(absl::Duration) override { return status_; }
  absl::Status Wait() override { return status_; }
  bool IsCompleted() override { return true; }

 private:
  const absl::Status status_;
};

}  // namespace

std::shared_ptr<CollectiveWork> CompletedWork(absl::Status status) {
  return std::make_shared<CompletedWorkImpl>(std::move(status));
}

}  // namespace trainctl::dist

#include "worker/dist/tensor_collectives.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace trainctl::dist {

absl::StatusOr<CommDataType> CommDataTypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return CommDataType::kFloat32;
    case at::kDouble:
      return CommDataType::kFloat64;
    case at::kHalf:
      return CommDataType::kFloat16;
    case at::kBFloat16:
      return CommDataType::kBFloat16;
    case at::kInt:
      return CommDataType::kInt32;
    case at::kLong:
      return CommDataType::kInt64;
    case at::kByte:
      return CommDataType::kUInt8;
    case at::kBool:
      return CommDataType::kUInt8;  // broadcast only; sums are meaningless
    default:
      return absl::InvalidArgumentError(absl::StrCat("collectives: unsupported tensor type ",
                                                     c10::toString(tensor.scalar_type())));
  }
}

absl::StatusOr<CommBuffer> CommBufferFromTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return absl::InvalidArgumentError("collectives: undefined tensor");
  if (tensor.layout() != at::kStrided) {
    return absl::InvalidArgumentError("collectives: only dense (strided) tensors are supported");
  }
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError("collectives: tensor must be contiguous");
  }
  CommBuffer b;
  TRAINCTL_ASSIGN_OR_RETURN(b.type, CommDataTypeOf(tensor));
  if (tensor.device().is_cpu()) {
    b.device = CommDevice::kCpu;
  } else if (tensor.device().is_cuda()) {
    b.device = CommDevice::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives: unsupported device ", tensor.device().str()));
  }
  b.data = tensor.data_ptr();
  b.count = static_cast<size_t>(tensor.numel());
  // Holding a Tensor keeps its storage alive.
  b.keep_alive = std::make_shared<at::Tensor>(tensor);
  return b;
}

std::shared_ptr<CollectiveWork> AllReduceSum(Collectives& comm, const at::Tensor& tensor) {
  auto b = CommBufferFromTensor(tensor);
  if (!b.ok()) return CompletedWork(b.status());
  return comm.AllReduceSum(*std::move(b));
}

std::shared_ptr<CollectiveWork> Broadcast(Collectives& comm, const at::Tensor& tensor, int root) {
  auto b = CommBufferFromTensor(tensor);
  if (!b.ok()) return CompletedWork(b.status());
  return comm.Broadcast(*std::move(b), root);
}

absl::Status BroadcastCoalesced(Collectives& comm, const std::vector<at::Tensor>& tensors, int root,
                                size_t bucket_bytes) {
  if (comm.world_size() == 1) return absl::OkStatus();
  c10::NoGradGuard no_grad;
  // Group by (type, device) in the given order; every rank passes the same
  // list, so every rank forms the same groups and issues the same broadcasts.
  std::vector<std::vector<size_t>> groups;
  std::map<std::pair<int, std::string>, size_t> open_group;
  std::vector<size_t> group_bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    const auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    auto it = open_group.find(key);
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (it == open_group.end() || group_bytes[it->second] + bytes > bucket_bytes) {
      groups.emplace_back();
      group_bytes.push_back(0);
      it = open_group.insert_or_assign(key, groups.size() - 1).first;
    }
    groups[it->second].push_back(i);
    group_bytes[it->second] += bytes;
  }
  for (const auto& group : groups) {
    std::vector<at::Tensor> flat_parts;
    flat_parts.reserve(group.size());
    for (size_t i : group) flat_parts.push_back(tensors[i].detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    TRAINCTL_RETURN_IF_ERROR(Broadcast(comm, flat, root)->Wait());
    int64_t offset = 0;
    for (size_t i : group) {
      const auto& t = tensors[i];
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl::dist

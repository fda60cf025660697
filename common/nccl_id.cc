#include "common/nccl_id.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace trainctl {

absl::StatusOr<std::string> GenerateNcclUniqueId() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return absl::UnavailableError("NCCL (libnccl.so.2) is not installed on this host");
  using GetId = int (*)(void*);
  auto get = reinterpret_cast<GetId>(dlsym(lib, "ncclGetUniqueId"));
  if (get == nullptr) return absl::UnavailableError("libnccl.so.2 has no ncclGetUniqueId");
  char id[kNcclUniqueIdBytes] = {0};
  const int rc = get(id);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("ncclGetUniqueId failed (", rc, ")"));
  return std::string(id, sizeof id);
}

}  // namespace trainctl

// The NCCL unique id: its size, and making one without linking NCCL.
//
// The id is produced where NCCL's bootstrap root should live (rank 0's
// worker daemon), handed out by the coordinator, and turned into a
// communicator by every rank (worker/dist/nccl_collectives). All three agree
// on its size through this header.
//
// Thread-safe: GenerateNcclUniqueId may be called from any thread.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace trainctl {

// sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A fresh id from ncclGetUniqueId in libnccl.so.2, loaded with dlopen so the
// caller does not link NCCL. Needs no GPU, only a network interface for
// NCCL's bootstrap socket; the library stays loaded (the bootstrap root
// lives in this process until every rank has initialised). UNAVAILABLE when
// NCCL is not installed or the call fails.
absl::StatusOr<std::string> GenerateNcclUniqueId();

}  // namespace trainctl

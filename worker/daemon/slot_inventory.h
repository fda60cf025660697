// What a worker host offers: its GPUs (discovered at run time through NVML,
// loaded with dlopen, so the daemon starts on hosts without a GPU or a
// driver) or CPU slots.
//
// Called once at daemon start. Stateless; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainctl/v1/job.pb.h"

namespace trainctl::worker {

struct GpuInfo {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
};

// GPUs visible through NVML (libnvidia-ml.so.1); empty when there is no
// driver or no GPU. Never fails.
std::vector<GpuInfo> DiscoverGpus();

// The slots the daemon registers.
//  gpus:  "" (default: every visible GPU, else CPU slots), "all", "none", or
//         "0,2" (these indices; each must be visible).
//  cpu_slots: slots when running on CPU; 0 = 1.
//  gpu_flavor: every GPU slot's Slot.flavor (--gpu-flavor); "" (default):
//         each GPU's name normalized (NormalizeGpuFlavor, common/jobspec/
//         gpu_flavor.h). CPU slots have none: a flavor with CPU slots is
//         refused.
// INVALID_ARGUMENT naming the flag for bad values.
absl::StatusOr<std::vector<v1::Slot>> ChooseSlots(const std::string& gpus, int cpu_slots,
                                                  const std::vector<GpuInfo>& visible,
                                                  const std::string& gpu_flavor = "");

}  // namespace trainctl::worker

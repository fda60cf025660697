#include "worker/daemon/slot_inventory.h"

#include <dlfcn.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/gpu_flavor.h"

namespace trainctl::worker {
namespace {

// The few NVML entry points used, resolved with dlsym (no link-time dependency).
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlCount = int (*)(unsigned int*);
using NvmlHandle = int (*)(unsigned int, void**);
using NvmlName = int (*)(void*, char*, unsigned int);
struct NvmlMemory {
  unsigned long long total, free, used;
};
using NvmlMem = int (*)(void*, NvmlMemory*);

}  // namespace

std::vector<GpuInfo> DiscoverGpus() {
  std::vector<GpuInfo> out;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return out;
  auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<NvmlCount>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<NvmlHandle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto name = reinterpret_cast<NvmlName>(dlsym(lib, "nvmlDeviceGetName"));
  auto mem = reinterpret_cast<NvmlMem>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  if (init == nullptr || count == nullptr || handle == nullptr || init() != 0) {
    dlclose(lib);
    return out;
  }
  unsigned int n = 0;
  if (count(&n) == 0) {
    for (unsigned int i = 0; i < n; ++i) {
      void* dev = nullptr;
      if (handle(i, &dev) != 0) continue;
      GpuInfo g;
      g.index = static_cast<int>(i);
      char buf[96] = {0};
      if (name != nullptr && name(dev, buf, sizeof buf) == 0) g.name = buf;
      NvmlMemory m{};
      if (mem != nullptr && mem(dev, &m) == 0) g.memory_bytes = static_cast<int64_t>(m.total);
      out.push_back(g);
    }
  }
  if (shutdown != nullptr) shutdown();
  dlclose(lib);
  return out;
}

absl::StatusOr<std::vector<v1::Slot>> ChooseSlots(const std::string& gpus, int cpu_slots,
                                                  const std::vector<GpuInfo>& visible,
                                                  const std::string& gpu_flavor) {
  if (cpu_slots < 0 || cpu_slots > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slots: must be in [0, 1024], got ", cpu_slots));
  }
  if (!gpu_flavor.empty()) {
    if (std::string problem = GpuFlavorProblem(gpu_flavor); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-flavor: ", problem, ", got '", gpu_flavor, "'"));
    }
  }
  std::vector<v1::Slot> out;
  auto add_gpu = [&](const GpuInfo& g) {
    v1::Slot s;
    s.set_kind(v1::Slot::KIND_GPU);
    s.set_index(g.index);
    s.set_name(g.name);
    s.set_memory_bytes(g.memory_bytes);
    s.set_flavor(gpu_flavor.empty() ? NormalizeGpuFlavor(g.name) : gpu_flavor);
    out.push_back(s);
  };
  bool use_cpu = gpus == "none" || (gpus.empty() && visible.empty());
  if (!use_cpu && cpu_slots > 0 && gpus.empty()) use_cpu = true;  // --slots asks for CPU.
  if (use_cpu) {
    if (!gpu_flavor.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-flavor: this worker offers CPU slots (",
                       gpus == "none"    ? "--gpus none"
                       : visible.empty() ? "no GPU is visible"
                                         : "--slots",
                       "), and CPU slots have no flavor; leave --gpu-flavor out"));
    }
    for (int i = 0; i < std::max(cpu_slots, 1); ++i) {
      v1::Slot s;
      s.set_kind(v1::Slot::KIND_CPU);
      s.set_index(i);
      out.push_back(s);
    }
    return out;
  }
  if (gpus.empty() || gpus == "all") {
    if (visible.empty())
      return absl::InvalidArgumentError("--gpus: no GPU is visible on this host");
    for (const GpuInfo& g : visible) add_gpu(g);
    return out;
  }
  std::vector<std::string> parts = absl::StrSplit(gpus, ',');
  for (const std::string& p : parts) {
    int idx;
    if (!absl::SimpleAtoi(p, &idx)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: expected all, none or indices like 0,1; got '", gpus, "'"));
    }
    auto it = std::find_if(visible.begin(), visible.end(),
                           [&](const GpuInfo& g) { return g.index == idx; });
    if (it == visible.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: GPU ", idx, " is not visible (", visible.size(), " visible)"));
    }
    if (std::any_of(out.begin(), out.end(), [&](const v1::Slot& s) { return s.index() == idx; })) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: GPU ", idx, " listed twice"));
    }
    add_gpu(*it);
  }
  return out;
}

}  // namespace trainctl::worker

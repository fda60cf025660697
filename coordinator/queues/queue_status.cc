#include "coordinator/queues/queue_status.h"

#include <algorithm>

#include "coordinator/scheduler/quota.h"

namespace trainctl::coordinator {

v1::QueueStatus QueueStatusOf(const v1::Queue& queue,
                              const std::map<std::string, QueueUsage>& usages) {
  v1::QueueStatus st;
  *st.mutable_queue() = queue;
  int64_t used_milli_cpus = 0;
  auto it = usages.find(queue.name());
  if (it != usages.end()) {
    st.set_used_gpu(it->second.used_gpu);
    st.set_used_cpu(it->second.used_cpu);
    st.set_pending_jobs(it->second.pending_jobs);
    st.set_running_jobs(it->second.running_jobs);
    used_milli_cpus = it->second.used_milli_cpus;
    st.set_used_memory_bytes(it->second.used_memory_bytes);
    for (const auto& [flavor, slots] : it->second.used_gpu_flavors) {
      (*st.mutable_used_gpu_flavors())[flavor] = slots;
    }
  }
  st.set_borrowed_gpu(BorrowedSlots(st.used_gpu(), queue.has_nominal_gpu(), queue.nominal_gpu()));
  // Per flavor with a nominal, as the slot kinds (the scheduler's flavor
  // dimensions); only those with some borrowed.
  for (const auto& [flavor, nominal] : queue.nominal_gpu_flavors()) {
    auto used = st.used_gpu_flavors().find(flavor);
    const int32_t borrowed =
        BorrowedSlots(used == st.used_gpu_flavors().end() ? 0 : used->second, true, nominal);
    if (borrowed > 0) (*st.mutable_borrowed_gpu_flavors())[flavor] = borrowed;
  }
  st.set_borrowed_cpu(BorrowedSlots(st.used_cpu(), queue.has_nominal_cpu(), queue.nominal_cpu()));
  // CPUs in thousandths as the scheduler counts them (a nominal rounded
  // down), shown in CPUs.
  st.set_used_cpus(static_cast<double>(used_milli_cpus) / 1000);
  st.set_borrowed_cpus(
      static_cast<double>(Borrowed(used_milli_cpus, queue.has_nominal_cpus(),
                                   scheduler::QuotaMilliCpus(queue.nominal_cpus()))) /
      1000);
  st.set_borrowed_memory_bytes(Borrowed(st.used_memory_bytes(), queue.has_nominal_memory_bytes(),
                                        queue.nominal_memory_bytes()));
  return st;
}

std::vector<v1::QueueStatus> QueueStatusesOf(const std::vector<v1::Queue>& queues,
                                             const std::map<std::string, QueueUsage>& usages) {
  std::vector<v1::QueueStatus> out;
  out.reserve(queues.size());
  for (const v1::Queue& q : queues) out.push_back(QueueStatusOf(q, usages));
  return out;
}

int32_t BorrowedSlots(int32_t used, bool has_nominal, int32_t nominal) {
  if (!has_nominal || nominal < 0) return 0;
  return std::max(0, used - nominal);
}

int64_t Borrowed(int64_t used, bool has_nominal, int64_t nominal) {
  if (!has_nominal || nominal < 0) return 0;
  return std::max<int64_t>(0, used - nominal);
}

}  // namespace trainctl::coordinator

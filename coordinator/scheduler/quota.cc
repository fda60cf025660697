#include "coordinator/scheduler/quota.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/format_bytes.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler {

std::optional<long long> QueueCeiling(absl::Span<const QueueSpec> queues, const std::string& name,
                                      SlotKind kind) {
  if (queues.empty()) return std::nullopt;  // the implicit queue is unlimited
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  if (q < 0) return std::nullopt;
  const long long ceiling = book.Ceiling(q, internal::KindIndex(kind));
  if (ceiling >= internal::kUnbounded) return std::nullopt;
  return ceiling;
}

std::optional<ResourceShort> QueueResourceShort(absl::Span<const QueueSpec> queues, const std::string& name,
                                                long long ranks, double cpus, std::int64_t memory_bytes) {
  if (queues.empty()) return std::nullopt;
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  if (q < 0) return std::nullopt;
  // As the scheduler's request (worker_fit.h RequestOf).
  const long long milli = cpus > 0 ? std::max<long long>(1, internal::MilliUp(cpus)) : 0;
  const internal::Demand per_rank = internal::PerRank(SlotKind::kCpu, milli, memory_bytes);
  for (int d : {internal::kCpusDim, internal::kMemoryDim}) {
    const long long asks = internal::Times(per_rank[d], ranks);
    const long long ceiling = book.Ceiling(q, d);
    if (per_rank[d] <= 0 || asks <= ceiling) continue;
    auto text = [d](long long v) {
      return d == internal::kCpusDim ? absl::StrCat(internal::CpuText(v), v == 1000 ? " cpu" : " cpus")
                                     : FormatBytes(v);
    };
    return ResourceShort{internal::DimField(d), text(asks), text(ceiling)};
  }
  return std::nullopt;
}

}  // namespace trainctl::scheduler

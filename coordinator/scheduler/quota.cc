#include "coordinator/scheduler/quota.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/format_bytes.h"
#include "coordinator/scheduler/queue_admission.h"
#include "coordinator/scheduler/worker_fit.h"

namespace trainctl::scheduler {

long long RankMilliCpus(double cpus) {
  // As the scheduler's request (worker_fit.h RequestOf).
  return std::isfinite(cpus) && cpus > 0 ? std::max<long long>(1, internal::MilliUp(cpus)) : 0;
}

long long QuotaMilliCpus(double cpus) {
  return std::isfinite(cpus) && cpus >= 0 ? internal::MilliDown(cpus) : -1;
}

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

std::optional<long long> QueueFlavorCeiling(absl::Span<const QueueSpec> queues,
                                            const std::string& name, const std::string& flavor) {
  if (queues.empty()) return std::nullopt;
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  const int d = book.FlavorDim(flavor);
  if (q < 0 || d < 0) return std::nullopt;
  const long long ceiling = book.Ceiling(q, d);
  if (ceiling >= internal::kUnbounded) return std::nullopt;
  return ceiling;
}

std::optional<ResourceShort> QueueResourceShort(absl::Span<const QueueSpec> queues,
                                                const std::string& name, long long ranks,
                                                double cpus, std::int64_t memory_bytes) {
  if (queues.empty()) return std::nullopt;
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  if (q < 0) return std::nullopt;
  const long long milli = RankMilliCpus(cpus);
  const internal::Demand per_rank = book.PerRank(SlotKind::kCpu, milli, memory_bytes);
  for (int d : {internal::kCpusDim, internal::kMemoryDim}) {
    const long long asks = internal::Times(per_rank[d], ranks);
    const long long ceiling = book.Ceiling(q, d);
    if (per_rank[d] <= 0 || asks <= ceiling) continue;
    auto text = [d](long long v) {
      return d == internal::kCpusDim
                 ? absl::StrCat(internal::CpuText(v), v == 1000 ? " cpu" : " cpus")
                 : FormatBytes(v);
    };
    return ResourceShort{internal::DimField(d), text(asks), text(ceiling)};
  }
  return std::nullopt;
}

bool QueueHasResourceRoom(absl::Span<const QueueSpec> queues, absl::Span<const RunningJob> running,
                          const std::string& name, double cpus, std::int64_t memory_bytes,
                          const std::string& gpu_flavor) {
  if (queues.empty()) return true;
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  // QueueBook needs every running job's queue defined.
  const auto defined = [&](const std::string& queue) {
    const std::string& n = queue.empty() ? std::string("default") : queue;
    return std::any_of(queues.begin(), queues.end(),
                       [&](const QueueSpec& q) { return q.name == n; });
  };
  for (const RunningJob& r : running) {
    if (defined(r.queue)) input.running.push_back(r);
  }
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  if (q < 0) return true;
  const long long milli = RankMilliCpus(cpus);
  // A GPU rank of its flavor: that flavor's quota counts it too.
  internal::Demand per_rank = book.PerRank(SlotKind::kGpu, milli, memory_bytes, gpu_flavor);
  per_rank[internal::KindIndex(SlotKind::kGpu)] = 0;  // slots are the caller's
  // Within its own nominal: kReclaim too (the cohort borrowed it), as the
  // caller's slot check.
  const internal::Admission a = book.Admit(q, per_rank, 1);
  return a != internal::Admission::kBorrow && a != internal::Admission::kOverQuota;
}

}  // namespace trainctl::scheduler

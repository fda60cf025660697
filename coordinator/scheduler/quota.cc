#include "coordinator/scheduler/quota.h"

#include <vector>

#include "coordinator/scheduler/queue_admission.h"

namespace trainctl::scheduler {

std::optional<long long> QueueCeiling(absl::Span<const QueueSpec> queues, const std::string& name,
                                      SlotKind kind) {
  if (queues.empty()) return std::nullopt;  // the implicit queue is unlimited
  QueueInput input;
  input.queues.assign(queues.begin(), queues.end());
  const internal::QueueBook book(input);
  const int q = book.Find(name);
  if (q < 0) return std::nullopt;
  const long long ceiling = book.Ceiling(q, kind);
  if (ceiling >= internal::kUnbounded) return std::nullopt;
  return ceiling;
}

}  // namespace trainctl::scheduler

// QueueService: thin handlers over the QueueRegistry (which persists, then
// updates memory) and the JobManager's per-queue usage, on the loop.
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/time_util.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/queues/queue_status.h"

namespace trainctl::coordinator {
namespace {

absl::Status NoRegistry() {
  return absl::FailedPreconditionError("this coordinator serves no queues");
}

// Timestamp's documented range: 0001-01-01 to 9999-12-31, nanos in [0, 1e9).
absl::Status CheckTimestamp(const char* field, const google::protobuf::Timestamp& ts) {
  if (ts.seconds() < -62135596800 || ts.seconds() > 253402300799 || ts.nanos() < 0 ||
      ts.nanos() > 999999999) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": not a valid timestamp (seconds ",
                                                   ts.seconds(), ", nanos ", ts.nanos(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* QueueServiceImpl::CreateQueue(grpc::CallbackServerContext* ctx,
                                                        const v1::CreateQueueRequest* req,
                                                        v1::Queue* resp) {
  return UnaryOnLoop(
      ctx_, ctx, "CreateQueue",
      [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        if (ctx_.queues == nullptr) return NoRegistry();
        // A new quota applies from a pass made now.
        absl::Status s = MoveInto(ctx_.queues->Create(req->queue(), req->update()), resp);
        if (s.ok()) ctx_.placer->Schedule();
        return s;
      });
}

grpc::ServerUnaryReactor* QueueServiceImpl::GetQueue(grpc::CallbackServerContext* ctx,
                                                     const v1::GetQueueRequest* req,
                                                     v1::QueueStatus* resp) {
  return UnaryOnLoop(
      ctx_, ctx, "GetQueue",
      [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        if (ctx_.queues == nullptr) return NoRegistry();
        const v1::Queue* queue = ctx_.queues->Find(req->name());
        if (queue == nullptr) {
          return absl::NotFoundError(absl::StrCat("no queue named '", req->name(),
                                                  "' (defined: ", ctx_.queues->NameList(), ")"));
        }
        *resp = QueueStatusOf(*queue, ctx_.queries->QueueUsages());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* QueueServiceImpl::ListQueues(grpc::CallbackServerContext* ctx,
                                                       const v1::ListQueuesRequest*,
                                                       v1::ListQueuesResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "ListQueues",
                     [this, resp](const Principal&)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
                           if (ctx_.queues == nullptr) return NoRegistry();
                           for (v1::QueueStatus& st :
                                QueueStatusesOf(ctx_.queues->List(), ctx_.queries->QueueUsages())) {
                             *resp->add_queues() = std::move(st);
                           }
                           return absl::OkStatus();
                         });
}

grpc::ServerUnaryReactor* QueueServiceImpl::DeleteQueue(grpc::CallbackServerContext* ctx,
                                                        const v1::DeleteQueueRequest* req,
                                                        v1::DeleteQueueResponse*) {
  return UnaryOnLoop(
      ctx_, ctx, "DeleteQueue",
      [this, req](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        if (ctx_.queues == nullptr) return NoRegistry();
        const std::map<std::string, QueueUsage> usages = ctx_.queries->QueueUsages();
        auto it = usages.find(req->name());
        const QueueUsage use = it == usages.end() ? QueueUsage{} : it->second;
        return ctx_.queues->Delete(req->name(), use.pending_jobs, use.running_jobs);
      });
}

grpc::ServerUnaryReactor* QueueServiceImpl::GetUsage(grpc::CallbackServerContext* ctx,
                                                     const v1::GetUsageRequest* req,
                                                     v1::GetUsageResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "GetUsage",
                     [this, req, resp](const Principal&)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
                           // Works without queues too: every job then counts as "default".
                           UsageFilter filter;
                           filter.queue = req->queue();
                           filter.owner = req->owner();
                           if (req->has_since()) {
                             if (absl::Status s = CheckTimestamp("since", req->since()); !s.ok())
                               return s;
                             filter.since = FromTimestamp(req->since());
                           }
                           if (req->has_until()) {
                             if (absl::Status s = CheckTimestamp("until", req->until()); !s.ok())
                               return s;
                             filter.until = FromTimestamp(req->until());
                           }
                           if (!v1::UsageGrouping_IsValid(req->by())) {
                             return absl::InvalidArgumentError(absl::StrCat(
                                 "by: ", static_cast<int>(req->by()), " is not a usage grouping"));
                           }
                           filter.by = req->by();
                           absl::StatusOr<UsageReport> report = ctx_.queries->Usage(filter);
                           if (!report.ok()) return report.status();
                           for (const UsageRow& r : report->rows) {
                             v1::UsageRow* row = resp->add_rows();
                             row->set_queue(r.queue);
                             row->set_owner(r.owner);
                             row->set_kind(r.kind);
                             row->set_slot_seconds(r.slot_seconds);
                             row->set_attempts(r.attempts);
                             row->set_jobs(r.jobs);
                             row->set_job_id(r.job_id);
                             row->set_gpu_seconds(r.gpu_seconds);
                             row->set_cpu_seconds(r.cpu_seconds);
                             row->set_peak_memory_bytes(r.peak_memory_bytes);
                             row->set_wall_seconds(r.wall_seconds);
                           }
                           for (v1::AttemptUsage& a : report->attempts)
                             *resp->add_attempts() = std::move(a);
                           if (req->has_since()) *resp->mutable_since() = req->since();
                           SetTimestamp(report->until, resp->mutable_until());
                           return absl::OkStatus();
                         });
}

}  // namespace trainctl::coordinator

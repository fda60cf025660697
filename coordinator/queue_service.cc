// QueueService: thin handlers over the QueueRegistry (which persists, then
// updates memory) and the JobManager's per-queue usage, on the loop.
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/service_support.h"
#include "coordinator/services.h"

namespace trainctl::coordinator {
namespace {

absl::Status NoRegistry() {
  return absl::FailedPreconditionError("this coordinator serves no queues");
}

v1::QueueStatus StatusOf(const v1::Queue& queue, const std::map<std::string, QueueUsage>& usages) {
  v1::QueueStatus st;
  *st.mutable_queue() = queue;
  auto it = usages.find(queue.name());
  if (it != usages.end()) {
    st.set_used_gpu(it->second.used_gpu);
    st.set_used_cpu(it->second.used_cpu);
    st.set_pending_jobs(it->second.pending_jobs);
    st.set_running_jobs(it->second.running_jobs);
  }
  return st;
}

}  // namespace

grpc::ServerUnaryReactor* QueueServiceImpl::CreateQueue(grpc::CallbackServerContext* ctx,
                                                        const v1::CreateQueueRequest* req, v1::Queue* resp) {
  return UnaryOnLoop(ctx_, ctx, "CreateQueue", [this, req, resp](const Principal&) -> absl::Status {
    if (ctx_.queues == nullptr) return NoRegistry();
    // A new quota applies from a pass made now.
    absl::Status s = MoveInto(ctx_.queues->Create(req->queue(), req->update()), resp);
    if (s.ok()) ctx_.jobs->Schedule();
    return s;
  });
}

grpc::ServerUnaryReactor* QueueServiceImpl::GetQueue(grpc::CallbackServerContext* ctx,
                                                     const v1::GetQueueRequest* req, v1::QueueStatus* resp) {
  return UnaryOnLoop(ctx_, ctx, "GetQueue", [this, req, resp](const Principal&) -> absl::Status {
    if (ctx_.queues == nullptr) return NoRegistry();
    const v1::Queue* queue = ctx_.queues->Find(req->name());
    if (queue == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("no queue named '", req->name(), "' (defined: ", ctx_.queues->NameList(), ")"));
    }
    *resp = StatusOf(*queue, ctx_.jobs->QueueUsages());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QueueServiceImpl::ListQueues(grpc::CallbackServerContext* ctx,
                                                       const v1::ListQueuesRequest*, v1::ListQueuesResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "ListQueues", [this, resp](const Principal&) -> absl::Status {
    if (ctx_.queues == nullptr) return NoRegistry();
    const std::map<std::string, QueueUsage> usages = ctx_.jobs->QueueUsages();
    for (const v1::Queue& q : ctx_.queues->List()) *resp->add_queues() = StatusOf(q, usages);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QueueServiceImpl::DeleteQueue(grpc::CallbackServerContext* ctx,
                                                        const v1::DeleteQueueRequest* req, v1::DeleteQueueResponse*) {
  return UnaryOnLoop(ctx_, ctx, "DeleteQueue", [this, req](const Principal&) -> absl::Status {
    if (ctx_.queues == nullptr) return NoRegistry();
    const std::map<std::string, QueueUsage> usages = ctx_.jobs->QueueUsages();
    auto it = usages.find(req->name());
    const QueueUsage use = it == usages.end() ? QueueUsage{} : it->second;
    return ctx_.queues->Delete(req->name(), use.pending_jobs, use.running_jobs);
  });
}

}  // namespace trainctl::coordinator

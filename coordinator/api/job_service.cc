// JobService, but FetchArtifact (artifact_fetch_service.cc): submit, get,
// list, cancel and metric pages as unary calls answered on the loop, and the
// WatchJob / GetLogs streams fed by the MetricsHub.
//
// Threading: handlers authenticate on the gRPC thread and post the rest to
// the loop; a stream's subscription state is loop-only, its outgoing queue
// (QueuedWriter) is guarded by its own mutex.
#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/api/telemetry_batcher.h"

namespace trainctl::coordinator {

namespace {

// A server-streaming reactor with a bounded queue: Push() never blocks; when
// the queue is full the oldest item is dropped and counted.
template <typename T>
class QueuedWriter : public grpc::ServerWriteReactor<T> {
 public:
  explicit QueuedWriter(size_t max_queued) : max_queued_(max_queued) {}

  // Queues an item; returns the number dropped so far.
  void Push(T item) {
    absl::MutexLock lock(&mu_);
    if (done_writing_) return;
    if (queue_.size() >= max_queued_) {
      queue_.pop_front();
      ++skipped_;
      OnSkipped(skipped_);
    }
    queue_.push_back(std::move(item));
    MaybeWriteLocked();
  }

  // Drops what is queued and finishes with `status` as soon as no write is
  // in flight: nothing more goes to a caller whose token lapsed.
  void FinishNow(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    queue_.clear();
    done_writing_ = true;
    final_status_ = std::move(status);
    MaybeWriteLocked();
  }

  // Sends what is queued, then finishes with `status`.
  void FinishAfterQueue(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (done_writing_) return;
    done_writing_ = true;
    final_status_ = std::move(status);
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      done_writing_ = true;
      queue_.clear();
      if (!finished_) {
        finished_ = true;
        this->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      }
      return;
    }
    MaybeWriteLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    done_writing_ = true;
    queue_.clear();
    if (!finished_ && !writing_) {
      finished_ = true;
      this->Finish(grpc::Status::CANCELLED);
    }
  }

 protected:
  // Called (under the lock) when items were dropped; may annotate the next one.
  virtual void OnSkipped(int64_t total) {}
  T* Back() {
    mu_.AssertHeld();  // only from OnSkipped, under the lock
    return queue_.empty() ? nullptr : &queue_.back();
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      this->StartWrite(&current_);
      return;
    }
    if (done_writing_) {
      finished_ = true;
      this->Finish(final_status_);
    }
  }

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  T current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);

 protected:
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

// Tracks stream `reactor` of `who` in ctx.live (when set): a lapsed token
// finishes it at once, dropping what is queued. Returns the id to Remove
// (0 when untracked). Loop only.
template <typename Reactor>
LiveCalls::Id TrackCall(const ServiceContext& ctx, const Principal& who, Reactor* reactor)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
  if (ctx.live == nullptr) return 0;
  return ctx.live->Add(
      who, [reactor](const absl::Status& why) { reactor->FinishNow(ToGrpcStatus(why)); });
}

class WatchReactor final : public QueuedWriter<v1::JobUpdate>, public JobSubscriber {
 public:
  WatchReactor(ServiceContext ctx, std::string job_id)
      : QueuedWriter(ctx.max_queued_updates), ctx_(ctx), job_id_(std::move(job_id)) {}

  void Offer(const v1::JobUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    ctx_.loop->CheckInLoop("a JobService stream");
    v1::JobUpdate copy = u;
    Push(std::move(copy));
  }
  void JobEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    subscribed_ = false;
    FinishAfterQueue(grpc::Status::OK);
  }
  void set_subscribed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { subscribed_ = true; }
  // Ends the stream when `who`'s token lapses (loop).
  void Track(const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    live_ = TrackCall(ctx_, who, this);
  }

  void OnDone() override {
    // Unsubscribe on the loop (where Offer is called), then free.
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a JobService stream");
      if (subscribed_) ctx_.hub->Unsubscribe(job_id_, this);
      if (live_ != 0) ctx_.live->Remove(live_);
      delete this;
    });
  }

 protected:
  void OnSkipped(int64_t total) override {
    if (v1::JobUpdate* last = Back()) last->set_skipped(total);
  }

 private:
  ServiceContext ctx_;
  std::string job_id_;
  bool subscribed_ ABSL_GUARDED_BY(kLoop) = false;  // Loop only.
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;   // Loop only; 0: untracked.
};

// Whether a stream resuming after a break (req.after_attempt > 0) still
// owes `line` of `attempt` and `rank`: every line of a later attempt, none of
// an earlier one, and of the same attempt those numbered after the last
// one delivered (unnumbered lines, from an older worker, are sent again).
bool LineOwed(const v1::GetLogsRequest& req, int32_t attempt, int32_t rank,
              const v1::LogLine& line) {
  if (req.after_attempt() == 0 || attempt > req.after_attempt()) return true;
  if (attempt < req.after_attempt()) return false;
  if (line.seq() == 0) return true;
  auto it = req.after_seq().find(rank);
  return it == req.after_seq().end() || line.seq() > it->second;
}

class LogsReactor final : public QueuedWriter<v1::LogChunk>, public LogSubscriber {
 public:
  LogsReactor(ServiceContext ctx, v1::GetLogsRequest req)
      : QueuedWriter(ctx.max_queued_updates), ctx_(ctx), req_(std::move(req)) {}

  void Offer(const v1::LogChunk& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    ctx_.loop->CheckInLoop("a JobService stream");
    // Following the latest attempt (attempt 0 asked): move on to a restart's
    // new attempt; lines of older attempts that arrive late stay out.
    if (req_.attempt() == 0 && c.attempt() > attempt_) attempt_ = c.attempt();
    if (c.attempt() != attempt_) return;
    if (req_.has_rank() && c.rank() != req_.rank()) return;
    // A resumed stream: past the lines it had, every chunk goes as it is.
    const auto owed = [&](const v1::LogLine& l) {
      return LineOwed(req_, c.attempt(), c.rank(), l);
    };
    if (std::all_of(c.lines().begin(), c.lines().end(), owed)) {
      Push(c);
      return;
    }
    v1::LogChunk rest = c;
    rest.clear_lines();
    for (const v1::LogLine& l : c.lines()) {
      if (owed(l)) *rest.add_lines() = l;
    }
    if (rest.lines_size() > 0 || rest.dropped_lines() > 0) Push(std::move(rest));
  }
  void JobEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) override {
    subscribed_ = false;
    FinishAfterQueue(grpc::Status::OK);
  }
  void Start(int32_t attempt, bool subscribe) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    attempt_ = attempt;
    subscribed_ = subscribe;
  }
  // Ends the stream when `who`'s token lapses (loop).
  void Track(const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    live_ = TrackCall(ctx_, who, this);
  }
  void OnDone() override {
    ctx_.loop->Post([this] {
      AssertOnLoop(ctx_.loop, "a JobService stream");
      if (subscribed_) ctx_.hub->UnsubscribeLogs(req_.job_id(), this);
      if (live_ != 0) ctx_.live->Remove(live_);
      delete this;
    });
  }

 private:
  ServiceContext ctx_;
  v1::GetLogsRequest req_;
  int32_t attempt_ ABSL_GUARDED_BY(kLoop) = 0;
  bool subscribed_ ABSL_GUARDED_BY(kLoop) = false;
  LiveCalls::Id live_ ABSL_GUARDED_BY(kLoop) = 0;  // Loop only; 0: untracked.
};

// A server stream about one job (WatchJob, GetLogs): authenticates `call`
// here, on the gRPC thread (refused: the stream finishes with why); then, on
// the loop, reads the job and hands it to `start`, or finishes with the
// reason there is no such job. `start` reads what the store holds (history,
// backlog) and subscribes to the hub in the same loop turn, and both run
// with every committed telemetry group published
// (TelemetryBatcher::ReadPublished): a group is committed off the loop and
// published on it after, and a row the store returned must not reach the
// new subscriber a second time. No gap, no duplicate.
template <typename Reactor, typename Start>
Reactor* OpenJobStream(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                       absl::string_view call, Reactor* reactor, std::string job_id, Start start) {
  absl::StatusOr<Principal> who = Caller(c, ctx, call);
  if (!who.ok()) {
    reactor->FinishAfterQueue(ToGrpcStatus(who.status()));
    return reactor;
  }
  c.loop->Post([loop = c.loop, queries = c.queries, batcher = c.batcher, reactor,
                who = *std::move(who), job_id = std::move(job_id), start = std::move(start)] {
    AssertOnLoop(loop, "a JobService stream");
    // Tracked before anything is sent: a stream of a token revoked from
    // here on ends (OnDone untracks it, on the loop, after this closure).
    reactor->Track(who);
    auto open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
      absl::StatusOr<v1::Job> job = queries->Get(job_id);
      if (!job.ok()) {
        reactor->FinishAfterQueue(ToGrpcStatus(job.status()));
        return;
      }
      start(*job);
    };
    if (batcher != nullptr) {
      batcher->ReadPublished(open);
    } else {
      open();
    }
  });
  return reactor;
}

}  // namespace

absl::StatusOr<v1::GetMetricsResponse> GetMetricsPage(const JobQueries& queries,
                                                      const v1::GetMetricsRequest& req) {
  TRAINCTL_RETURN_IF_ERROR(queries.Get(req.job_id()).status());
  MetricPageQuery q;
  q.job_id = req.job_id();
  if (req.has_rank()) {
    if (req.rank() < 0)
      return absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(), " is negative"));
    q.rank = req.rank();
  }
  if (!v1::MetricPoint::Kind_IsValid(req.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: ", req.kind(), " is not a MetricPoint.Kind"));
  }
  q.kind = req.kind();
  if (!req.page_token().empty() &&
      (!absl::SimpleAtoi(req.page_token(), &q.after_id) || q.after_id < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token: '", req.page_token().substr(0, 40),
                                                   "' is not a token this coordinator returned"));
  }
  if (req.max_page_bytes() < 0)
    return absl::InvalidArgumentError("max_page_bytes: must not be negative");
  q.max_bytes = req.max_page_bytes() == 0
                    ? kMaxMetricPageBytes
                    : std::clamp<int64_t>(req.max_page_bytes(), 1024, kMaxMetricPageBytes);
  TRAINCTL_ASSIGN_OR_RETURN(MetricPage page, queries.MetricsPage(q));
  v1::GetMetricsResponse resp;
  v1::MetricBatch* batch = nullptr;
  for (StoredMetricPoint& p : page.points) {
    if (batch == nullptr || batch->attempt() != p.attempt) {
      batch = resp.add_batches();
      batch->set_job_id(req.job_id());
      batch->set_attempt(p.attempt);
    }
    *batch->add_points() = std::move(p.point);
  }
  if (page.more) resp.set_next_page_token(absl::StrCat(page.points.back().id));
  resp.set_resume_token(page.points.empty() ? req.page_token()
                                            : absl::StrCat(page.points.back().id));
  return resp;
}

// --- JobService ------------------------------------------------------------------

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx,
                                                    const v1::SubmitJobRequest* req,
                                                    v1::SubmitJobResponse* resp) {
  return UnaryOnLoop(
      ctx_, ctx, "SubmitJob",
      [this, req, resp](const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        // Resuming from a job is acting on it: a submitter resumes its own.
        if (!req->spec().resume_from().job().empty()) {
          absl::StatusOr<v1::Job> source = ctx_.queries->Get(req->spec().resume_from().job());
          if (source.ok())
            TRAINCTL_RETURN_IF_ERROR(MayActOnJob(who, "SubmitJob (resume_from)", *source));
        }
        // The job's queue and default priority (docs/queues.md); a dry run is
        // refused what a submit would be.
        v1::JobSpec spec = req->spec();
        if (ctx_.queues != nullptr)
          TRAINCTL_RETURN_IF_ERROR(ResolveQueue(spec, who.role, who.queues, *ctx_.queues));
        TRAINCTL_RETURN_IF_ERROR(CheckSpecCode(*ctx_.store, spec));
        if (req->dry_run()) return MoveInto(ctx_.queries->DryRun(spec), resp);
        return MoveInto(ctx_.jobs->Submit(spec, who.name, who.token_id, req->request_id()),
                        resp->mutable_job());
      });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                 const v1::GetJobRequest* req, v1::Job* resp) {
  return UnaryOnLoop(ctx_, ctx, "GetJob",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       return MoveInto(ctx_.queries->Get(req->job_id()), resp);
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "ListJobs",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       return MoveInto(ctx_.queries->List(*req), resp);
                     });
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                    const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  return UnaryOnLoop(ctx_, ctx, "CancelJob",
                     [this, req, resp](const Principal& who)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
                           absl::StatusOr<v1::Job> current = ctx_.queries->Get(req->job_id());
                           if (current.ok())
                             TRAINCTL_RETURN_IF_ERROR(MayActOnJob(who, "CancelJob", *current));
                           return MoveInto(ctx_.jobs->Cancel(req->job_id(), req->reason()), resp);
                         });
}

namespace {

// A submitter's bulk cancel follows CancelJob's rule (MayActOnJob): only the
// jobs its own token submitted match, and naming another owner is refused
// outright rather than matching nothing, so that the caller learns why.
absl::StatusOr<JobManager::CancelFilter> CancelFilterFor(const Principal& who,
                                                         const v1::CancelJobsRequest& req) {
  if (req.queue().empty() && req.owner().empty() && req.states().empty()) {
    return absl::InvalidArgumentError(
        "queue, owner, states: give at least one filter (CancelJobs never cancels every job "
        "unasked)");
  }
  JobManager::CancelFilter filter;
  filter.queue = req.queue();
  filter.owner = req.owner();
  for (int s : req.states()) filter.states.push_back(static_cast<v1::JobState>(s));
  if (who.role != v1::ROLE_ADMIN) {
    if (!req.owner().empty() && req.owner() != who.name) {
      return absl::PermissionDeniedError(
          absl::StrCat("CancelJobs: owner '", req.owner(), "' is not you ('", who.name,
                       "'); a submitter cancels only its own jobs (role admin cancels every job)"));
    }
    filter.owner_token_id = who.token_id;
  }
  return filter;
}

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::CancelJobs(grpc::CallbackServerContext* ctx,
                                                     const v1::CancelJobsRequest* req,
                                                     v1::CancelJobsResponse* resp) {
  return UnaryOnLoop(
      ctx_, ctx, "CancelJobs",
      [this, req, resp](const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        absl::StatusOr<JobManager::CancelFilter> filter = CancelFilterFor(who, *req);
        if (!filter.ok()) return filter.status();
        absl::StatusOr<std::vector<std::string>> ids =
            ctx_.jobs->CancelMatching(*filter, req->reason(), req->dry_run());
        if (!ids.ok()) return ids.status();
        for (std::string& id : *ids) resp->add_job_ids(std::move(id));
        resp->set_count(resp->job_ids_size());
        resp->set_dry_run(req->dry_run());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetMetrics(grpc::CallbackServerContext* ctx,
                                                     const v1::GetMetricsRequest* req,
                                                     v1::GetMetricsResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "GetMetrics",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       return MoveInto(GetMetricsPage(*ctx_.queries, *req), resp);
                     });
}

grpc::ServerWriteReactor<v1::JobUpdate>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                  const v1::WatchJobRequest* req) {
  auto* reactor = new WatchReactor(ctx_, req->job_id());
  auto start = [this, reactor,
                request = *req](const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    // History and subscription in one loop turn (see OpenJobStream).
    if (request.include_history()) {
      absl::StatusOr<std::vector<v1::Event>> events = ctx_.queries->Events(
          request.job_id(), std::max<int64_t>(0, request.after_event_seq()), 100000);
      if (events.ok()) {
        for (v1::Event& e : *events) {
          v1::JobUpdate u;
          *u.mutable_event() = std::move(e);
          reactor->Offer(u);
        }
      }
      absl::StatusOr<std::vector<v1::MetricPoint>> points =
          request.after_event_seq() > 0 ? std::vector<v1::MetricPoint>{}
                                        : ctx_.queries->Metrics(request.job_id(), 10000);
      if (points.ok() && !points->empty()) {
        v1::JobUpdate u;
        u.mutable_metrics()->set_job_id(request.job_id());
        for (v1::MetricPoint& p : *points) *u.mutable_metrics()->add_points() = std::move(p);
        reactor->Offer(u);
      }
    }
    v1::JobUpdate snap;
    *snap.mutable_job() = job;
    snap.mutable_job()->clear_attempts();
    reactor->Offer(snap);
    if (IsTerminal(job.state())) {
      reactor->FinishAfterQueue(grpc::Status::OK);
      return;
    }
    ctx_.hub->Subscribe(request.job_id(), reactor);
    reactor->set_subscribed();
  };
  return OpenJobStream(ctx_, ctx, "WatchJob", reactor, req->job_id(), std::move(start));
}

absl::Status LogsRequestError(const v1::GetLogsRequest& req, const v1::Job& job) {
  if (req.tail_lines() < 0) return absl::InvalidArgumentError("tail_lines: must be >= 0");
  if (req.after_attempt() < 0)
    return absl::InvalidArgumentError("after_attempt: must be >= 0 (0: not a resumption)");
  if (req.after_attempt() == 0 && !req.after_seq().empty()) {
    return absl::InvalidArgumentError(
        "after_seq: needs after_attempt (the attempt the numbers are of)");
  }
  const int attempts = job.attempts_size();
  if (req.attempt() < 0 || req.attempt() > attempts) {
    return absl::InvalidArgumentError(
        absl::StrCat("attempt: ", req.attempt(), " is out of range: job '", job.id(), "' has ",
                     attempts, " attempt(s)",
                     attempts > 0 ? absl::StrCat(" (1..", attempts, "; 0 = the latest)") : " yet"));
  }
  const int world = job.spec().world_size();
  if (req.has_rank() && (req.rank() < 0 || (world > 0 && req.rank() >= world))) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(), " is outside job '",
                                                   job.id(), "''s world: world_size ", world,
                                                   " (ranks 0..", world - 1, ")"));
  }
  return absl::OkStatus();
}

grpc::ServerWriteReactor<v1::LogChunk>* JobServiceImpl::GetLogs(grpc::CallbackServerContext* ctx,
                                                                const v1::GetLogsRequest* req) {
  auto* reactor = new LogsReactor(ctx_, *req);
  auto start = [this, reactor,
                request = *req](const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    absl::Status bad = LogsRequestError(request, job);
    if (!bad.ok()) {
      reactor->FinishAfterQueue(ToGrpcStatus(bad));
      return;
    }
    int32_t attempt = request.attempt() == 0 ? job.attempts_size() : request.attempt();
    std::optional<int32_t> rank;
    if (request.has_rank()) rank = request.rank();
    absl::StatusOr<std::vector<v1::LogLine>> lines =
        ctx_.queries->Logs(request.job_id(), attempt, rank, request.tail_lines());
    if (lines.ok()) {
      // A resumed stream: only what it has not delivered yet.
      lines->erase(std::remove_if(lines->begin(), lines->end(),
                                  [&](const v1::LogLine& l) {
                                    return !LineOwed(request, attempt, l.rank(), l);
                                  }),
                   lines->end());
      // Group consecutive lines of a rank into chunks.
      v1::LogChunk chunk;
      auto flush = [&] {
        if (chunk.lines_size() > 0) reactor->Push(chunk);
        chunk.Clear();
      };
      for (v1::LogLine& l : *lines) {
        if (chunk.lines_size() > 0 && (chunk.rank() != l.rank() || chunk.lines_size() >= 500))
          flush();
        chunk.set_job_id(request.job_id());
        chunk.set_attempt(attempt);
        chunk.set_rank(l.rank());
        *chunk.add_lines() = std::move(l);
      }
      flush();
    }
    bool follow = request.follow() && !IsTerminal(job.state()) && attempt == job.attempts_size();
    reactor->Start(attempt, follow);
    if (follow) {
      ctx_.hub->SubscribeLogs(request.job_id(), reactor);
    } else {
      reactor->FinishAfterQueue(ToGrpcStatus(lines.status()));
    }
  };
  return OpenJobStream(ctx_, ctx, "GetLogs", reactor, req->job_id(), std::move(start));
}

}  // namespace trainctl::coordinator

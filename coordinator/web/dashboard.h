// The web dashboard on the coordinator's HTTP port (--http-listen), beside
// /metrics: pages (jobs with state and progress; a job's live loss, eval
// accuracy and throughput charts, events and per-rank logs; workers with
// their slots and labels) and the JSON endpoints they poll:
//
//   GET  /api/jobs                          ListJobs (newest first)
//   GET  /api/jobs/ID?events_after=SEQ      GetJob + the job's events after SEQ
//   GET  /api/jobs/ID/metrics?page_token=T  GetMetrics (resume_token follows)
//   GET  /api/jobs/ID/logs?rank=R&attempt=A&tail=N   stored log lines
//   GET  /api/workers                       ListWorkers (busy slots filled)
//   GET  /api/queues                        ListQueues (quota, used slots,
//                                           pending and running jobs)
//
// Every page and endpoint but /login and /static/ needs a token with role
// admin, submitter or viewer, as the JobService reads do: `Authorization:
// Bearer SECRET`, or the HttpOnly cookie that the /login form sets (Secure
// over HTTPS). /metrics too, unless it is open (--metrics-open): its job
// ids, losses and refusal counters are not for anyone who can reach the
// port. After signing in, the browser goes back only to a path on this
// server (http::SafeRedirectPath). Refused tokens and sign-ins are logged,
// bounded per client address (RefusalLog). Answers
// reuse the services' code (JobQueries, StateStore, GetMetricsPage) on the
// control-plane loop; an HTTP thread waits for it at most 5 s (503 then).
//
// Thread-safe: handlers run on the HTTP server's threads and touch manager
// state only through closures posted to the loop.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/event_loop.h"
#include "common/http_server.h"
#include "coordinator/auth/sign_in_codes.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/core/refusal_log.h"
#include "coordinator/jobs/job_queries.h"
#include "coordinator/queues/queue_registry.h"
#include "coordinator/store/state_store.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {

class Dashboard {
 public:
  // The cookie /login sets (HttpOnly, SameSite=Strict): the token's secret.
  static constexpr char kCookie[] = "trainctl_token";

  struct Deps {
    EventLoop* loop;
    StateStore* store;
    WorkerRegistry* registry;
    // The jobs, their events and logs, busy slots, queue usage.
    const JobQueries* queries;
    TokenAuthority* auth;
    // Where refused tokens and sign-ins are logged; nullptr: not logged.
    RefusalLog* refusals = nullptr;
    // HTTPS: the sign-in cookie gets the Secure attribute.
    bool secure_cookie = false;
    // One-time sign-in codes (GET /signin?code=); nullptr: none taken.
    SignInCodes* sign_in = nullptr;
    // The defined queues (/queues, /api/queues); nullptr: none listed.
    const QueueRegistry* queues = nullptr;
  };
  explicit Dashboard(Deps deps) : deps_(deps) {}

  // Registers every page and endpoint on `http` (before it starts).
  void Register(HttpServer& http);
  // Registers GET /metrics answering `page()`: needs a viewer token (or
  // better) unless `open`.
  void RegisterMetrics(HttpServer& http, std::function<std::string()> page, bool open);

 private:
  using Reply = HttpServer::Reply;
  using Request = HttpServer::Request;

  // The caller, from the Authorization header or the cookie; Unauthenticated
  // or PermissionDenied (with the reason) otherwise, noted in the refusal
  // log as refused `what` when a token was sent.
  absl::StatusOr<Principal> Authenticate(const Request& req,
                                         absl::string_view what = "request") const;
  // A page: the app, or a redirect to /login when not signed in.
  Reply Page(const Request& req) const;
  Reply Login(const Request& req) const;
  // GET /signin?code=: a one-time code (SignInCodes) for the cookie.
  Reply SignIn(const Request& req) const;
  // The sign-in cookie holding `secret`, then to `next`.
  Reply SignedIn(const std::string& secret, const std::string& next) const;
  // An API endpoint: authenticates, runs `answer` on the loop, replies JSON.
  Reply Api(const Request& req, std::function<absl::StatusOr<std::string>()> answer) const;

  absl::StatusOr<std::string> Jobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<std::string> Job(const std::string& id, const Request& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<std::string> Metrics(const std::string& id, const Request& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<std::string> Logs(const std::string& id, const Request& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<std::string> Workers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  absl::StatusOr<std::string> Queues() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  Deps deps_;
};

}  // namespace trainctl::coordinator

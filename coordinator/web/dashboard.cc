#include "coordinator/web/dashboard.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/http_request.h"
#include "common/status_macros.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"
#include "coordinator/queues/queue_status.h"
#include "coordinator/web/web_assets.h"

namespace trainctl::coordinator {
namespace {

// Largest `tail` a logs request may ask for.
constexpr int64_t kMaxLogLines = 5000;
// Events returned per request (the page asks again from the last seq).
constexpr int64_t kMaxEvents = 1000;

std::string ToJson(const google::protobuf::Message& msg) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(msg, &json, options);
  return json;
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

int HttpStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

HttpServer::Reply Json(int status, std::string body) {
  return {status, "application/json", std::move(body), {{"Cache-Control", "no-store"}}};
}

HttpServer::Reply Error(const absl::Status& s) {
  return Json(HttpStatus(s), absl::StrCat("{\"error\":", JsonString(s.message()), "}"));
}

HttpServer::Reply Redirect(const std::string& to,
                           std::vector<std::pair<std::string, std::string>> headers = {}) {
  headers.emplace_back("Location", to);
  return {303, "text/plain; charset=utf-8", "see " + to + "\n", std::move(headers)};
}

HttpServer::Reply Asset(const std::string& path) {
  const web::Asset* a = web::FindAsset(path);
  if (a == nullptr) return {404, "text/plain; charset=utf-8", "not found\n", {}};
  return {200, a->content_type, std::string(a->bytes()), {{"Cache-Control", "no-cache"}}};
}

// An optional non-negative integer parameter; InvalidArgument naming it.
absl::StatusOr<std::optional<int64_t>> IntParam(const HttpServer::Request& req,
                                                const std::string& name) {
  if (!req.HasParam(name) || req.Param(name).empty()) return std::optional<int64_t>();
  std::optional<int64_t> v = http::ParseNonNegativeInt(req.Param(name));
  if (!v) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", req.Param(name).substr(0, 40),
                                                   "' is not a non-negative integer"));
  }
  return v;
}

}  // namespace

absl::StatusOr<Principal> Dashboard::Authenticate(const Request& req,
                                                  absl::string_view what) const {
  std::string header = req.Header("Authorization");
  if (header.empty()) {
    std::string secret = http::CookieValue(req.Header("Cookie"), kCookie);
    if (!secret.empty()) header = "Bearer " + secret;
  }
  absl::StatusOr<Principal> who = deps_.auth->Authenticate(header);
  if (who.ok()) {
    absl::Status allowed = TokenAuthority::Authorize(
        *who, "dashboard", {v1::ROLE_ADMIN, v1::ROLE_SUBMITTER, v1::ROLE_VIEWER});
    if (!allowed.ok()) who = allowed;
  }
  // A browser that was never signed in is not knocking; a token refused is.
  if (!who.ok() && !header.empty() && deps_.refusals != nullptr) {
    deps_.refusals->Note(req.remote_addr,
                         {{"what", std::string(what)},
                          {"path", req.path.substr(0, 100)},
                          {"reason", std::string(who.status().message()).substr(0, 300)}});
  }
  return who;
}

HttpServer::Reply Dashboard::Page(const Request& req) const {
  if (!Authenticate(req, "page").ok()) return Redirect("/login?next=" + http::UrlEncode(req.path));
  return Asset("/index.html");
}

namespace {

// Why a POST comes from another site, or "" (login CSRF, #45 item 6): a
// browser says where a request comes from (Sec-Fetch-Site; Origin, which
// must name this server as the Host header does). A request with neither
// is not a browser's cross-site form (curl, a script) and is judged by its
// token alone.
std::string CrossSite(const HttpServer::Request& req) {
  // A browser that sends Fetch Metadata is believed: pages cannot set it.
  const std::string site = req.Header("Sec-Fetch-Site");
  if (!site.empty()) {
    return site == "same-origin" || site == "none" ? ""
                                                   : absl::StrCat("Sec-Fetch-Site is '", site, "'");
  }
  // Older browsers: Origin (the dashboard's Referrer-Policy: same-origin
  // keeps its own forms' Origin real; "null" is refused).
  const std::string origin = req.Header("Origin");
  if (origin.empty()) return "";
  const size_t scheme = origin.find("://");
  const std::string host = req.Header("Host");
  if (scheme == std::string::npos || host.empty() || origin.substr(scheme + 3) != host) {
    return "its Origin is not this server";
  }
  return "";
}

}  // namespace

HttpServer::Reply Dashboard::Login(const Request& req) const {
  if (const std::string why = CrossSite(req); !why.empty()) {
    return {403,
            "text/plain; charset=utf-8",
            absl::StrCat("sign-in refused: a form posted from another site (", why,
                         "); open /login on this server\n"),
            {}};
  }
  Request with_token;
  with_token.path = req.path;
  with_token.remote_addr = req.remote_addr;
  with_token.headers.emplace("Authorization", "Bearer " + req.Param("token"));
  absl::StatusOr<Principal> who = Authenticate(with_token, "sign-in");
  if (!who.ok()) {
    std::string why;
    for (char c : who.status().message()) {
      if (c == '<')
        why += "&lt;";
      else if (c == '>')
        why += "&gt;";
      else if (c == '&')
        why += "&amp;";
      else
        why += c;
    }
    return {401,
            "text/html; charset=utf-8",
            absl::StrCat("<!doctype html><meta charset=\"utf-8\"><title>trainctl: sign in</title>"
                         "<p id=\"error\">Token refused: ",
                         why, "</p><p><a href=\"/login\">Try again</a></p>\n"),
            {}};
  }
  // The secret as it authenticated (trimmed).
  return SignedIn(std::string(absl::StripAsciiWhitespace(req.Param("token"))), req.Param("next"));
}

HttpServer::Reply Dashboard::SignedIn(const std::string& secret, const std::string& next) const {
  // Never a CR, LF or ';' into the header.
  if (secret.find_first_of(";\r\n\t ,\"\\") != std::string::npos) {
    return Error(absl::InvalidArgumentError("token: not a token this coordinator issues"));
  }
  // Only a path on this server: never an open redirect.
  return Redirect(
      http::SafeRedirectPath(next),
      {{"Set-Cookie", absl::StrCat(kCookie, "=", secret, "; Path=/; HttpOnly; SameSite=Strict",
                                   deps_.secure_cookie ? "; Secure" : "")}});
}

HttpServer::Reply Dashboard::SignIn(const Request& req) const {
  absl::StatusOr<std::string> secret =
      deps_.sign_in == nullptr ? absl::NotFoundError("this dashboard takes no sign-in links")
                               : deps_.sign_in->Redeem(req.Param("code"));
  // Still a token the dashboard lets in (not revoked since).
  if (secret.ok()) {
    Request with_token;
    with_token.path = req.path;
    with_token.remote_addr = req.remote_addr;
    with_token.headers.emplace("Authorization", "Bearer " + *secret);
    if (absl::Status s = Authenticate(with_token, "sign-in link").status(); !s.ok()) secret = s;
  } else if (deps_.refusals != nullptr) {
    deps_.refusals->Note(req.remote_addr, {{"what", "sign-in link"},
                                           {"reason", std::string(secret.status().message())}});
  }
  if (!secret.ok()) {
    return {401,
            "text/html; charset=utf-8",
            absl::StrCat("<!doctype html><meta charset=\"utf-8\"><title>trainctl: sign in</title>"
                         "<p id=\"error\">",
                         secret.status().code() == absl::StatusCode::kNotFound
                             ? "This sign-in link is unknown, used or expired"
                             : "The token behind this link is no longer accepted",
                         ": run <code>trainctl dashboard</code> again.</p><p><a "
                         "href=\"/login\">Sign in with a token</a></p>\n"),
            {}};
  }
  return SignedIn(*secret, req.Param("next"));
}

HttpServer::Reply Dashboard::Api(const Request& req,
                                 std::function<absl::StatusOr<std::string>()> answer) const {
  if (absl::StatusOr<Principal> who = Authenticate(req, "api"); !who.ok())
    return Error(who.status());
  // The answer is computed on the loop; this thread waits, bounded. What the
  // closure writes outlives a wait that gave up.
  struct Shared {
    absl::StatusOr<std::string> result = absl::UnavailableError("not run");
    absl::Notification done;
  };
  auto shared = std::make_shared<Shared>();
  deps_.loop->Post([loop = deps_.loop, shared, answer = std::move(answer)] {
    AssertOnLoop(loop, "a dashboard request");
    shared->result = answer();
    shared->done.Notify();
  });
  if (!shared->done.WaitForNotificationWithTimeout(absl::Seconds(5))) {
    return Error(
        absl::UnavailableError("the coordinator's control loop did not answer within 5 s; retry"));
  }
  if (!shared->result.ok()) return Error(shared->result.status());
  return Json(200, *shared->result);
}

absl::StatusOr<std::string> Dashboard::Jobs() const {
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  TRAINCTL_ASSIGN_OR_RETURN(v1::ListJobsResponse jobs, deps_.queries->List(list));
  return ToJson(jobs);
}

absl::StatusOr<std::string> Dashboard::Job(const std::string& id, const Request& req) const {
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<int64_t> after, IntParam(req, "events_after"));
  TRAINCTL_ASSIGN_OR_RETURN(v1::Job job, deps_.queries->Get(id));
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<v1::Event> events,
                            deps_.queries->Events(id, after.value_or(0), kMaxEvents));
  std::string out = absl::StrCat("{\"job\":", ToJson(job), ",\"events\":[");
  for (size_t i = 0; i < events.size(); ++i) absl::StrAppend(&out, i ? "," : "", ToJson(events[i]));
  return out + "]}";
}

absl::StatusOr<std::string> Dashboard::Metrics(const std::string& id, const Request& req) const {
  v1::GetMetricsRequest get;
  get.set_job_id(id);
  get.set_page_token(req.Param("page_token"));
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<int64_t> rank, IntParam(req, "rank"));
  if (rank) get.set_rank(static_cast<int32_t>(*rank));
  TRAINCTL_ASSIGN_OR_RETURN(v1::GetMetricsResponse page, GetMetricsPage(*deps_.queries, get));
  return ToJson(page);
}

absl::StatusOr<std::string> Dashboard::Logs(const std::string& id, const Request& req) const {
  TRAINCTL_ASSIGN_OR_RETURN(v1::Job job, deps_.queries->Get(id));
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<int64_t> attempt, IntParam(req, "attempt"));
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<int64_t> rank, IntParam(req, "rank"));
  TRAINCTL_ASSIGN_OR_RETURN(std::optional<int64_t> tail, IntParam(req, "tail"));
  v1::GetLogsRequest check;
  if (attempt) check.set_attempt(static_cast<int32_t>(std::min<int64_t>(*attempt, INT32_MAX)));
  if (rank) check.set_rank(static_cast<int32_t>(std::min<int64_t>(*rank, INT32_MAX)));
  TRAINCTL_RETURN_IF_ERROR(LogsRequestError(check, job));
  const int32_t attempts = job.attempts_size();
  const int32_t world = job.spec().world_size();
  const int64_t lines_wanted = std::min(tail.value_or(500), kMaxLogLines);
  const int32_t which = attempt && *attempt > 0 ? static_cast<int32_t>(*attempt) : attempts;
  std::vector<v1::LogLine> lines;
  if (which > 0) {
    std::optional<int32_t> only;
    if (rank) only = static_cast<int32_t>(*rank);
    TRAINCTL_ASSIGN_OR_RETURN(lines, deps_.queries->Logs(id, which, only, lines_wanted));
  }
  std::string out = absl::StrCat("{\"attempt\":", which, ",\"attempts\":", attempts,
                                 ",\"world_size\":", world, ",\"lines\":[");
  for (size_t i = 0; i < lines.size(); ++i) absl::StrAppend(&out, i ? "," : "", ToJson(lines[i]));
  return out + "]}";
}

absl::StatusOr<std::string> Dashboard::Workers() const {
  v1::ListWorkersResponse resp;
  for (v1::Worker& w : deps_.registry->List(/*include_gone=*/false)) {
    for (int s : deps_.queries->BusySlots(w.id())) w.add_busy_slots(s);
    *resp.add_workers() = std::move(w);
  }
  FillStoreHealth(deps_.store, resp.mutable_store());
  return ToJson(resp);
}

absl::StatusOr<std::string> Dashboard::Queues() const {
  v1::ListQueuesResponse resp;
  if (deps_.queues != nullptr) {
    for (v1::QueueStatus& st :
         QueueStatusesOf(deps_.queues->List(), deps_.queries->QueueUsages())) {
      *resp.add_queues() = std::move(st);
    }
  }
  return ToJson(resp);
}

void Dashboard::RegisterMetrics(HttpServer& http, std::function<std::string()> page, bool open) {
  http.HandleRequest("GET", "/metrics", [this, page = std::move(page), open](const Request& req) {
    if (!open) {
      if (absl::StatusOr<Principal> who = Authenticate(req, "metrics"); !who.ok()) {
        Reply r = Error(who.status());
        // Prometheus sends the token with `authorization: {credentials_file: ...}`.
        if (r.status == 401)
          r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"trainctl\"");
        return r;
      }
    }
    return Reply{200, "text/plain; version=0.0.4; charset=utf-8", page(), {}};
  });
}

void Dashboard::Register(HttpServer& http) {
  http.HandleRequest("GET", "/", [this](const Request& req) { return Page(req); });
  http.HandleRequest("GET", "/jobs/[^/]+", [this](const Request& req) { return Page(req); });
  http.HandleRequest("GET", "/workers", [this](const Request& req) { return Page(req); });
  http.HandleRequest("GET", "/queues", [this](const Request& req) { return Page(req); });
  http.HandleRequest("GET", "/login", [](const Request&) { return Asset("/login.html"); });
  http.HandleRequest("POST", "/login", [this](const Request& req) { return Login(req); });
  http.HandleRequest("GET", "/signin", [this](const Request& req) { return SignIn(req); });
  http.HandleRequest("POST", "/logout", [](const Request&) {
    return Redirect(
        "/login",
        {{"Set-Cookie", absl::StrCat(kCookie, "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")}});
  });
  http.HandleRequest("GET", "/static/[A-Za-z0-9._-]+",
                     [](const Request& req) { return Asset(req.path); });

  http.HandleRequest("GET", "/api/jobs", [this](const Request& req) {
    return Api(req, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return Jobs(); });
  });
  http.HandleRequest("GET", "/api/jobs/([^/]+)", [this](const Request& req) {
    return Api(req, [this, req]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return Job(req.matches[0], req); });
  });
  http.HandleRequest("GET", "/api/jobs/([^/]+)/metrics", [this](const Request& req) {
    return Api(req, [this, req]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
      return Metrics(req.matches[0], req);
    });
  });
  http.HandleRequest("GET", "/api/jobs/([^/]+)/logs", [this](const Request& req) {
    return Api(req, [this, req]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return Logs(req.matches[0], req); });
  });
  http.HandleRequest("GET", "/api/workers", [this](const Request& req) {
    return Api(req, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return Workers(); });
  });
  http.HandleRequest("GET", "/api/queues", [this](const Request& req) {
    return Api(req, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) { return Queues(); });
  });
}

}  // namespace trainctl::coordinator

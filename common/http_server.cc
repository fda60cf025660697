#include "common/http_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainctl {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {
  // Few, short requests (a scraper every few seconds).
  server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, Handler handler) {
  server_->Get(path, [handler = std::move(handler)](const httplib::Request&, httplib::Response& res) {
    Reply r = handler();
    res.status = r.status;
    res.set_content(r.body, r.content_type.c_str());
  });
}

absl::StatusOr<std::string> HttpServer::Start(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http-listen: '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int bound = port == 0 ? server_->bind_to_any_port(host.c_str()) : (server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (bound <= 0) return absl::UnavailableError(absl::StrCat("--http-listen: cannot listen on ", listen));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs (and the
  // thread would then never end): return only once it runs.
  for (absl::Time deadline = absl::Now() + absl::Seconds(5); !server_->is_running() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::StrCat(listen.substr(0, colon), ":", bound);
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace trainctl

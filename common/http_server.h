// A small HTTP server for the daemons' /metrics page and the coordinator's
// dashboard: cpp-httplib (Debian libcpp-httplib-dev) on its own threads,
// never on the caller's event loop. Each request to a registered path calls
// its handler on an HTTP thread; a handler that needs loop state posts to
// the loop and waits for a snapshot (see the coordinator's and worker's
// /metrics, coordinator/web/dashboard.cc).
//
// Connections are served by a fixed pool of threads (kThreads): a browser
// holding keep-alive connections or a scraper never makes the server spawn
// more; keep-alive is short so that idle connections give their thread back.
//
// Every response carries the headers of kSecurityHeaders (a CSP allowing
// only this origin's scripts and styles, no framing, no MIME sniffing), 404s
// of unknown paths included. EnableTls serves HTTPS (cpp-httplib's
// SSLServer; Debian builds the library with OpenSSL).
//
// Thread-safe: EnableTls, then Handle*, before Start; Start and Stop from
// one owner thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace trainctl {

class HttpServer {
 public:
  // Threads serving connections (each holds one connection at a time).
  static constexpr int kThreads = 8;

  struct Request {
    std::string method;
    std::string path;
    // The client's IP address as the socket says.
    std::string remote_addr;
    // The pattern's capture groups, in order.
    std::vector<std::string> matches;
    // Query parameters (and, for a POSTed form, its fields).
    std::multimap<std::string, std::string> params;
    // Header names as sent (look up with Header(), case-insensitive).
    std::multimap<std::string, std::string> headers;
    std::string body;

    // The first value of a header or parameter; "" when absent.
    std::string Header(const std::string& name) const;
    std::string Param(const std::string& name) const;
    bool HasParam(const std::string& name) const { return params.count(name) > 0; }
  };
  struct Reply {
    Reply() = default;
    Reply(int status, std::string content_type, std::string body,
          std::vector<std::pair<std::string, std::string>> headers = {})
        : status(status),
          content_type(std::move(content_type)),
          body(std::move(body)),
          headers(std::move(headers)) {}

    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
    // Extra response headers (Set-Cookie, Location, Cache-Control...).
    std::vector<std::pair<std::string, std::string>> headers;
  };
  using Handler = std::function<Reply()>;
  using RequestHandler = std::function<Reply(const Request&)>;

  // Sent with every response. The dashboard loads only its own scripts,
  // styles and JSON (no inline script or style attribute, no eval); no
  // other site may frame it (clickjacking the sign-in form).
  static const std::vector<std::pair<std::string, std::string>>& SecurityHeaders();

  HttpServer();
  ~HttpServer();  // Stops.

  // Serves HTTPS with this certificate chain and key (PEM contents). Before
  // any Handle*; InvalidArgument when the PEM does not load.
  absl::Status EnableTls(const std::string& cert_pem, const std::string& key_pem);
  bool tls() const { return tls_; }
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // GET `path` answers handler(); other paths are 404.
  void Handle(const std::string& path, Handler handler);
  // `method` ("GET" or "POST") of a path matching the regular expression
  // `pattern` (whole path) answers handler(request).
  void HandleRequest(const std::string& method, const std::string& pattern, RequestHandler handler);
  // Binds "HOST:PORT" (port 0: a free one) and serves on a thread. Returns
  // the bound "HOST:PORT". InvalidArgument naming the flag value for a bad
  // address, Unavailable when it cannot bind.
  absl::StatusOr<std::string> Start(const std::string& listen);
  void Stop();

 private:
  // The server's settings (thread pool, timeouts, limits, headers).
  void Configure();

  std::unique_ptr<httplib::Server> server_;
  bool tls_ = false;
  std::thread thread_;
};

}  // namespace trainctl

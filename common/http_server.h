// A small HTTP server for the daemons' /metrics page (and later pages):
// cpp-httplib (Debian libcpp-httplib-dev) on its own threads, never on the
// caller's event loop. Each GET of a registered path calls its handler on
// an HTTP thread; a handler that needs loop state posts to the loop and
// waits for a snapshot (see the coordinator's and worker's /metrics).
//
// Thread-safe: Handle before Start; Start and Stop from one owner thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace trainctl {

class HttpServer {
 public:
  struct Reply {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  using Handler = std::function<Reply()>;

  HttpServer();
  ~HttpServer();  // Stops.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // GET `path` answers handler(); other paths are 404.
  void Handle(const std::string& path, Handler handler);
  // Binds "HOST:PORT" (port 0: a free one) and serves on a thread. Returns
  // the bound "HOST:PORT". InvalidArgument naming the flag value for a bad
  // address, Unavailable when it cannot bind.
  absl::StatusOr<std::string> Start(const std::string& listen);
  void Stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace trainctl

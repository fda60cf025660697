#include "worker/daemon/route_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace trainctl::worker {

absl::StatusOr<std::string> RouteSourceAddress(const std::string& coordinator) {
  std::string host = coordinator, port = "7070";
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("'", coordinator, "': unclosed '['"));
    if (close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':');
             colon != std::string::npos && host.find(':') == colon) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::NotFoundError(absl::StrCat("'", host, "' does not resolve: ", gai_strerror(rc)));
  }
  // IPv4 first: the address is joined with a port as HOST:PORT (the
  // rendezvous store's address), which an IPv6 literal would make ambiguous.
  std::vector<const addrinfo*> order;
  for (int family : {AF_INET, AF_INET6}) {
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      if (a->ai_family == family) order.push_back(a);
    }
  }
  std::string error = "no address";
  std::string ip;
  for (const addrinfo* a : order) {
    if (!ip.empty()) break;
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* raw =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) {
        absl::string_view v = text;
        absl::ConsumePrefix(&v, "::ffff:");  // an IPv4 route on a dual-stack socket
        ip = std::string(v);
      }
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (ip.empty()) return absl::UnavailableError(absl::StrCat("no route to '", host, "': ", error));
  return ip;
}

}  // namespace trainctl::worker

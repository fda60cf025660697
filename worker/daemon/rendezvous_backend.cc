#include "worker/daemon/rendezvous_backend.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/nccl_id.h"

namespace trainctl::worker {
namespace {

namespace rk = rankproto::run_keys;

// A TCP port held for rank 0's store: bound (SO_REUSEADDR, not listening) so
// that no other process is handed it, until the store listens on it (the
// store sets SO_REUSEADDR too, which lets it bind while nobody listens).
class ReservedPort {
 public:
  ReservedPort() = default;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort() { Release(); }

  // Binds a free port on every interface; false when the host refuses.
  bool Reserve() {
    Release();
    for (int family : {AF_INET6, AF_INET}) {
      int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      int on = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      sockaddr_storage addr{};
      socklen_t len;
      if (family == AF_INET6) {
        int off = 0;  // dual stack: the store may listen on IPv4 or IPv6
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        len = sizeof(sockaddr_in6);
      } else {
        auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
        len = sizeof(sockaddr_in);
      }
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        fd_ = fd;
        port_ = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
        return true;
      }
      close(fd);
    }
    return false;
  }
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Gloo store and MASTER_PORT: a port on this host reserved for rank 0.
class ReservedPortRendezvous : public RendezvousBackend {
 public:
  // `rank_may_report`: when the host refuses a reservation, rank 0 picks its
  // own port and reports it (an engine rank can; a user's program cannot).
  explicit ReservedPortRendezvous(bool rank_may_report) : rank_may_report_(rank_may_report) {}

  absl::StatusOr<std::optional<v1::RendezvousInfo>> Produce(const std::string& address) override {
    if (!port_.Reserve()) {
      if (!rank_may_report_)
        return absl::UnavailableError("cannot reserve a MASTER_PORT on this host");
      return std::nullopt;  // Rank 0 picks a port and reports it.
    }
    reported_ = true;
    return Info(address, port_.port());
  }

  absl::StatusOr<std::optional<v1::RendezvousInfo>> RankListening(
      const std::string& address) override {
    port_.Release();  // The store listens on it now.
    if (reported_) return std::nullopt;
    const size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
        port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("store address '", address, "': not host:port"));
    }
    reported_ = true;
    v1::RendezvousInfo info = Info(address.substr(0, address.rfind(':')), port);
    info.set_gloo_store_address(address);
    return info;
  }

  void ConfigureRank(const std::optional<v1::RendezvousInfo>& info, bool rank_zero_here,
                     rankproto::FlatConfig& cfg) const override {
    if (!info.has_value()) {
      cfg[rk::kStoreAddress] = "";  // Rank 0 listens on a port of its choosing.
    } else if (!rank_zero_here) {
      cfg[rk::kStoreAddress] = info->gloo_store_address();
    } else {
      cfg[rk::kStorePort] = absl::StrCat(info->master_port());
    }
  }

 private:
  static v1::RendezvousInfo Info(const std::string& host, int port) {
    v1::RendezvousInfo info;
    info.set_gloo_store_address(absl::StrCat(host, ":", port));
    info.set_master_addr(host);
    info.set_master_port(port);
    return info;
  }

  const bool rank_may_report_;
  ReservedPort port_;
  // Produce or RankListening returned the info (it is reported once).
  bool reported_ = false;
};

// NCCL: the unique id is made here, where NCCL's bootstrap root then lives.
class NcclRendezvous : public RendezvousBackend {
 public:
  absl::StatusOr<std::optional<v1::RendezvousInfo>> Produce(const std::string& address) override {
    absl::StatusOr<std::string> id = GenerateNcclUniqueId();
    if (!id.ok()) return id.status();
    v1::RendezvousInfo info;
    info.set_nccl_unique_id(*id);
    info.set_master_addr(address);
    return info;
  }

  // An NCCL attempt's rank 0 hosts no store of the daemon's making.
  absl::StatusOr<std::optional<v1::RendezvousInfo>> RankListening(const std::string&) override {
    return std::nullopt;
  }

  void ConfigureRank(const std::optional<v1::RendezvousInfo>& info, bool rank_zero_here,
                     rankproto::FlatConfig& cfg) const override {
    if (!info.has_value()) {
      cfg[rk::kStoreAddress] = "";
      return;
    }
    cfg[rk::kNcclUniqueId] = absl::BytesToHexString(info->nccl_unique_id());
    if (!rank_zero_here) cfg[rk::kStoreAddress] = info->gloo_store_address();
  }
};

}  // namespace

std::unique_ptr<RendezvousBackend> MakeRendezvousBackend(bool gpu, bool command) {
  if (command) return std::make_unique<ReservedPortRendezvous>(/*rank_may_report=*/false);
  if (gpu) return std::make_unique<NcclRendezvous>();
  return std::make_unique<ReservedPortRendezvous>(/*rank_may_report=*/true);
}

std::pair<std::string, std::string> MasterEndpoint(const std::optional<v1::RendezvousInfo>& info,
                                                   const std::string& address) {
  if (!info.has_value()) return {address, "0"};
  return {info->master_addr(), absl::StrCat(info->master_port())};
}

}  // namespace trainctl::worker

#include "coordinator/core/peer_address.h"

#include "common/auth/secret.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::coordinator {

std::string PeerIp(absl::string_view peer) {
  std::string p(peer);
  for (auto [from, to] : {std::pair<const char*, const char*>{"%5B", "["}, {"%5D", "]"}}) {
    for (size_t at; (at = p.find(from)) != std::string::npos;) p.replace(at, 3, to);
  }
  absl::string_view v = p;
  if (absl::ConsumePrefix(&v, "ipv4:")) return std::string(v.substr(0, v.rfind(':')));
  if (absl::ConsumePrefix(&v, "ipv6:") && absl::ConsumePrefix(&v, "[")) {
    absl::string_view ip = v.substr(0, v.find(']'));
    absl::ConsumePrefix(&ip, "::ffff:");  // an IPv4 client on a dual-stack socket
    return std::string(ip);
  }
  return "";
}

std::string HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) return std::string(address.substr(0, address.find(']')));
  size_t colon = address.rfind(':');
  if (colon != absl::string_view::npos && address.find(':') == colon)
    address = address.substr(0, colon);
  return std::string(address);
}

absl::Status CheckRendezvousHosts(const v1::RendezvousInfo& info,
                                  const std::vector<std::string>& own) {
  std::vector<std::pair<const char*, std::string>> named;
  if (info.kind_case() == v1::RendezvousInfo::kGlooStoreAddress) {
    named.emplace_back("gloo_store_address", HostOf(info.gloo_store_address()));
  }
  if (!info.master_addr().empty()) named.emplace_back("master_addr", HostOf(info.master_addr()));
  for (const auto& entry : named) {
    // (Not a structured binding: C++17 lambdas cannot capture one.)
    const char* field = entry.first;
    const std::string& host = entry.second;
    bool mine = std::any_of(own.begin(), own.end(),
                            [&](const std::string& o) { return absl::EqualsIgnoreCase(o, host); });
    if (!mine) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rendezvous.info.", field, ": host '", host, "' is not this worker's address (",
          absl::StrJoin(own, ", "), "); a worker reports only its own address"));
    }
  }
  return absl::OkStatus();
}

namespace {

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

absl::StatusOr<std::vector<std::string>> ResolveNow(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::NotFoundError(gai_strerror(rc));
  }
  std::vector<std::string> ips;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* raw =
        a->ai_family == AF_INET6
            ? static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr);
    if (inet_ntop(a->ai_family, raw, text, sizeof text) == nullptr) continue;
    std::string ip = text;
    absl::string_view v = ip;
    if (absl::ConsumePrefix(&v, "::ffff:") && IsIpLiteral(std::string(v))) ip = std::string(v);
    if (std::find(ips.begin(), ips.end(), ip) == ips.end()) ips.push_back(ip);
  }
  freeaddrinfo(found);
  if (ips.empty()) return absl::NotFoundError("no address");
  return ips;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host,
                                                     absl::Duration timeout) {
  struct Lookup {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<std::vector<std::string>> result ABSL_GUARDED_BY(mu) =
        absl::UnknownError("unset");
  };
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host] {
    absl::StatusOr<std::vector<std::string>> r = ResolveNow(host);
    absl::MutexLock l(&lookup->mu);
    lookup->result = std::move(r);
    lookup->done = true;
  }).detach();
  absl::MutexLock l(&lookup->mu);
  if (!lookup->mu.AwaitWithTimeout(absl::Condition(&lookup->done), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no answer from the resolver within ", absl::FormatDuration(timeout)));
  }
  return lookup->result;
}

AddressVerdict JudgeWorkerAddress(const std::string& address, const std::string& peer_ip,
                                  const std::vector<std::string>& vouched,
                                  const HostResolver& resolve) {
  const std::string host = HostOf(address);
  auto own = [&](const std::string& ip) {
    if (absl::EqualsIgnoreCase(ip, peer_ip) ||
        (auth::IsLoopbackIp(ip) && auth::IsLoopbackIp(peer_ip)))
      return true;
    return std::any_of(vouched.begin(), vouched.end(),
                       [&](const std::string& v) { return absl::EqualsIgnoreCase(v, ip); });
  };
  std::string known =
      absl::StrCat("the address it connects from (", peer_ip.empty() ? "unknown" : peer_ip, ")");
  if (!vouched.empty())
    absl::StrAppend(&known, " or one its token or certificate names (",
                    absl::StrJoin(vouched, ", "), ")");
  const std::string fix =
      "; start trainctl-worker with --address set to this host's IP address that the other workers "
      "reach (without "
      "--address it advertises its address on the route to the coordinator), or name the host in "
      "its worker token "
      "(trainctl token create --role worker --address HOST)";
  AddressVerdict v;
  if (host.empty()) {
    v.refused = absl::StrCat("it registered no address", fix);
    return v;
  }
  if (own(host)) {
    v.accepted = true;
    v.accepted_host = host;
    return v;
  }
  if (IsIpLiteral(host)) {
    v.refused = absl::StrCat("address '", host, "' is not ", known, fix);
    return v;
  }
  absl::StatusOr<std::vector<std::string>> ips = resolve(host);
  if (!ips.ok()) {
    v.refused = absl::StrCat("address '", host, "' does not resolve here (", ips.status().message(),
                             "), so it is not ", known, fix);
    return v;
  }
  if (std::any_of(ips->begin(), ips->end(), own)) {
    v.accepted = true;
    v.accepted_host = host;
    return v;
  }
  v.refused = absl::StrCat("address '", host, "' resolves to ", absl::StrJoin(*ips, ", "),
                           ", not to ", known, fix);
  return v;
}

}  // namespace trainctl::coordinator

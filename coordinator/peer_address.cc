#include "coordinator/peer_address.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

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
  if (colon != absl::string_view::npos && address.find(':') == colon) address = address.substr(0, colon);
  return std::string(address);
}

absl::Status CheckRendezvousHosts(const v1::RendezvousInfo& info, const std::vector<std::string>& own) {
  std::vector<std::pair<const char*, std::string>> named;
  if (info.kind_case() == v1::RendezvousInfo::kGlooStoreAddress) {
    named.emplace_back("gloo_store_address", HostOf(info.gloo_store_address()));
  }
  if (!info.master_addr().empty()) named.emplace_back("master_addr", HostOf(info.master_addr()));
  for (const auto& entry : named) {
    // (Not a structured binding: C++17 lambdas cannot capture one.)
    const char* field = entry.first;
    const std::string& host = entry.second;
    bool mine = std::any_of(own.begin(), own.end(), [&](const std::string& o) {
      return absl::EqualsIgnoreCase(o, host);
    });
    if (!mine) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rendezvous.info.", field, ": host '", host, "' is not this worker's address (",
          absl::StrJoin(own, ", "), "); a worker reports only its own address"));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainctl::coordinator

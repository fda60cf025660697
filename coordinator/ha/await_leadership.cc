// AwaitLeadership (see await_leadership.h).
#include "coordinator/ha/await_leadership.h"

#include <unistd.h>

#include <iostream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/stop_signals.h"
#include "coordinator/ha/standby_server.h"

namespace trainctl::coordinator {
namespace {

// The address recorded for clients: --advertise-address, else `listen`
// (its port the bound one) with a wildcard host replaced by this host's name.
std::string AdvertiseAddress(const std::string& advertise_address, const std::string& listen,
                             int bound_port) {
  if (!advertise_address.empty()) return advertise_address;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
    char name[256] = {0};
    if (gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') host = name;
  }
  return absl::StrCat(host, ":", bound_port);
}

}  // namespace

// PostgreSQL: serves as a standby (StandbyServer) on o.listen until this
// process takes the store's lock, polling every --standby-poll-ms; then
// stops it and returns the opened store (its epoch taken, o.listen's port
// the one bound). Cancelled when a stop signal came first; another error
// when the store refuses this coordinator for good (not a trainctl
// database, a newer schema, a bad URI).
absl::StatusOr<std::unique_ptr<StateStore>> AwaitLeadership(CoordinatorOptions& o,
                                                            absl::Duration poll,
                                                            const std::string& advertise_address) {
  std::unique_ptr<StandbyServer> standby;
  // The standby serves only once the first try found another coordinator
  // active (so its first answer names it) -- except with port 0, where
  // binding first is how the advertised port is known.
  auto serve_standby = [&]() -> absl::Status {
    standby = std::make_unique<StandbyServer>(o);
    absl::StatusOr<int> port = standby->Start();
    if (!port.ok()) return port.status();
    o.listen = absl::StrCat(o.listen.substr(0, o.listen.rfind(':')), ":", *port);
    return absl::OkStatus();
  };
  int port = 0;
  if (!absl::SimpleAtoi(o.listen.substr(o.listen.rfind(':') + 1), &port)) port = 0;
  if (port == 0) {
    TRAINCTL_RETURN_IF_ERROR(serve_standby());
    (void)absl::SimpleAtoi(o.listen.substr(o.listen.rfind(':') + 1), &port);
  }
  o.store.leader_address = AdvertiseAddress(advertise_address, o.listen, port);
  StoreLeader last{-1, ""};
  std::string last_why;
  bool announced = false;
  const long poll_ms = static_cast<long>(absl::ToInt64Milliseconds(poll));
  for (bool first = true;; first = false) {
    if (!first && trainctl::WaitForStopSignalFor(poll_ms) != 0) {
      return absl::CancelledError("stop signal while standby");
    }
    StoreLeader holder;
    absl::StatusOr<std::unique_ptr<StateStore>> store =
        StateStore::OpenSpec(o.store_spec, o.store, &holder);
    if (store.ok()) {
      if (standby != nullptr) standby->Shutdown();
      return store;
    }
    if (store.status().code() != absl::StatusCode::kUnavailable) return store.status();
    if (standby == nullptr) TRAINCTL_RETURN_IF_ERROR(serve_standby());
    standby->SetActive(holder.address);
    if (!announced) {
      announced = true;
      std::cout << "trainctl-coordinator standby on " << o.listen << " (advertised as "
                << o.store.leader_address << ")" << std::endl;
    }
    // Logged when the active one or the reason changes (an unreachable
    // server is waited out too, and said).
    if (holder.epoch != last.epoch || holder.address != last.address ||
        store.status().message() != last_why) {
      trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "standby",
                         {{"active", holder.address.empty() ? "unknown" : holder.address},
                          {"epoch", absl::StrCat(holder.epoch)},
                          {"listen", o.listen},
                          {"why", std::string(store.status().message())}});
      last = holder;
      last_why = std::string(store.status().message());
    }
  }
}

}  // namespace trainctl::coordinator

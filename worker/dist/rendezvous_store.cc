#include "worker/dist/rendezvous_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainctl::dist {

struct RendezvousStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

absl::Status StatusFromCommException(const std::exception& e, const std::string& what) {
  std::string msg = e.what();
  // c10::Error carries a long backtrace after the first line; keep the first.
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  const std::string text = absl::StrCat(what, ": ", msg);
  const std::string lower = absl::AsciiStrToLower(msg);
  if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout")) {
    return absl::DeadlineExceededError(text);
  }
  return absl::UnavailableError(text);
}

absl::Status RendezvousStore::ParseAddress(const std::string& address, std::string* host,
                                           uint16_t* port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address '", address, "' is not host:port"));
  }
  uint32_t p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p == 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address '", address, "' has no valid port (1..65535)"));
  }
  *host = address.substr(0, colon);
  // Accept "[::1]:port".
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = static_cast<uint16_t>(p);
  return absl::OkStatus();
}

namespace {

// c10d's TCPStore counts its connect timeout in whole seconds; below one
// second it gives up at once.
std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(std::max(d, absl::Seconds(1))));
}

}  // namespace

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::Host(
    const std::string& advertise_host, uint16_t port, absl::Duration timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = true;
  opts.waitWorkers = false;  // ranks join later; the engine waits for them.
  opts.timeout = ToMillis(timeout);
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(advertise_host, opts);
  } catch (const std::exception& e) {
    return StatusFromCommException(
        e, absl::StrCat("hosting the rendezvous store on port ", port));
  }
  return std::shared_ptr<RendezvousStore>(new RendezvousStore(std::move(impl), true, timeout));
}

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::Connect(
    const std::string& address, absl::Duration timeout) {
  std::string host;
  uint16_t port = 0;
  auto st = ParseAddress(address, &host, &port);
  if (!st.ok()) return st;
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = ToMillis(timeout);
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    return StatusFromCommException(
        e, absl::StrCat("connecting to the rendezvous store at ", address));
  }
  return std::shared_ptr<RendezvousStore>(new RendezvousStore(std::move(impl), false, timeout));
}

RendezvousStore::RendezvousStore(std::unique_ptr<Impl> impl, bool is_host,
                                 absl::Duration timeout)
    : impl_(std::move(impl)), is_host_(is_host), timeout_(timeout) {}

RendezvousStore::~RendezvousStore() = default;

std::string RendezvousStore::address() const {
  const std::string& host = impl_->store->getHost();
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", impl_->store->getPort());
}

c10d::Store& RendezvousStore::c10d_store() { return *impl_->store; }

absl::Status RendezvousStore::Set(const std::string& key, const std::string& value) {
  try {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    return StatusFromCommException(e, absl::StrCat("store set '", key, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key) {
  try {
    auto v = impl_->store->get(key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    return StatusFromCommException(e, absl::StrCat("store get '", key, "'"));
  }
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    return StatusFromCommException(e, absl::StrCat("store add '", key, "'"));
  }
}

}  // namespace trainctl::dist

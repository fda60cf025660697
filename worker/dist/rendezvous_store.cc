#include "worker/dist/rendezvous_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/torch_compat.h"

namespace trainctl::dist {
namespace {

// Waits until something accepts TCP connections at host:port, trying every
// 5 ms. The ranks of an attempt start together, so the others usually dial
// before rank 0 (still loading LibTorch) listens; c10d's own client then
// sleeps a whole second between attempts (start-up measured 0.8 s or 1.7 s
// depending on who won). Returns when connected or at the deadline; the
// TCPStore client that follows reports any error.
void WaitUntilListening(const std::string& host, uint16_t port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h = host.size() > 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  if (getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) return;
  while (absl::Now() < deadline) {
    bool refused = true;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      const int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      const int err = errno;
      close(fd);
      if (rc == 0) {
        freeaddrinfo(res);
        return;
      }
      if (err != ECONNREFUSED) refused = false;
    }
    if (!refused) break;  // Unreachable or worse: let c10d say so.
    absl::SleepFor(absl::Milliseconds(5));
  }
  freeaddrinfo(res);
}

}  // namespace

struct RendezvousStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  const char* backend = "classic";  // "libuv" or "classic" (NewTcpStore)
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

// Whether this process's LibTorch can run c10d's libuv store backend: unknown
// until the first store is made, then remembered (one failed try and one log
// line per process, not per store).
enum class LibUv { kUnknown, kAvailable, kMissing };
std::atomic<LibUv> g_libuv{LibUv::kUnknown};

// Builds the store with the libuv backend where this LibTorch has it and the
// classic backend where it does not. LibTorch 2.4+ asks for libuv by default
// and throws at construction (before any I/O) when it was built without it,
// as Debian's is; pip wheels have it; 1.13 has only the classic backend (no
// option, torch_compat). Both backends speak the same protocol, so the host
// and the connecting ranks need not agree. Any other error is thrown on.
c10::intrusive_ptr<c10d::TCPStore> NewTcpStore(const std::string& host,
                                               c10d::TCPStoreOptions opts,
                                               const char** backend) {
  if (torch_compat::SetTcpStoreUseLibUv(opts, true) && g_libuv.load() != LibUv::kMissing) {
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
      g_libuv.store(LibUv::kAvailable);
      *backend = "libuv";
      return store;
    } catch (const std::exception& e) {
      if (!absl::StrContains(e.what(), "without libuv")) throw;
      if (g_libuv.exchange(LibUv::kMissing) != LibUv::kMissing) {
        std::fprintf(stderr,
                     "trainctl: this LibTorch was built without libuv; the rendezvous store "
                     "uses c10d's classic TCPStore backend\n");
      }
    }
  }
  torch_compat::SetTcpStoreUseLibUv(opts, false);
  *backend = "classic";
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
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
    impl->store = NewTcpStore(advertise_host, opts, &impl->backend);
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
  WaitUntilListening(host, port, absl::Now() + timeout);
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = NewTcpStore(host, opts, &impl->backend);
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

std::string RendezvousStore::backend() const { return impl_->backend; }

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

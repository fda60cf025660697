// RendezvousStore: the client (and the hosting rank's handle on its own
// server, rendezvous_store_server.cc); the wire format is
// rendezvous_wire.h.
#include "worker/dist/rendezvous_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/random_secret.h"
#include "worker/dist/rendezvous_store_server.h"
#include "worker/dist/rendezvous_wire.h"

namespace trainctl::dist {

using wire::GetI64;
using wire::GetU32;
using wire::HandshakeMessage;
using wire::kHandshakeTimeout;
using wire::kMagicBytes;
using wire::kMaxKeyBytes;
using wire::kMaxValueBytes;
using wire::kOk;
using wire::kOpAdd;
using wire::kOpGet;
using wire::kOpSet;
using wire::kTimedOut;
using wire::MacEquals;
using wire::PutI64;
using wire::PutU32;
using wire::ReadExactly;
using wire::WriteAll;

namespace {

std::string BracketIfV6(const std::string& host) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
}

}  // namespace

std::string RendezvousMac(const std::string& secret, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string NewRendezvousSecret() { return NewSecretHex(); }

absl::Status StatusFromCommException(const std::exception& e, const std::string& what) {
  std::string msg = e.what();
  // c10::Error carries a long backtrace after the first line; keep the first.
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  const std::string text = absl::StrCat(what, ": ", msg);
  const std::string lower = absl::AsciiStrToLower(msg);
  if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout") ||
      absl::StrContains(lower, "deadline_exceeded")) {
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

// --- the client -----------------------------------------------------------------

struct RendezvousStore::Impl {
  std::string address;
  std::unique_ptr<StoreServer> server;  // host only
  int fd = -1;                          // client only
  absl::Mutex mu;                       // serialises a client's calls

  ~Impl() {
    server.reset();
    if (fd >= 0) close(fd);
  }

  // One request/response on the client connection.
  absl::StatusOr<std::pair<uint8_t, std::string>> Call(uint8_t op, const std::string& key,
                                                       const std::string& value,
                                                       absl::Duration reply_within) {
    absl::MutexLock l(&mu);
    if (fd < 0) return absl::UnavailableError("the store connection was lost earlier");
    std::string out(1, static_cast<char>(op));
    PutU32(&out, static_cast<uint32_t>(key.size()));
    out += key;
    PutU32(&out, static_cast<uint32_t>(value.size()));
    out += value;
    absl::Status st;
    std::string head, payload;
    if (!WriteAll(fd, out)) {
      st = absl::UnavailableError("connection closed by the store");
    } else {
      const absl::Time deadline = absl::Now() + reply_within;
      st = ReadExactly(fd, 5, &head, deadline);
      if (st.ok()) st = ReadExactly(fd, GetU32(head.data() + 1), &payload, deadline);
    }
    if (!st.ok()) {
      // Half a reply may still come: the connection is unusable now.
      close(fd);
      fd = -1;
      return st;
    }
    return std::make_pair(static_cast<uint8_t>(head[0]), std::move(payload));
  }
};

namespace {

// Resolves host (numeric or a name) to the addresses to try, in order.
absl::StatusOr<std::vector<sockaddr_storage>> Resolve(const std::string& host, uint16_t port,
                                                      std::vector<socklen_t>* lens) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("store host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  std::vector<sockaddr_storage> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, ai->ai_addr, ai->ai_addrlen);
    out.push_back(s);
    lens->push_back(ai->ai_addrlen);
  }
  freeaddrinfo(res);
  return out;
}

// Connects and runs the client's half of the handshake. Unavailable when the
// store is not (yet) there or closed on us; PermissionDenied when it answered
// without the secret's proof.
absl::StatusOr<int> DialAndAuthenticate(const sockaddr_storage& addr, socklen_t len,
                                        const std::string& secret, absl::Time deadline) {
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(err)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string hello;
  absl::Status st = ReadExactly(fd, kMagicBytes + kRendezvousNonceBytes, &hello,
                                std::min(deadline, absl::Now() + kHandshakeTimeout));
  if (st.ok() && hello.compare(0, kMagicBytes, kRendezvousMagic, kMagicBytes) != 0) {
    st = absl::PermissionDeniedError("the listener does not speak trainctl's rendezvous protocol");
  }
  if (st.ok()) {
    const std::string sn = hello.substr(kMagicBytes);
    const std::string cn = RandomBytes(kRendezvousNonceBytes);
    std::string server_proof;
    if (!WriteAll(fd, cn + RendezvousMac(secret, HandshakeMessage("client", sn, cn)))) {
      st = absl::UnavailableError("connection closed during the handshake");
    } else if (!(st = ReadExactly(fd, kRendezvousMacBytes, &server_proof,
                                  std::min(deadline, absl::Now() + kHandshakeTimeout)))
                    .ok()) {
      // The store closes on a wrong proof; say what that most likely means.
      if (absl::IsUnavailable(st)) {
        st = absl::PermissionDeniedError(
            "the store closed the connection during the handshake (wrong rendezvous secret?)");
      }
    } else if (!MacEquals(server_proof,
                          RendezvousMac(secret, HandshakeMessage("server", sn, cn)))) {
      st = absl::PermissionDeniedError("the store did not prove the attempt's rendezvous secret");
    }
  }
  if (!st.ok()) {
    close(fd);
    return st;
  }
  return fd;
}

absl::Status CheckSecret(const std::string& secret) {
  if (secret.size() < kRendezvousMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous secret: ", secret.size(),
                                                   " bytes, at least ", kRendezvousMinSecretBytes,
                                                   " needed"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::Host(
    const std::string& advertise_host, uint16_t port, absl::Duration timeout,
    const std::string& secret) {
  if (absl::Status s = CheckSecret(secret); !s.ok()) return s;
  if (advertise_host.empty())
    return absl::InvalidArgumentError("rendezvous store: empty host to bind");
  std::vector<socklen_t> lens;
  absl::StatusOr<std::vector<sockaddr_storage>> addrs = Resolve(advertise_host, port, &lens);
  if (!addrs.ok()) return addrs.status();
  std::string last_error;
  for (size_t i = 0; i < addrs->size(); ++i) {
    sockaddr_storage a = (*addrs)[i];
    int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int on = 1;
    // The daemon holds the port bound (not listening) with SO_REUSEADDR until
    // the store listens on it.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), lens[i]) != 0 || listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    const uint16_t bound =
        ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                      : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    auto impl = std::make_unique<Impl>();
    impl->address = absl::StrCat(BracketIfV6(advertise_host), ":", bound);
    impl->server = std::make_unique<StoreServer>(fd, secret);
    return std::shared_ptr<RendezvousStore>(new RendezvousStore(std::move(impl), true, timeout));
  }
  return absl::UnavailableError(absl::StrCat("hosting the rendezvous store on ", advertise_host,
                                             ":", port, ": ", last_error));
}

absl::StatusOr<std::shared_ptr<RendezvousStore>> RendezvousStore::Connect(
    const std::string& address, absl::Duration timeout, const std::string& secret) {
  if (absl::Status s = CheckSecret(secret); !s.ok()) return s;
  std::string host;
  uint16_t port = 0;
  if (absl::Status s = ParseAddress(address, &host, &port); !s.ok()) return s;
  std::vector<socklen_t> lens;
  absl::StatusOr<std::vector<sockaddr_storage>> addrs = Resolve(host, port, &lens);
  if (!addrs.ok()) return addrs.status();
  // The ranks of an attempt start together, so the others usually dial before
  // rank 0 (still loading LibTorch) listens: retry every 5 ms until then.
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::Seconds(1));
  absl::Status last;
  while (true) {
    for (size_t i = 0; i < addrs->size(); ++i) {
      absl::StatusOr<int> fd = DialAndAuthenticate((*addrs)[i], lens[i], secret, deadline);
      if (fd.ok()) {
        auto impl = std::make_unique<Impl>();
        impl->address = address;
        impl->fd = *fd;
        return std::shared_ptr<RendezvousStore>(
            new RendezvousStore(std::move(impl), false, timeout));
      }
      if (absl::IsPermissionDenied(fd.status())) {
        return absl::PermissionDeniedError(absl::StrCat("connecting to the rendezvous store at ",
                                                        address, ": ", fd.status().message()));
      }
      last = fd.status();
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat("connecting to the rendezvous store at ", address,
                                                  ": timed out; last error: ", last.message()));
}

RendezvousStore::RendezvousStore(std::unique_ptr<Impl> impl, bool is_host, absl::Duration timeout)
    : impl_(std::move(impl)), is_host_(is_host), timeout_(timeout) {}

RendezvousStore::~RendezvousStore() = default;

std::string RendezvousStore::address() const { return impl_->address; }

int64_t RendezvousStore::rejected_connections() const {
  return impl_->server != nullptr ? impl_->server->rejected() : 0;
}

absl::Status RendezvousStore::Set(const std::string& key, const std::string& value) {
  if (key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("store set '", key.substr(0, 64), "': key over ",
                                                   kMaxKeyBytes, " or value over ", kMaxValueBytes,
                                                   " bytes"));
  }
  if (impl_->server != nullptr) {
    impl_->server->kv().Set(key, value);
    return absl::OkStatus();
  }
  auto r = impl_->Call(kOpSet, key, value, timeout_ + absl::Seconds(5));
  if (!r.ok())
    return absl::Status(r.status().code(),
                        absl::StrCat("store set '", key, "': ", r.status().message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key) {
  return Get(key, timeout_);
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key, absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes) return absl::InvalidArgumentError("store get: key too long");
  const std::string timed_out =
      absl::StrCat("store get '", key, "': timed out after ", absl::FormatDuration(timeout));
  if (impl_->server != nullptr) {
    std::atomic<bool> never{false};
    std::string v;
    if (!impl_->server->kv().Get(key, absl::Now() + timeout, never, &v)) {
      return absl::DeadlineExceededError(timed_out);
    }
    return v;
  }
  std::string ms;
  PutI64(&ms, absl::ToInt64Milliseconds(timeout));
  auto r = impl_->Call(kOpGet, key, ms, timeout + absl::Seconds(5));
  if (!r.ok())
    return absl::Status(r.status().code(),
                        absl::StrCat("store get '", key, "': ", r.status().message()));
  if (r->first == kTimedOut) return absl::DeadlineExceededError(timed_out);
  if (r->first != kOk)
    return absl::InternalError(absl::StrCat("store get '", key, "': ", r->second));
  return std::move(r->second);
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  if (key.size() > kMaxKeyBytes) return absl::InvalidArgumentError("store add: key too long");
  if (impl_->server != nullptr) return impl_->server->kv().Add(key, delta);
  std::string d;
  PutI64(&d, delta);
  auto r = impl_->Call(kOpAdd, key, d, timeout_ + absl::Seconds(5));
  if (!r.ok())
    return absl::Status(r.status().code(),
                        absl::StrCat("store add '", key, "': ", r.status().message()));
  if (r->first != kOk || r->second.size() != 8) {
    return absl::InvalidArgumentError(absl::StrCat("store add '", key, "': ", r->second));
  }
  return GetI64(r->second);
}

}  // namespace trainctl::dist

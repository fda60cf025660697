#include "worker/dist/rendezvous_store_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/random_secret.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/dist/rendezvous_wire.h"

namespace trainctl::dist {

using wire::GetI64;
using wire::GetU32;
using wire::HandshakeMessage;
using wire::kBadRequest;
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

void KeyValues::Set(const std::string& key, std::string value) {
  absl::MutexLock l(&mu_);
  data_[key] = std::move(value);
}

bool KeyValues::Get(const std::string& key, absl::Time deadline, const std::atomic<bool>& stopping,
                    std::string* value) {
  absl::MutexLock l(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return data_.count(key) > 0 || stopping.load();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  *value = it->second;
  return true;
}

absl::StatusOr<int64_t> KeyValues::Add(const std::string& key, int64_t delta) {
  absl::MutexLock l(&mu_);
  int64_t cur = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &cur)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store add '", key, "': value is not an integer"));
  }
  cur += delta;
  data_[key] = absl::StrCat(cur);
  return cur;
}

void KeyValues::Poke() {
  absl::MutexLock l(&mu_);
  ++pokes_;
}

StoreServer::StoreServer(int listen_fd, std::string secret)
    : listen_fd_(listen_fd), secret_(std::move(secret)) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

StoreServer::~StoreServer() {
  stopping_.store(true);
  shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  close(listen_fd_);
  {
    absl::MutexLock l(&mu_);
    for (Conn& c : conns_) shutdown(c.fd, SHUT_RDWR);
  }
  kv_.Poke();
  std::list<Conn> conns;
  {
    absl::MutexLock l(&mu_);
    conns.swap(conns_);
  }
  for (Conn& c : conns) c.thread.join();
}

void StoreServer::AcceptLoop() {
  while (!stopping_.load()) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_.load()) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      return;  // the listening socket is gone
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    absl::MutexLock l(&mu_);
    Reap();
    if (static_cast<int>(conns_.size()) >= kMaxConnections || stopping_.load()) {
      close(fd);
      rejected_.fetch_add(1);
      continue;
    }
    Conn& c = conns_.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c] {
      Serve(c.fd);
      close(c.fd);
      c.done.store(true);
    });
  }
}

void StoreServer::Reap() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

bool StoreServer::Authenticate(int fd) {
  const std::string sn = RandomBytes(kRendezvousNonceBytes);
  if (!WriteAll(fd, std::string(kRendezvousMagic, kMagicBytes) + sn)) return false;
  std::string reply;
  if (!ReadExactly(fd, kRendezvousNonceBytes + kRendezvousMacBytes, &reply,
                   absl::Now() + kHandshakeTimeout)
           .ok()) {
    return false;
  }
  const std::string cn = reply.substr(0, kRendezvousNonceBytes);
  const std::string proof = reply.substr(kRendezvousNonceBytes);
  if (!MacEquals(proof, RendezvousMac(secret_, HandshakeMessage("client", sn, cn)))) return false;
  return WriteAll(fd, RendezvousMac(secret_, HandshakeMessage("server", sn, cn)));
}

void StoreServer::Serve(int fd) {
  if (!Authenticate(fd)) {
    rejected_.fetch_add(1);
    return;
  }
  std::string head, key, len, value;
  while (!stopping_.load()) {
    if (!ReadExactly(fd, 5, &head, absl::InfiniteFuture()).ok()) return;
    const auto op = static_cast<uint8_t>(head[0]);
    const uint32_t klen = GetU32(head.data() + 1);
    if (klen > kMaxKeyBytes) return;
    if (!ReadExactly(fd, klen, &key, absl::InfiniteFuture()).ok()) return;
    if (!ReadExactly(fd, 4, &len, absl::InfiniteFuture()).ok()) return;
    const uint32_t vlen = GetU32(len.data());
    if (vlen > kMaxValueBytes) return;
    if (!ReadExactly(fd, vlen, &value, absl::InfiniteFuture()).ok()) return;
    uint8_t code = kOk;
    std::string payload;
    switch (op) {
      case kOpSet:
        kv_.Set(key, value);
        break;
      case kOpGet: {
        if (value.size() != 8) return;
        const int64_t ms = std::clamp<int64_t>(GetI64(value), 0, int64_t{1} << 40);
        if (!kv_.Get(key, absl::Now() + absl::Milliseconds(ms), stopping_, &payload))
          code = kTimedOut;
        break;
      }
      case kOpAdd: {
        if (value.size() != 8) return;
        absl::StatusOr<int64_t> v = kv_.Add(key, GetI64(value));
        if (v.ok()) {
          PutI64(&payload, *v);
        } else {
          code = kBadRequest;
          payload = std::string(v.status().message());
        }
        break;
      }
      default:
        return;  // not our protocol: close
    }
    std::string out(1, static_cast<char>(code));
    PutU32(&out, static_cast<uint32_t>(payload.size()));
    out += payload;
    if (!WriteAll(fd, out)) return;
  }
}

}  // namespace trainctl::dist

// The rendezvous store's server (rank 0 hosts it, RendezvousStore::Host):
// an accept thread, a thread per connection (at most kMaxConnections, more
// are closed at once and counted), the secret handshake within
// wire::kHandshakeTimeout, then set / get (waits for the key) / add on
// KeyValues. The hosting rank's own calls use kv() directly. Internal to
// trainctl_rendezvous.
//
// Thread-safe: KeyValues is locked; the destructor ends every thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainctl::dist {

// The keys, shared by the server's connection threads and the host's own calls.
class KeyValues {
 public:
  void Set(const std::string& key, std::string value);
  // False when `deadline` passed (or `stopping` became true) without the key.
  bool Get(const std::string& key, absl::Time deadline, const std::atomic<bool>& stopping,
           std::string* value);
  // The key's integer plus `delta` (a missing key is 0); InvalidArgument
  // when its value is not an integer.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Wakes every waiter (they re-check `stopping`).
  void Poke();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  int64_t pokes_ ABSL_GUARDED_BY(mu_) = 0;
};

class StoreServer {
 public:
  // Connections held at once (ranks + strays); more are closed on accept.
  static constexpr int kMaxConnections = 256;

  // Serves on `listen_fd` (bound and listening; closed by the destructor)
  // to clients that prove `secret`.
  StoreServer(int listen_fd, std::string secret);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  KeyValues& kv() { return kv_; }
  // Connections closed unserved: over the cap, or a failed handshake.
  int64_t rejected() const { return rejected_.load(); }

 private:
  struct Conn {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop();
  // Joins the threads of finished connections.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The handshake; true when the peer proved the secret (and got our proof).
  bool Authenticate(int fd);
  void Serve(int fd);

  const int listen_fd_;
  const std::string secret_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> rejected_{0};
  KeyValues kv_;
  absl::Mutex mu_;
  std::list<Conn> conns_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace trainctl::dist

// RendezvousStore: the key-value store the ranks of one attempt meet at before
// they can talk to each other directly, hosted by rank 0: rank 0 calls Host()
// (port 0 picks a free port), reports address() to its daemon, the
// coordinator hands that "host:port" to every other rank, and they Connect().
// The Gloo engine exchanges its transport addresses through it
// (gloo_collectives.h); the trainer broadcasts the checkpoint to resume from
// through it; anything else that needs a small rendezvous can use Set/Get.
//
// It is trainctl's own store, not c10d::TCPStore, because it authenticates
// every connection: the server listens only on the host it advertises and
// every connection must prove it knows the attempt's secret (which the
// coordinator gives only to that attempt's ranks) before it may read or write
// a key. Handshake (all sizes in bytes; HMAC = HMAC-SHA256 keyed by the
// secret):
//   server -> client  "TCRDZV1\n" (8) + server nonce (32)
//   client -> server  client nonce (32) + HMAC("client" sn cn) (32)
//   server -> client  HMAC("server" sn cn) (32)   -- only when the proof holds
// A wrong or missing proof (or none within 5 s) closes the connection with
// nothing read or written; the client checks the server's proof too, so a
// rank never trusts keys from a listener that does not hold the secret.
// Then requests: op (1) | key length (4, LE) | key | value length (4) | value,
// answered by code (1) | length (4) | payload; keys are bounded to 4 KiB and
// values to 16 MiB (a larger frame closes the connection).
//
// The server lives in rank 0's process for as long as rank 0's store object
// lives; keep it until every rank has connected its engine (the Gloo engine
// holds it for its own lifetime).
//
// Threading: thread-safe. The server runs an accept thread and one thread per
// connection (a rank's world is small; connections are capped); a client's
// calls are serialised on its one connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::dist {

// The handshake's constants, for tests that speak it by hand.
inline constexpr char kRendezvousMagic[] = "TCRDZV1\n";  // 8 bytes on the wire
inline constexpr size_t kRendezvousNonceBytes = 32;
inline constexpr size_t kRendezvousMacBytes = 32;
// A secret shorter than this is refused (the coordinator makes 64 hex digits).
inline constexpr size_t kRendezvousMinSecretBytes = 16;

class RendezvousStore {
 public:
  // Rank 0: starts the store server listening only on `advertise_host` (an
  // address or a name resolving to one of this host's addresses) at `port`
  // (0 = a free port chosen by the kernel). `secret` is the attempt's
  // rendezvous secret (at least kRendezvousMinSecretBytes). `timeout` bounds
  // every later Get.
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> Host(const std::string& advertise_host,
                                                               uint16_t port,
                                                               absl::Duration timeout,
                                                               const std::string& secret);

  // Every other rank: connects to `address` ("host:port", as produced by
  // address() on rank 0) and authenticates with `secret`, retrying a refused
  // connection until `timeout`. PermissionDenied when the server does not
  // prove the same secret.
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> Connect(const std::string& address,
                                                                  absl::Duration timeout,
                                                                  const std::string& secret);

  ~RendezvousStore();
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // "host:port" other ranks connect to.
  std::string address() const;
  bool is_host() const { return is_host_; }
  absl::Duration timeout() const { return timeout_; }

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits (up to the store's timeout) until `key` exists, then returns it.
  absl::StatusOr<std::string> Get(const std::string& key);
  // As Get, waiting at most `timeout`.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  // Atomically adds `delta` to the integer at `key` (missing = 0); returns the
  // new value.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // Number of connections the server closed because they did not prove the
  // secret (host only; 0 on a client). For tests and logs.
  int64_t rejected_connections() const;

  // Splits "host:port"; InvalidArgument when malformed.
  static absl::Status ParseAddress(const std::string& address, std::string* host, uint16_t* port);

  struct Impl;

 private:
  RendezvousStore(std::unique_ptr<Impl> impl, bool is_host, absl::Duration timeout);

  const std::unique_ptr<Impl> impl_;
  const bool is_host_;
  const absl::Duration timeout_;
};

// HMAC-SHA256 of `message` keyed by `secret` (32 bytes). Exposed for tests
// that speak the handshake by hand.
std::string RendezvousMac(const std::string& secret, const std::string& message);

// A fresh secret for one attempt: 32 random bytes from the kernel, as 64 hex
// digits. Used by the coordinator (one per attempt) and by tests.
std::string NewRendezvousSecret();

// Maps an exception thrown by Gloo (or a store adapter) to a Status: timeouts
// become DeadlineExceeded, everything else Unavailable (a peer or the store
// went away; a new attempt may succeed). `what` says which operation failed.
absl::Status StatusFromCommException(const std::exception& e, const std::string& what);

}  // namespace trainctl::dist

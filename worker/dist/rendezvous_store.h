// RendezvousStore: the key-value store the ranks of one attempt meet at before
// they can talk to each other directly. It is c10d::TCPStore from LibTorch (the
// store torchrun uses), hosted by rank 0: rank 0 calls Host() (port 0 picks a
// free port), reports address() to its daemon, the coordinator hands that
// "host:port" to every other rank, and they Connect(). The Gloo engine
// exchanges its transport addresses through it (gloo_collectives.h); anything
// else that needs a small rendezvous (a barrier before the engine exists) can
// use Set/Get.
//
// The server lives in rank 0's process for as long as rank 0's store object
// lives; keep it until every rank has connected its engine (the Gloo engine
// holds it for its own lifetime).
//
// Threading: thread-safe; calls are serialised on the one client connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace trainctl::dist {

class RendezvousStore {
 public:
  // Rank 0: starts the store server listening on every interface at `port`
  // (0 = a free port chosen by the kernel) and connects to it. `advertise_host`
  // is the host part of address() that the other ranks will dial. `timeout`
  // bounds every later Get/Wait (at least one second: c10d counts its
  // connect timeout in whole seconds).
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> Host(
      const std::string& advertise_host, uint16_t port, absl::Duration timeout);

  // Every other rank: connects to `address` ("host:port", as produced by
  // address() on rank 0), retrying until `timeout`.
  static absl::StatusOr<std::shared_ptr<RendezvousStore>> Connect(
      const std::string& address, absl::Duration timeout);

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
  // Atomically adds `delta` to the integer at `key` (missing = 0); returns the
  // new value.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // c10d's store backend in use: "libuv" where this LibTorch has it (pip
  // wheels, 2.4+), else "classic" (LibTorch 1.13, Debian's 2.x).
  std::string backend() const;

  // The underlying c10d store, for adapters (the Gloo rendezvous).
  c10d::Store& c10d_store();

  // Splits "host:port"; InvalidArgument when malformed.
  static absl::Status ParseAddress(const std::string& address, std::string* host,
                                   uint16_t* port);

 private:
  struct Impl;
  RendezvousStore(std::unique_ptr<Impl> impl, bool is_host, absl::Duration timeout);

  const std::unique_ptr<Impl> impl_;
  const bool is_host_;
  const absl::Duration timeout_;
};

// Maps an exception thrown by c10d or Gloo to a Status: timeouts become
// DeadlineExceeded, everything else Unavailable (a peer or the store went
// away; a new attempt may succeed). `what` says which operation failed.
absl::Status StatusFromCommException(const std::exception& e, const std::string& what);

}  // namespace trainctl::dist

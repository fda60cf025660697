// Failover between coordinators, the client side: what the CLI, the C++
// client library and the worker daemon share.
//
// Active and standby coordinators share one store (docs/operator.md). Only
// the active one serves; a standby answers every method with UNAVAILABLE,
// "standby coordinator; the active coordinator is at HOST:PORT", and the
// trailing metadata `trainctl-active-coordinator: HOST:PORT` (absent while
// it knows of no active one). A coordinator that cannot be reached also
// gives UNAVAILABLE, without that metadata.
//
// The rule, everywhere a coordinator is dialled:
//   - `--coordinator a:7070,b:7070` (ParseCoordinatorList) is the list to
//     try; one entry that is a DNS name with several addresses is one
//     entry (gRPC's resolver picks among them);
//   - an answer with the metadata switches to the address it names, also
//     one outside the list (an authenticated coordinator named it; over TLS
//     the channel to it verifies the certificate for that host name);
//   - UNAVAILABLE without it moves to the next entry, round robin, after a
//     short backoff, until the call's deadline;
//   - a call is sent again only when it certainly did not run (a standby
//     answered it, or the connection never became READY, so gRPC sent
//     nothing), or when it is idempotent. CallWithFailover applies this.
//
// Thread-safe: CoordinatorRotation and CoordinatorChannels lock a mutex of
// their own; the free functions keep no state. A process remembers the
// last active coordinator per list (RememberedActive), so the next client
// of the same list starts there.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trainctl {

// The trailing metadata key a standby names the active coordinator with.
inline constexpr char kActiveCoordinatorKey[] = "trainctl-active-coordinator";
// How a standby's UNAVAILABLE message starts.
inline constexpr char kStandbyMessagePrefix[] = "standby coordinator";
// How CallWithFailover's UNAVAILABLE starts when no try ever connected.
inline constexpr char kUnreachablePrefix[] = "cannot reach the coordinator at ";

// "a:7070, b:7070" → {"a:7070", "b:7070"}. Each entry is HOST:PORT (a DNS
// name, an IPv4 address or a [bracketed] IPv6 address; port 1..65535) or a
// gRPC target with a scheme ("dns:///h:p", "unix:/path"). INVALID_ARGUMENT
// naming `flag` and the entry otherwise (an empty list, an empty entry, a
// missing or bad port, a duplicate).
absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(absl::string_view text,
                                                              absl::string_view flag);

// OK when `entry` is HOST:PORT as above (no scheme): what a hint must be.
absl::Status CheckHostPort(absl::string_view entry);

// The active coordinator a finished call's answer names: the status is
// UNAVAILABLE and the trailing metadata holds a valid HOST:PORT; else nullopt.
std::optional<std::string> ActiveCoordinatorHint(const grpc::Status& status,
                                                 const grpc::ClientContext& ctx);
// The answer is a standby's (UNAVAILABLE with the standby's message): the
// call did not run, whether or not it named an active coordinator.
bool IsStandbyAnswer(const grpc::Status& status);
// CallWithFailover's result says the call ran nowhere: its last try never
// connected, or a standby answered it. Such a call may be made again even
// when it is not idempotent.
bool CertainlyNotRun(const grpc::Status& status);

// Which coordinator to dial next: the one a hint named, else the list's
// current entry. Thread-safe.
class CoordinatorRotation {
 public:
  // `list` is not empty (ParseCoordinatorList's result). Starts at the
  // address this process last saw answer as active for the same list.
  explicit CoordinatorRotation(std::vector<std::string> list);

  // The address to dial now.
  std::string Current();
  // `address` answered as the active coordinator: stay, and remember it for
  // this process.
  void Answered(const std::string& address);
  // A standby named `hint`: dial it next.
  void Follow(const std::string& hint);
  // `address` could not serve (unreachable, or a standby that named no
  // active one): when it is still Current(), move on to the next entry of
  // the list (after a hint: the entry after the one that led to it).
  void Unreachable(const std::string& address);

  const std::vector<std::string>& list() const { return list_; }
  // The list as given, "a:7070,b:7070" (for messages).
  std::string ListText() const;

 private:
  const std::vector<std::string> list_;
  absl::Mutex mu_;
  // Index of the list's current entry; in [0, list_.size()).
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  // A hinted (or remembered) address outside the list's order; "" = none.
  std::string override_ ABSL_GUARDED_BY(mu_);
};

// The address this process last saw answer as active for `list_text`, "" if none.
std::string RememberedActive(const std::string& list_text);

// One channel per coordinator address, made on first use and kept until
// Forget (a channel kept across failures inherits gRPC's reconnect backoff;
// a forgotten one is made afresh and dials at once). Thread-safe.
class CoordinatorChannels {
 public:
  using Factory =
      std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(const std::string& address)>;
  CoordinatorChannels(std::vector<std::string> list, Factory factory);

  CoordinatorRotation& rotation() { return rotation_; }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Get(const std::string& address);
  void Forget(const std::string& address);

 private:
  CoordinatorRotation rotation_;
  const Factory factory_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// Waits until `channel` is READY (true), or fails at once when it reports
// TRANSIENT_FAILURE (every address refused: waiting only delays the error)
// or SHUTDOWN, or at `deadline` (false). READY means a call made next is
// sent; not READY, that gRPC has sent nothing on it.
bool WaitForReady(grpc::Channel& channel, absl::Time deadline);

// Whether a call may run twice with the same effect.
enum class Idempotency {
  kIdempotent,     // reads, and writes carrying a request id the server deduplicates
  kNotIdempotent,  // sent again only when it certainly did not run
};

// One unary call with the failover rule (see the top of this file), all
// tries bounded by `deadline`. `rpc` makes the call on `channel` with
// `ctx` (deadline already set). The result is the last answer; an address
// that never connected gives UNAVAILABLE "cannot reach the coordinator at
// ADDRESS" (the list named when it has several). *answered_by (optional)
// is the address of the last try.
using FailoverRpc = std::function<grpc::Status(const std::shared_ptr<grpc::Channel>& channel,
                                               grpc::ClientContext* ctx)>;
grpc::Status CallWithFailover(CoordinatorChannels& channels, absl::Time deadline,
                              Idempotency idempotency, const FailoverRpc& rpc,
                              std::string* answered_by = nullptr);

// The backoff between tries: starts at 50 ms, doubles, at most 1 s.
absl::Duration NextFailoverBackoff(absl::Duration previous);

}  // namespace trainctl

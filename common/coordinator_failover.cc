// Failover between coordinators (coordinator_failover.h).
#include "common/coordinator_failover.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainctl {
namespace {

// gRPC target schemes passed through as they are (a unix socket, an
// explicit resolver): gRPC checks them when it dials.
bool HasScheme(absl::string_view entry) {
  if (absl::StrContains(entry, "://")) return true;
  for (absl::string_view scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(entry, scheme)) return true;
  }
  return false;
}

bool IsHostNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_'; }

// Remembered active coordinator per list, for this process.
absl::Mutex remembered_mu(absl::kConstInit);
std::map<std::string, std::string>& Remembered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(remembered_mu) {
  static auto* m = new std::map<std::string, std::string>();
  return *m;
}

}  // namespace

absl::Status CheckHostPort(absl::string_view entry) {
  absl::string_view host, port;
  if (absl::StartsWith(entry, "[")) {
    size_t close = entry.find(']');
    if (close == absl::string_view::npos || close + 1 >= entry.size() || entry[close + 1] != ':') {
      return absl::InvalidArgumentError("expected [IPV6]:PORT");
    }
    host = entry.substr(1, close - 1);
    port = entry.substr(close + 2);
    if (host.empty() || !std::all_of(host.begin(), host.end(), [](char c) {
          return absl::ascii_isxdigit(c) || c == ':' || c == '.' || c == '%';
        })) {
      return absl::InvalidArgumentError("expected [IPV6]:PORT");
    }
  } else {
    size_t colon = entry.rfind(':');
    if (colon == absl::string_view::npos)
      return absl::InvalidArgumentError("expected HOST:PORT (no port)");
    host = entry.substr(0, colon);
    port = entry.substr(colon + 1);
    if (host.empty()) return absl::InvalidArgumentError("expected HOST:PORT (no host)");
    if (!std::all_of(host.begin(), host.end(), IsHostNameChar)) {
      return absl::InvalidArgumentError(
          "expected HOST:PORT (a host is a DNS name or an address; an IPv6 address goes in "
          "[brackets])");
    }
  }
  int p = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port '", port, "' is not a number in 1..65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseCoordinatorList(absl::string_view text,
                                                              absl::string_view flag) {
  std::vector<std::string> out;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": empty (expected HOST:PORT[,HOST:PORT...])"));
  }
  int n = 0;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    ++n;
    absl::string_view entry = absl::StripAsciiWhitespace(raw);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": entry ", n, " of '", text, "' is empty (expected HOST:PORT[,HOST:PORT...])"));
    }
    if (!HasScheme(entry)) {
      if (absl::Status s = CheckHostPort(entry); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": '", entry, "': ", s.message()));
      }
    }
    if (std::find(out.begin(), out.end(), entry) != out.end()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", entry, "' is listed twice"));
    }
    out.emplace_back(entry);
  }
  return out;
}

std::optional<std::string> ActiveCoordinatorHint(const grpc::Status& status,
                                                 const grpc::ClientContext& ctx) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return std::nullopt;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kActiveCoordinatorKey);
  if (it == trailers.end()) return std::nullopt;
  std::string hint(it->second.data(), it->second.size());
  // Only HOST:PORT: a hint cannot send a client to a unix socket or
  // another resolver.
  if (!CheckHostPort(hint).ok()) return std::nullopt;
  return hint;
}

bool IsStandbyAnswer(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         absl::StartsWith(status.error_message(), kStandbyMessagePrefix);
}

bool CertainlyNotRun(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         (IsStandbyAnswer(status) || absl::StartsWith(status.error_message(), kUnreachablePrefix));
}

std::string RememberedActive(const std::string& list_text) {
  absl::MutexLock lock(&remembered_mu);
  auto it = Remembered().find(list_text);
  return it == Remembered().end() ? "" : it->second;
}

CoordinatorRotation::CoordinatorRotation(std::vector<std::string> list) : list_(std::move(list)) {
  std::string remembered = RememberedActive(ListText());
  absl::MutexLock lock(&mu_);
  if (remembered.empty()) return;
  auto it = std::find(list_.begin(), list_.end(), remembered);
  if (it != list_.end()) {
    next_ = static_cast<size_t>(it - list_.begin());
  } else {
    override_ = remembered;
  }
}

std::string CoordinatorRotation::ListText() const { return absl::StrJoin(list_, ","); }

std::string CoordinatorRotation::Current() {
  absl::MutexLock lock(&mu_);
  return override_.empty() ? list_[next_] : override_;
}

void CoordinatorRotation::Answered(const std::string& address) {
  {
    absl::MutexLock lock(&remembered_mu);
    Remembered()[ListText()] = address;
  }
  absl::MutexLock lock(&mu_);
  auto it = std::find(list_.begin(), list_.end(), address);
  if (it != list_.end()) {
    next_ = static_cast<size_t>(it - list_.begin());
    override_.clear();
  } else {
    override_ = address;
  }
}

void CoordinatorRotation::Follow(const std::string& hint) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(list_.begin(), list_.end(), hint);
  if (it != list_.end()) {
    next_ = static_cast<size_t>(it - list_.begin());
    override_.clear();
  } else {
    override_ = hint;
  }
}

void CoordinatorRotation::Unreachable(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (!override_.empty()) {
    // A hinted address that does not serve: back to the list, at the
    // entry after the one that named it.
    if (override_ == address) {
      override_.clear();
      next_ = (next_ + 1) % list_.size();
    }
    return;
  }
  if (list_[next_] == address) next_ = (next_ + 1) % list_.size();
}

CoordinatorChannels::CoordinatorChannels(std::vector<std::string> list, Factory factory)
    : rotation_(std::move(list)), factory_(std::move(factory)) {}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannels::Get(
    const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> made = factory_(address);
  if (made.ok()) channels_[address] = *made;
  return made;
}

void CoordinatorChannels::Forget(const std::string& address) {
  absl::MutexLock lock(&mu_);
  channels_.erase(address);
}

bool WaitForReady(grpc::Channel& channel, absl::Time deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) return false;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return true;
}

absl::Duration NextFailoverBackoff(absl::Duration previous) {
  return std::clamp(previous * 2, absl::Milliseconds(50), absl::Seconds(1));
}

grpc::Status CallWithFailover(CoordinatorChannels& channels, absl::Time deadline,
                              Idempotency idempotency, const FailoverRpc& rpc,
                              std::string* answered_by) {
  CoordinatorRotation& rotation = channels.rotation();
  absl::Duration backoff = absl::ZeroDuration();
  grpc::Status last;
  bool tried = false;
  while (true) {
    if (tried) {
      // Short and bounded: a try that cannot finish before the deadline
      // is not begun.
      backoff = NextFailoverBackoff(backoff);
      if (absl::Now() + backoff >= deadline) return last;
      absl::SleepFor(backoff);
    }
    tried = true;
    const std::string address = rotation.Current();
    if (answered_by != nullptr) *answered_by = address;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = channels.Get(address);
    if (!channel.ok()) {
      // A TLS file unreadable: no other address fixes that.
      return grpc::Status(static_cast<grpc::StatusCode>(channel.status().code()),
                          std::string(channel.status().message()));
    }
    // With several addresses (or a hinted one, which may be stale) one that
    // never answers (a black hole, not a refusal) must not use up the whole
    // deadline: at most 3 s per try.
    const std::vector<std::string>& list = rotation.list();
    const bool several =
        list.size() > 1 || std::find(list.begin(), list.end(), address) == list.end();
    const absl::Time connect_by =
        several ? std::min(deadline, absl::Now() + absl::Seconds(3)) : deadline;
    if (!WaitForReady(**channel, connect_by)) {
      // Never READY: gRPC sent nothing, so any call may go elsewhere.
      channels.Forget(address);
      rotation.Unreachable(address);
      last = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat(kUnreachablePrefix, address,
                       list.size() > 1 ? absl::StrCat(" (of ", rotation.ListText(), ")") : ""));
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    last = rpc(*channel, &ctx);
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE) {
      // An answer from a serving coordinator (DEADLINE_EXCEEDED: maybe not,
      // but the deadline is spent anyway).
      if (last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) rotation.Answered(address);
      return last;
    }
    if (std::optional<std::string> hint = ActiveCoordinatorHint(last, ctx); hint.has_value()) {
      // A standby: the call did not run. Go where it points.
      rotation.Follow(*hint);
      if (*hint == address)
        backoff = NextFailoverBackoff(backoff);  // a standby naming itself: slow down
      continue;
    }
    if (IsStandbyAnswer(last)) {
      // A standby that knows no active coordinator yet: try the next one.
      rotation.Unreachable(address);
      continue;
    }
    // UNAVAILABLE after the call may have been sent (the connection broke,
    // or the coordinator itself said so): only an idempotent call goes again.
    if (idempotency != Idempotency::kIdempotent) return last;
    channels.Forget(address);
    rotation.Unreachable(address);
  }
}

}  // namespace trainctl

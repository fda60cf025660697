#include "coordinator/auth/token_authority.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/auth/secret.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/queues/queue_registry.h"
#include "coordinator/workers/worker_registry.h"

namespace trainctl::coordinator {
namespace {

// Why token `t` no longer authenticates anyone at `now` (revoked or
// expired); OK while it does.
absl::Status Lapsed(const v1::Token& t, absl::Time now) {
  if (t.revoked()) {
    return absl::UnauthenticatedError(
        absl::StrCat("token '", t.id(), "' (", t.name(), ") was revoked"));
  }
  if (t.has_expire_time() && now >= FromTimestamp(t.expire_time())) {
    return absl::UnauthenticatedError(
        absl::StrCat("token '", t.id(), "' (", t.name(), ") expired at ",
                     absl::FormatTime(FromTimestamp(t.expire_time()))));
  }
  return absl::OkStatus();
}

}  // namespace

bool ValidWorkerAddress(absl::string_view a) {
  return !a.empty() && a.size() <= 253 && std::all_of(a.begin(), a.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == ':' || c == '_';
  });
}

std::string RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_ADMIN:
      return "admin";
    case v1::ROLE_SUBMITTER:
      return "submitter";
    case v1::ROLE_VIEWER:
      return "viewer";
    case v1::ROLE_WORKER:
      return "worker";
    case v1::ROLE_JOIN:
      return "join";
    default:
      return "unspecified";
  }
}

absl::StatusOr<v1::Role> ParseRole(absl::string_view name) {
  for (v1::Role r :
       {v1::ROLE_ADMIN, v1::ROLE_SUBMITTER, v1::ROLE_VIEWER, v1::ROLE_WORKER, v1::ROLE_JOIN}) {
    if (absl::AsciiStrToLower(name) == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role: '", name, "' is not one of admin, submitter, viewer, worker"));
}

absl::Status TokenAuthority::Load() {
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<StoredToken> tokens, store_->auth().LoadTokens());
  TRAINCTL_ASSIGN_OR_RETURN(auto bindings, store_->auth().LoadWorkerBindings());
  TRAINCTL_ASSIGN_OR_RETURN(std::vector<v1::RevokeWorkerResponse> revoked,
                            store_->auth().LoadRevokedWorkers());
  absl::MutexLock lock(&mu_);
  for (v1::RevokeWorkerResponse& r : revoked) {
    for (const std::string& serial : r.serials()) revoked_serials_[serial] = r.worker_id();
    std::string id = r.worker_id();
    revoked_workers_[id] = std::move(r);
  }
  for (StoredToken& t : tokens) {
    std::string id = t.token.id();
    tokens_[id] = std::move(t);
  }
  for (auto& [worker, token] : bindings) bindings_[worker] = token;
  return absl::OkStatus();
}

void TokenAuthority::SetBootstrapAdmin(const std::string& secret) {
  absl::MutexLock lock(&mu_);
  admin_hash_ = secret.empty() ? "" : auth::Sha256Hex(secret);
}

absl::StatusOr<Principal> TokenAuthority::Authenticate(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "no token: send `authorization: Bearer <token>` (trainctl login, --token or "
        "$TRAINCTL_TOKEN)");
  }
  absl::string_view secret = authorization;
  if (!absl::ConsumePrefix(&secret, "Bearer ") && !absl::ConsumePrefix(&secret, "bearer ")) {
    return absl::UnauthenticatedError("authorization: expected `Bearer <token>`");
  }
  secret = absl::StripAsciiWhitespace(secret);
  absl::MutexLock lock(&mu_);
  const std::string id = auth::TokenIdOfSecret(secret);
  auto it = id.empty() ? tokens_.end() : tokens_.find(id);
  if (it == tokens_.end() || !auth::SecretMatches(secret, it->second.secret_hash)) {
    if (!admin_hash_.empty() && auth::SecretMatches(secret, admin_hash_)) {
      return Principal{kBootstrapAdminId, kBootstrapAdminId, v1::ROLE_ADMIN};
    }
    return absl::UnauthenticatedError(
        "unknown token (never issued by this coordinator, or mistyped)");
  }
  const v1::Token& t = it->second.token;
  TRAINCTL_RETURN_IF_ERROR(Lapsed(t, clock_->Now()));
  if (t.one_time() && t.used()) {
    return absl::UnauthenticatedError(
        absl::StrCat("one-time token '", t.id(), "' (", t.name(), ") was already used"));
  }
  return Principal{t.id(), t.name(), t.role(),
                   std::vector<std::string>(t.addresses().begin(), t.addresses().end()),
                   std::vector<std::string>(t.queues().begin(), t.queues().end())};
}

absl::Status TokenAuthority::StillValid(const Principal& who) const {
  if (absl::StartsWith(who.token_id, "cert:")) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (who.token_id == kBootstrapAdminId) {
    if (!admin_hash_.empty()) return absl::OkStatus();
    return absl::UnauthenticatedError("the bootstrap admin token was disabled");
  }
  auto it = tokens_.find(who.token_id);
  if (it == tokens_.end()) {
    return absl::UnauthenticatedError(
        absl::StrCat("token '", who.token_id, "' is no longer known"));
  }
  return Lapsed(it->second.token, clock_->Now());
}

absl::Status TokenAuthority::Authorize(const Principal& who, absl::string_view call,
                                       absl::Span<const v1::Role> roles) {
  if (std::find(roles.begin(), roles.end(), who.role) != roles.end()) return absl::OkStatus();
  std::vector<std::string> names;
  for (v1::Role r : roles) names.push_back(RoleName(r));
  return absl::PermissionDeniedError(absl::StrCat(call, " needs role ",
                                                  absl::StrJoin(names, " or "), "; token '",
                                                  who.token_id, "' has role ", RoleName(who.role)));
}

absl::StatusOr<v1::CreateTokenResponse> TokenAuthority::Create(const v1::CreateTokenRequest& req,
                                                               const Principal& by) {
  if (req.role() == v1::ROLE_UNSPECIFIED || !v1::Role_IsValid(req.role())) {
    return absl::InvalidArgumentError("role: one of admin, submitter, viewer, worker, join");
  }
  if (req.name().size() > 64 || !std::all_of(req.name().begin(), req.name().end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '@' || c == '-';
      })) {
    return absl::InvalidArgumentError("name: at most 64 characters of [A-Za-z0-9._@-]");
  }
  absl::Duration ttl = absl::Seconds(req.ttl().seconds()) + absl::Nanoseconds(req.ttl().nanos());
  if (ttl < absl::ZeroDuration())
    return absl::InvalidArgumentError("ttl: must be >= 0 (0 = never expires)");
  const bool join = req.role() == v1::ROLE_JOIN;
  if (req.one_time() && !join) {
    // A reusable role's token that dies after one call would strand its
    // holder (a worker reconnects with it); only joining happens once.
    return absl::InvalidArgumentError("one_time: only join tokens are one-time");
  }
  if (req.addresses_size() > 0 && !join && req.role() != v1::ROLE_WORKER) {
    return absl::InvalidArgumentError(
        "addresses: only join and worker tokens name a worker's addresses");
  }
  if (req.addresses_size() > kMaxTokenAddresses) {
    return absl::InvalidArgumentError(absl::StrCat("addresses: at most ", kMaxTokenAddresses));
  }
  for (int i = 0; i < req.addresses_size(); ++i) {
    if (!ValidWorkerAddress(req.addresses(i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "addresses[", i, "]: '", req.addresses(i),
          "' is not a host name or IP address (at most 253 characters of [A-Za-z0-9.:_-])"));
    }
  }
  // Queues are not checked against the defined ones: a token may be made
  // before its queues are (a job naming an undefined queue is refused then).
  if (req.queues_size() > 0 && req.role() != v1::ROLE_SUBMITTER && req.role() != v1::ROLE_ADMIN) {
    return absl::InvalidArgumentError("queues: only submitter and admin tokens name queues");
  }
  if (req.queues_size() > kMaxTokenQueues) {
    return absl::InvalidArgumentError(
        absl::StrCat("queues: at most ", kMaxTokenQueues, ", got ", req.queues_size()));
  }
  for (int i = 0; i < req.queues_size(); ++i) {
    TRAINCTL_RETURN_IF_ERROR(CheckQueueName(absl::StrCat("queues[", i, "]"), req.queues(i)));
    for (int j = 0; j < i; ++j) {
      if (req.queues(j) == req.queues(i)) {
        return absl::InvalidArgumentError(
            absl::StrCat("queues[", i, "]: '", req.queues(i), "' is named twice"));
      }
    }
  }
  // A join token is always one-time and always expires: it is handed
  // around (a provisioning script, a cloud-init file) before it is used.
  if (join && ttl == absl::ZeroDuration()) ttl = kDefaultJoinTtl;
  StoredToken st;
  v1::Token& t = st.token;
  absl::MutexLock lock(&mu_);
  do {
    t.set_id(auth::NewTokenId());
  } while (tokens_.contains(t.id()) || t.id() == kBootstrapAdminId);
  t.set_name(req.name().empty() ? t.id() : req.name());
  t.set_role(req.role());
  absl::Time now = clock_->Now();
  SetTimestamp(now, t.mutable_create_time());
  if (ttl > absl::ZeroDuration()) SetTimestamp(now + ttl, t.mutable_expire_time());
  t.set_one_time(join);
  t.set_created_by(by.token_id);
  *t.mutable_addresses() = req.addresses();
  *t.mutable_queues() = req.queues();
  std::string secret = auth::NewSecret(t.id());
  st.secret_hash = auth::Sha256Hex(secret);
  TRAINCTL_RETURN_IF_ERROR(store_->auth().PutToken(t, st.secret_hash));
  v1::CreateTokenResponse resp;
  *resp.mutable_token() = t;
  resp.set_secret(secret);
  tokens_[t.id()] = std::move(st);
  return resp;
}

std::vector<v1::Token> TokenAuthority::List(bool include_revoked) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Token> out;
  absl::Time now = clock_->Now();
  for (const auto& [id, st] : tokens_) {
    const v1::Token& t = st.token;
    bool gone = t.revoked() || (t.has_expire_time() && now >= FromTimestamp(t.expire_time())) ||
                (t.one_time() && t.used());
    if (gone && !include_revoked) continue;
    out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const v1::Token& a, const v1::Token& b) {
    if (a.create_time().seconds() != b.create_time().seconds()) {
      return a.create_time().seconds() < b.create_time().seconds();
    }
    return a.id() < b.id();
  });
  return out;
}

absl::StatusOr<v1::Token> TokenAuthority::Revoke(const std::string& id) {
  v1::Token t;
  {
    absl::MutexLock lock(&mu_);
    auto it = tokens_.find(id);
    if (it == tokens_.end()) {
      if (id == kBootstrapAdminId) {
        return absl::InvalidArgumentError(
            "id: the bootstrap admin token lives in --admin-token-file; replace that file and "
            "restart");
      }
      return absl::NotFoundError(absl::StrCat("token '", id, "' not found"));
    }
    if (it->second.token.revoked()) return it->second.token;
    t = it->second.token;
    t.set_revoked(true);
    SetTimestamp(clock_->Now(), t.mutable_revoke_time());
    TRAINCTL_RETURN_IF_ERROR(store_->auth().PutToken(t, it->second.secret_hash));
    it->second.token = t;
  }
  // Outside the lock: the listener may ask StillValid right away.
  if (on_revoke_) on_revoke_(id);
  return t;
}

absl::Status TokenAuthority::ConsumeOneTime(const std::string& token_id) {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(token_id);
  if (it == tokens_.end() || !it->second.token.one_time()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token '", token_id, "' is not a one-time token"));
  }
  v1::Token t = it->second.token;
  if (t.used()) {
    return absl::UnauthenticatedError(
        absl::StrCat("one-time token '", t.id(), "' (", t.name(), ") was already used"));
  }
  t.set_used(true);
  TRAINCTL_RETURN_IF_ERROR(store_->auth().PutToken(t, it->second.secret_hash));
  it->second.token = t;
  return absl::OkStatus();
}

bool TokenAuthority::WorkerBound(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return bindings_.contains(worker_id);
}

absl::Status TokenAuthority::BindWorker(const std::string& worker_id, const Principal& who) {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(worker_id);
  if (it != bindings_.end()) {
    if (it->second == who.token_id) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat("register: worker id '", worker_id,
                                                    "' belongs to another token; token '",
                                                    who.token_id, "' may not use it"));
  }
  TRAINCTL_RETURN_IF_ERROR(store_->auth().PutWorkerBinding(worker_id, who.token_id));
  bindings_[worker_id] = who.token_id;
  return absl::OkStatus();
}

absl::Status TokenAuthority::CheckWorker(const std::string& worker_id, const Principal& who) const {
  absl::MutexLock lock(&mu_);
  auto it = bindings_.find(worker_id);
  if (it == bindings_.end() || it->second == who.token_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("register: worker id '", worker_id,
                                                  "' belongs to another token; token '",
                                                  who.token_id, "' may not use it"));
}

void TokenAuthority::NoteCertSerial(const std::string& worker_id, const std::string& serial) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string>& seen = seen_serials_[worker_id];
  if (std::find(seen.begin(), seen.end(), serial) != seen.end()) return;
  if (seen.size() >= kMaxSerialsSeen) seen.erase(seen.begin());
  seen.push_back(serial);
}

absl::StatusOr<v1::RevokeWorkerResponse> TokenAuthority::RevokeWorkerCert(
    const std::string& worker_id) {
  if (worker_id.empty()) return absl::InvalidArgumentError("worker_id: required");
  TRAINCTL_RETURN_IF_ERROR(CheckWorkerId("worker_id", worker_id));
  absl::MutexLock lock(&mu_);
  if (auto it = revoked_workers_.find(worker_id); it != revoked_workers_.end()) {
    v1::RevokeWorkerResponse again = it->second;
    again.set_newly_revoked(false);
    return again;
  }
  v1::RevokeWorkerResponse r;
  r.set_worker_id(worker_id);
  if (auto seen = seen_serials_.find(worker_id); seen != seen_serials_.end()) {
    for (const std::string& serial : seen->second) r.add_serials(serial);
  }
  SetTimestamp(clock_->Now(), r.mutable_revoke_time());
  r.set_newly_revoked(true);
  TRAINCTL_RETURN_IF_ERROR(store_->auth().PutRevokedWorker(r));
  for (const std::string& serial : r.serials()) revoked_serials_[serial] = worker_id;
  revoked_workers_[worker_id] = r;
  return r;
}

absl::Status TokenAuthority::CheckCert(const std::string& worker_id,
                                       const std::string& serial) const {
  absl::MutexLock lock(&mu_);
  auto it = revoked_workers_.find(worker_id);
  if (it == revoked_workers_.end() && !serial.empty()) {
    if (auto s = revoked_serials_.find(serial); s != revoked_serials_.end())
      it = revoked_workers_.find(s->second);
  }
  if (it == revoked_workers_.end()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("certificate of worker '", worker_id, "'",
                   serial.empty() ? "" : absl::StrCat(" (serial ", serial, ")"), " was revoked at ",
                   absl::FormatTime(FromTimestamp(it->second.revoke_time())),
                   " (trainctl worker revoke ", it->second.worker_id(), ")"));
}

}  // namespace trainctl::coordinator

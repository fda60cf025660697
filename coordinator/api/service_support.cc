#include "coordinator/api/service_support.h"

#include <grpc/grpc_security_constants.h>

#include "absl/strings/str_cat.h"
#include "common/auth/pki.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::StatusOr<Principal> Caller(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                                 absl::string_view call) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  absl::string_view header;
  if (it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Principal> who = c.auth->Authenticate(header);
  if (!who.ok()) {
    return absl::Status(who.status().code(), absl::StrCat(call, ": ", who.status().message()));
  }
  absl::Span<const v1::Role> roles = RolesOf(call);
  if (roles.empty())
    return absl::PermissionDeniedError(absl::StrCat(call, ": no role may call it"));
  absl::Status allowed = TokenAuthority::Authorize(*who, call, roles);
  if (!allowed.ok()) return allowed;
  return who;
}

std::optional<CertPeer> CertPeerOf(const grpc::CallbackServerContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (!auth) return std::nullopt;
  std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (cn.empty() || cn.front().empty()) return std::nullopt;
  CertPeer peer;
  peer.id.assign(cn.front().data(), cn.front().size());
  for (const grpc::string_ref& san : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    std::string name(san.data(), san.size());
    if (name.find("://") == std::string::npos) peer.sans.push_back(std::move(name));
  }
  std::vector<grpc::string_ref> pem = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (!pem.empty()) {
    absl::StatusOr<std::string> serial =
        auth::CertSerialHex(std::string(pem.front().data(), pem.front().size()));
    if (serial.ok()) peer.serial = *serial;
  }
  return peer;
}

absl::StatusOr<WorkerCaller> WorkerCallerOf(const ServiceContext& c,
                                            grpc::CallbackServerContext* ctx,
                                            absl::string_view call) {
  WorkerCaller caller;
  if (std::optional<CertPeer> peer = CertPeerOf(*ctx)) {
    caller.cert_id = peer->id;
    caller.cert_sans = std::move(peer->sans);
    caller.cert_serial = peer->serial;
    // Refused before the call starts: a revoked certificate gets nothing.
    if (absl::Status revoked = c.auth->CheckCert(caller.cert_id, caller.cert_serial);
        !revoked.ok()) {
      LogEvent(LogLevel::kWarn, "coordinator", "worker_revoked_refused",
               {{"worker_id", caller.cert_id},
                {"peer", ctx->peer()},
                {"call", std::string(call)},
                {"reason", std::string(revoked.message())}});
      return revoked;
    }
    if (!caller.cert_serial.empty()) c.auth->NoteCertSerial(caller.cert_id, caller.cert_serial);
  }
  if (!caller.cert_id.empty() &&
      ctx->client_metadata().find("authorization") == ctx->client_metadata().end()) {
    caller.who = Principal{absl::StrCat("cert:", caller.cert_id), caller.cert_id, v1::ROLE_WORKER};
    return caller;
  }
  TRAINCTL_ASSIGN_OR_RETURN(caller.who, Caller(c, ctx, call));
  return caller;
}

// A submitter acts only on its own jobs; admins on every job.
absl::Status MayActOnJob(const Principal& who, absl::string_view call, const v1::Job& job) {
  if (who.role == v1::ROLE_ADMIN || job.owner_token_id() == who.token_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      call, ": job '", job.id(), "' belongs to '", job.owner().empty() ? "nobody" : job.owner(),
      "'; a submitter acts only on its own jobs (role admin acts on every job)"));
}

void FillStoreHealth(const StateStore* store, v1::StoreHealth* out) {
  if (store == nullptr) return;
  const StateStore::WriteHealth h = store->write_health();
  out->set_failing(h.failing);
  if (h.failing) SetTimestamp(h.failing_since, out->mutable_failing_since());
  out->set_failed_writes(h.failed_writes);
  out->set_last_error(h.last_error);
}

}  // namespace trainctl::coordinator

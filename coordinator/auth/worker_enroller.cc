#include "coordinator/auth/worker_enroller.h"

#include <algorithm>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/time_util.h"
#include "coordinator/auth/method_roles.h"

namespace trainctl::coordinator {
namespace {

constexpr int kMaxAddresses = 16;

absl::Status CsrFieldError(const v1::JoinRequest& req) {
  if (req.csr_pem().empty())
    return absl::InvalidArgumentError("csr_pem: required (a PEM certificate request)");
  if (req.csr_pem().size() > 16384) return absl::InvalidArgumentError("csr_pem: at most 16 KiB");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WorkerEnroller::Sign(const std::string& id,
                                                 std::vector<std::string> sans,
                                                 const std::string& csr_pem) const {
  sans.push_back(auth::WorkerUri(id));
  absl::StatusOr<std::string> cert =
      auth::SignCsr(ca_, csr_pem, id, sans, validity_, auth::CertPurpose::kClient);
  if (!cert.ok())
    return absl::InvalidArgumentError(absl::StrCat("csr_pem: ", cert.status().message()));
  return cert;
}

v1::JoinResponse WorkerEnroller::Reply(const std::string& id, std::string cert_pem) const {
  v1::JoinResponse resp;
  resp.set_worker_id(id);
  resp.set_cert_pem(std::move(cert_pem));
  resp.set_ca_pem(ca_.cert_pem);
  SetTimestamp(clock_->Now() + validity_, resp.mutable_expire_time());
  return resp;
}

absl::StatusOr<v1::JoinResponse> WorkerEnroller::Renew(const std::string& worker_id,
                                                       const std::vector<std::string>& sans,
                                                       const v1::JoinRequest& req) {
  if (!enabled()) {
    return absl::FailedPreconditionError("renew: this coordinator has no CA key to sign with");
  }
  if (!req.worker_id().empty() && req.worker_id() != worker_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker_id: '", req.worker_id(),
                     "': a certificate renews only itself (it names '", worker_id, "')"));
  }
  TRAINCTL_RETURN_IF_ERROR(CsrFieldError(req));
  TRAINCTL_RETURN_IF_ERROR(auth::CheckCsr(req.csr_pem(), "csr_pem"));
  absl::StatusOr<std::string> cert = Sign(worker_id, sans, req.csr_pem());
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> serial = auth::CertSerialHex(*cert);
  // What RevokeWorker lists for the id (revocation itself is by id).
  if (serial.ok()) tokens_->NoteCertSerial(worker_id, *serial);
  v1::JoinResponse resp = Reply(worker_id, *std::move(cert));
  LogEvent(LogLevel::kInfo, "coordinator", "worker_cert_renewed",
           {{"worker_id", worker_id},
            {"serial", serial.ok() ? *serial : ""},
            {"addresses", absl::StrJoin(sans, ",")},
            {"valid_for", absl::FormatDuration(validity_)}});
  return resp;
}

absl::StatusOr<v1::JoinResponse> WorkerEnroller::Join(const Principal& who,
                                                      const v1::JoinRequest& req) {
  TRAINCTL_RETURN_IF_ERROR(TokenAuthority::Authorize(who, "Join", RolesOf("Join")));
  if (!enabled()) {
    return absl::FailedPreconditionError(
        "join: this coordinator has no CA key to sign with (start it with --tls-dir holding "
        "ca.key, or "
        "--tls-ca-key)");
  }
  if (!req.worker_id().empty()) {
    TRAINCTL_RETURN_IF_ERROR(CheckWorkerId("worker_id", req.worker_id()));
    // A certificate's common name holds at most 64 characters (X.509).
    if (req.worker_id().size() > 64)
      return absl::InvalidArgumentError("worker_id: at most 64 characters");
  }
  TRAINCTL_RETURN_IF_ERROR(CsrFieldError(req));
  if (req.addresses_size() > kMaxAddresses) {
    return absl::InvalidArgumentError(absl::StrCat("addresses: at most ", kMaxAddresses));
  }
  for (int i = 0; i < req.addresses_size(); ++i) {
    if (!ValidWorkerAddress(req.addresses(i))) {
      return absl::InvalidArgumentError(absl::StrCat("addresses[", i, "]: '", req.addresses(i),
                                                     "' is not a host name or IP address"));
    }
  }
  std::string id = req.worker_id();
  if (id.empty()) {
    static std::mt19937_64 rng(std::random_device{}());
    do {
      id = absl::StrFormat("w-%012x", rng() & 0xffffffffffffULL);
    } while (registry_->Find(id) != nullptr || tokens_->WorkerBound(id));
  } else if (registry_->Find(id) != nullptr || tokens_->WorkerBound(id)) {
    // A second certificate for a known id would let its holder impersonate
    // that worker; rejoining needs a new id (or the old worker forgotten).
    return absl::AlreadyExistsError(absl::StrCat(
        "worker_id: '", id, "' is already known to this coordinator; join under another id"));
  }
  // A weak key is refused before anything else is decided (the token stays usable).
  TRAINCTL_RETURN_IF_ERROR(auth::CheckCsr(req.csr_pem(), "csr_pem"));
  // The certificate names only what the admin authorised with the token:
  // whatever else the worker asks for (its --address, its hostname) is
  // left out, so a join token cannot buy a name of the coordinator or of
  // another host. The URI names the worker; with it gRPC's name check never
  // falls back to the CN (the id, which the joiner may choose).
  std::vector<std::string> sans = who.addresses;
  std::vector<std::string> ignored;
  for (const std::string& a : req.addresses()) {
    if (std::find(sans.begin(), sans.end(), a) == sans.end()) ignored.push_back(a);
  }
  absl::StatusOr<std::string> cert = Sign(id, sans, req.csr_pem());
  if (!cert.ok()) return cert.status();
  // Consume first: a token used meanwhile (a concurrent Join) gets nothing.
  TRAINCTL_RETURN_IF_ERROR(tokens_->ConsumeOneTime(who.token_id));
  TRAINCTL_RETURN_IF_ERROR(
      tokens_->BindWorker(id, Principal{TokenAuthority::CertBinding(id), id, v1::ROLE_WORKER}));
  v1::JoinResponse resp = Reply(id, *std::move(cert));
  LogEvent(LogLevel::kInfo, "coordinator", "worker_joined",
           {{"worker_id", id},
            {"join_token", who.token_id},
            {"token_name", who.name},
            {"addresses", absl::StrJoin(who.addresses, ",")},
            {"not_authorised", absl::StrJoin(ignored, ",")}});
  return resp;
}

}  // namespace trainctl::coordinator

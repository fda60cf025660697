#include "worker/daemon/join.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/coordinator_failover.h"
#include "trainctl/v1/auth.grpc.pb.h"

namespace trainctl::worker {

std::string JoinedCertFile(const std::string& work_dir) { return work_dir + "/worker.crt"; }
std::string JoinedKeyFile(const std::string& work_dir) { return work_dir + "/worker.key"; }

namespace {

std::string NewSuffix(const std::string& path) { return path + ".new"; }

// A renewal writes worker.key.new and worker.crt.new, then renames the key,
// then the certificate. Both .new files left: the swap had not begun (the
// old pair is whole): drop them. Only the certificate's: the key is the new
// one already: finish with the certificate.
void FinishInterruptedSwap(const std::string& work_dir) {
  const std::string key_new = NewSuffix(JoinedKeyFile(work_dir));
  const std::string cert_new = NewSuffix(JoinedCertFile(work_dir));
  std::error_code ec;
  if (!std::filesystem::exists(cert_new, ec)) {
    std::filesystem::remove(key_new, ec);
    return;
  }
  if (std::filesystem::exists(key_new, ec)) {
    std::filesystem::remove(key_new, ec);
    std::filesystem::remove(cert_new, ec);
    return;
  }
  std::filesystem::rename(cert_new, JoinedCertFile(work_dir), ec);
}

// The coordinators of `coordinator` ("a:7070" or a list), one channel each
// with `security` (TLS verified for each address's own host name).
std::unique_ptr<CoordinatorChannels> JoinChannels(const std::string& coordinator,
                                                  const auth::ChannelSecurity& security) {
  absl::StatusOr<std::vector<std::string>> list =
      ParseCoordinatorList(coordinator, "--coordinator");
  return std::make_unique<CoordinatorChannels>(
      list.ok() ? *list : std::vector<std::string>{coordinator},
      [security](const std::string& address) {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        return auth::MakeChannel(address, security, args);
      });
}

// AuthService.Join on the active coordinator, within 10 s. (gRPC deadlines
// are wall times that gRPC turns into its own monotonic time at once: the
// real clock, never an injected one.) Not idempotent
// (a join token is spent once): sent again only where it certainly did not
// run (a standby's answer, a connection never made).
grpc::Status CallJoin(CoordinatorChannels& channels, const v1::JoinRequest& req,
                      v1::JoinResponse* resp) {
  return CallWithFailover(
      channels, absl::Now() + absl::Seconds(10), Idempotency::kNotIdempotent,
      [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx) {
        resp->Clear();
        return v1::AuthService::NewStub(channel)->Join(ctx, req, resp);
      });
}

}  // namespace

absl::StatusOr<WorkerIdentity> JoinedIdentity(const std::string& work_dir) {
  FinishInterruptedSwap(work_dir);
  WorkerIdentity id{"", JoinedCertFile(work_dir), JoinedKeyFile(work_dir), false};
  absl::StatusOr<std::string> cert = auth::ReadFile(id.cert_file);
  if (!cert.ok() || !auth::ReadFile(id.key_file).ok()) {
    return absl::NotFoundError(absl::StrCat("no certificate from an earlier join in ", work_dir));
  }
  absl::StatusOr<std::string> cn = auth::CertCommonName(*cert);
  if (!cn.ok()) return absl::DataLossError(absl::StrCat(id.cert_file, ": ", cn.status().message()));
  id.worker_id = *cn;
  return id;
}

absl::StatusOr<WorkerIdentity> Join(const JoinOptions& o) {
  if (o.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--ca: required to join (the cluster CA verifies the coordinator)");
  }
  std::error_code ec;
  std::filesystem::create_directories(o.work_dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--work-dir ", o.work_dir, ": ", ec.message()));
  absl::StatusOr<std::string> key = auth::NewPrivateKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = auth::NewCsr(*key, "trainctl-worker");
  if (!csr.ok()) return csr.status();
  auth::ChannelSecurity security;
  security.token = o.join_token;
  security.ca_file = o.ca_file;
  if (absl::Status readable = auth::ReadFile(o.ca_file).status(); !readable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("CA file ", readable.message()));
  }
  std::unique_ptr<CoordinatorChannels> channels = JoinChannels(o.coordinator, security);
  v1::JoinRequest req;
  req.set_csr_pem(*csr);
  for (const std::string& a : o.addresses) {
    if (!a.empty()) req.add_addresses(a);
  }
  v1::JoinResponse resp;
  grpc::Status s;
  const Clock& clock = o.clock != nullptr ? *o.clock : *SystemClock::Get();
  const absl::Time deadline = clock.Mono() + o.timeout;
  while (true) {
    s = CallJoin(*channels, req, &resp);
    // A coordinator not up yet (a compose file starts everything at once),
    // or only standbys answering: try again. A join that may have run (its
    // answer lost) is not sent again: the token may be spent.
    if (s.ok() || !CertainlyNotRun(s) || clock.Mono() >= deadline) break;
    absl::SleepFor(absl::Seconds(1));
  }
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("join ", o.coordinator, ": ", s.error_message()));
  }
  absl::StatusOr<std::string> cn = auth::CertCommonName(resp.cert_pem());
  if (!cn.ok() || *cn != resp.worker_id()) {
    return absl::DataLossError("join: the coordinator's certificate does not name the id it gave");
  }
  WorkerIdentity id{resp.worker_id(), JoinedCertFile(o.work_dir), JoinedKeyFile(o.work_dir), true};
  // The key first: a certificate on disk means the join completed.
  for (auto [path, text] : {std::pair<std::string, const std::string*>{id.key_file, &*key},
                            {id.cert_file, &resp.cert_pem()},
                            {o.work_dir + "/worker-id", &resp.worker_id()}}) {
    if (absl::Status w = auth::WritePrivateFile(path, *text); !w.ok()) return w;
  }
  return id;
}

RenewResult RenewCertificateIfDue(const std::string& coordinator, const std::string& ca_file,
                                  const std::string& work_dir, absl::Time now) {
  RenewResult r;
  const std::string cert_file = JoinedCertFile(work_dir);
  const std::string key_file = JoinedKeyFile(work_dir);
  absl::StatusOr<std::string> cert = auth::ReadFile(cert_file);
  absl::StatusOr<auth::CertValidity> validity =
      cert.ok() ? auth::CertValidityOf(*cert) : absl::StatusOr<auth::CertValidity>(cert.status());
  if (!validity.ok()) {
    r.error = absl::Status(validity.status().code(),
                           absl::StrCat(cert_file, ": ", validity.status().message()));
    return r;
  }
  const absl::Duration total = validity->not_after - validity->not_before;
  r.expires = validity->not_after;
  r.next_check = std::clamp(total / 20, absl::Seconds(1), absl::Hours(1));
  if (validity->not_after - now > total / 3) return r;

  absl::StatusOr<std::string> key = auth::NewPrivateKey();
  absl::StatusOr<std::string> csr = key.ok() ? auth::NewCsr(*key, "trainctl-worker") : key.status();
  if (!csr.ok()) {
    r.error = csr.status();
    return r;
  }
  auth::ChannelSecurity security;
  security.ca_file = ca_file;
  security.cert_file = cert_file;
  security.key_file = key_file;
  std::unique_ptr<CoordinatorChannels> channels = JoinChannels(coordinator, security);
  v1::JoinRequest req;
  req.set_csr_pem(*csr);
  v1::JoinResponse resp;
  grpc::Status s = CallJoin(*channels, req, &resp);
  if (!s.ok()) {
    r.error = absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                           absl::StrCat("renew at ", coordinator, ": ", s.error_message()));
    return r;
  }
  absl::StatusOr<std::string> old_cn = auth::CertCommonName(*cert);
  absl::StatusOr<std::string> cn = auth::CertCommonName(resp.cert_pem());
  absl::StatusOr<auth::CertValidity> renewed = auth::CertValidityOf(resp.cert_pem());
  if (!cn.ok() || !old_cn.ok() || *cn != *old_cn || !renewed.ok()) {
    r.error = absl::DataLossError("renew: the coordinator's certificate does not name this worker");
    return r;
  }
  // Both written whole first; then the key, then the certificate (see
  // FinishInterruptedSwap for a crash in between).
  for (auto [path, text] : {std::pair<std::string, const std::string*>{NewSuffix(key_file), &*key},
                            {NewSuffix(cert_file), &resp.cert_pem()}}) {
    if (absl::Status w = auth::WritePrivateFile(path, *text); !w.ok()) {
      r.error = w;
      return r;
    }
  }
  std::error_code ec;
  std::filesystem::rename(NewSuffix(key_file), key_file, ec);
  if (!ec) std::filesystem::rename(NewSuffix(cert_file), cert_file, ec);
  if (ec) {
    r.error = absl::InternalError(absl::StrCat("renew: replacing ", cert_file, ": ", ec.message()));
    return r;
  }
  r.renewed = true;
  r.expires = renewed->not_after;
  r.next_check =
      std::clamp((renewed->not_after - renewed->not_before) / 20, absl::Seconds(1), absl::Hours(1));
  return r;
}

}  // namespace trainctl::worker

#include "worker/daemon/join.h"

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "trainctl/v1/auth.grpc.pb.h"

namespace trainctl::worker {

std::string JoinedCertFile(const std::string& work_dir) { return work_dir + "/worker.crt"; }
std::string JoinedKeyFile(const std::string& work_dir) { return work_dir + "/worker.key"; }

absl::StatusOr<WorkerIdentity> JoinedIdentity(const std::string& work_dir) {
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
    return absl::InvalidArgumentError("--ca: required to join (the cluster CA verifies the coordinator)");
  }
  std::error_code ec;
  std::filesystem::create_directories(o.work_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--work-dir ", o.work_dir, ": ", ec.message()));
  absl::StatusOr<std::string> key = auth::NewPrivateKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = auth::NewCsr(*key, "trainctl-worker");
  if (!csr.ok()) return csr.status();
  auth::ChannelSecurity security;
  security.token = o.join_token;
  security.ca_file = o.ca_file;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      auth::MakeChannel(o.coordinator, security, grpc::ChannelArguments());
  if (!channel.ok()) return channel.status();
  auto stub = v1::AuthService::NewStub(*channel);
  v1::JoinRequest req;
  req.set_csr_pem(*csr);
  for (const std::string& a : o.addresses) {
    if (!a.empty()) req.add_addresses(a);
  }
  v1::JoinResponse resp;
  grpc::Status s;
  absl::Time deadline = absl::Now() + o.timeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);
    s = stub->Join(&ctx, req, &resp);
    // A coordinator not up yet (a compose file starts everything at once):
    // try again. Anything else is its answer.
    if (s.ok() || (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
                   s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) ||
        absl::Now() >= deadline) {
      break;
    }
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

}  // namespace trainctl::worker

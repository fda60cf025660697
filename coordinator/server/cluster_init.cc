// `trainctl-coordinator init` and `worker-cert` (see cluster_init.h).
#include "coordinator/server/cluster_init.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/clock.h"
#include "coordinator/auth/token_authority.h"
#include "coordinator/store/state_store.h"

namespace trainctl::coordinator {
namespace {

// `what: why`, as init reports a step that failed.
absl::Status InitStep(absl::string_view what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// The names the coordinator's certificate is for: loopback, this host, --san.
std::vector<std::string> CoordinatorSans(const ClusterInitOptions& o) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::vector<std::string> sans = {"localhost", "127.0.0.1", "::1"};
  // Each name once: the README's `--san $(hostname)` names the hostname
  // again, and the certificate and init's summary listed it twice.
  auto add = [&sans](const std::string& name) {
    if (!name.empty() && std::find(sans.begin(), sans.end(), name) == sans.end())
      sans.push_back(name);
  };
  add(host);
  for (const std::string& s : o.sans) add(s);
  return sans;
}

// The host the CLI config and the worker command name: the first --san,
// else this host's name, else localhost.
std::string InitAddressHost(const ClusterInitOptions& o) {
  for (const std::string& s : o.sans) {
    if (!s.empty()) return s;
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host[0] != '\0' ? host : "localhost";
}

// The cluster CA and the coordinator's key and certificate (for `sans`), in
// `dir`; the certificates readable by all, the keys by the owner only.
absl::Status WriteTlsFiles(const std::string& dir, const std::vector<std::string>& sans) {
  namespace fs = std::filesystem;
  absl::StatusOr<trainctl::auth::KeyAndCert> ca =
      trainctl::auth::NewCa("trainctl cluster CA", absl::Hours(24 * 3650));
  if (!ca.ok()) return InitStep("CA", ca.status());
  absl::StatusOr<std::string> key = trainctl::auth::NewPrivateKey();
  if (!key.ok()) return InitStep("key", key.status());
  absl::StatusOr<std::string> csr = trainctl::auth::NewCsr(*key, "trainctl-coordinator");
  if (!csr.ok()) return InitStep("CSR", csr.status());
  absl::StatusOr<std::string> cert =
      trainctl::auth::SignCsr(*ca, *csr, "trainctl-coordinator", sans, absl::Hours(24 * 825),
                              trainctl::auth::CertPurpose::kServer);
  if (!cert.ok()) return InitStep("--san", cert.status());
  for (auto [name, text] : {std::pair<const char*, const std::string*>{"ca.key", &ca->key_pem},
                            {"ca.crt", &ca->cert_pem},
                            {"coordinator.key", &*key},
                            {"coordinator.crt", &*cert}}) {
    if (absl::Status w = trainctl::auth::WritePrivateFile(dir + "/" + name, *text); !w.ok()) {
      return InitStep(name, w);
    }
  }
  std::error_code ec;
  for (const char* pub : {"ca.crt", "coordinator.crt"}) {
    fs::permissions(dir + "/" + pub,
                    fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                        fs::perms::others_read,
                    ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat(dir, "/", pub, ": cannot make it readable (0644): ", ec.message()));
  }
  return absl::OkStatus();
}

// A worker token, stored in the coordinator's database (so init runs with
// the coordinator's --db, before its first start), and --join-tokens
// one-time join tokens, for deployments that start their workers right away
// (compose): each worker trades its own for a certificate.
absl::Status WriteClusterTokens(const ClusterInitOptions& o, const std::string& dir) {
  using trainctl::auth::WritePrivateFile;
  if (!o.store_spec_error.empty())
    return InitStep("--store", absl::InvalidArgumentError(o.store_spec_error));
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::OpenSpec(o.store_spec);
  if (!store.ok()) return InitStep("--store", store.status());
  TokenAuthority tokens(store->get(), trainctl::SystemClock::Get());
  if (absl::Status s = tokens.Load(); !s.ok()) return InitStep("--store", s);
  trainctl::v1::CreateTokenRequest req;
  req.set_role(trainctl::v1::ROLE_WORKER);
  req.set_name("workers");
  absl::StatusOr<trainctl::v1::CreateTokenResponse> worker =
      tokens.Create(req, {"init", "init", trainctl::v1::ROLE_ADMIN});
  if (!worker.ok()) return InitStep("worker token", worker.status());
  if (absl::Status w = WritePrivateFile(dir + "/worker.token", worker->secret() + "\n"); !w.ok()) {
    return InitStep("worker.token", w);
  }
  const std::vector<std::string>& join_addresses = o.join_addresses;
  int joins = o.join_tokens;
  if (joins < 0 || joins > 1000)
    return InitStep("--join-tokens", absl::InvalidArgumentError("must be 0..1000"));
  if (!join_addresses.empty()) {
    if (joins != 0 && joins != static_cast<int>(join_addresses.size())) {
      return InitStep("--join-addresses",
                      absl::InvalidArgumentError(
                          absl::StrCat("names ", join_addresses.size(), " addresses for ", joins,
                                       " --join-tokens (one address per join token)")));
    }
    joins = static_cast<int>(join_addresses.size());
  }
  if (o.join_ttl_h < 1) return InitStep("--join-ttl-h", absl::InvalidArgumentError("must be >= 1"));
  for (int i = 1; i <= joins; ++i) {
    trainctl::v1::CreateTokenRequest jreq;
    jreq.set_role(trainctl::v1::ROLE_JOIN);
    jreq.set_name(absl::StrCat("join-", i));
    jreq.mutable_ttl()->set_seconds(int64_t{3600} * o.join_ttl_h);
    // The one name the joined worker's certificate carries, and the one
    // host its rendezvous reports may name besides the IP it connects from.
    if (!join_addresses.empty()) jreq.add_addresses(join_addresses[static_cast<size_t>(i - 1)]);
    absl::StatusOr<trainctl::v1::CreateTokenResponse> join =
        tokens.Create(jreq, {"init", "init", trainctl::v1::ROLE_ADMIN});
    if (!join.ok()) return InitStep("join token", join.status());
    const std::string name = absl::StrCat("join-", i, ".token");
    if (absl::Status w = WritePrivateFile(dir + "/" + name, join->secret() + "\n"); !w.ok())
      return InitStep(name, w);
  }
  return absl::OkStatus();
}

// How many join tokens init writes: --join-tokens, or one per --join-addresses.
int JoinTokenCount(const ClusterInitOptions& o) {
  return std::max(o.join_tokens, static_cast<int>(o.join_addresses.size()));
}

void PrintInitSummary(const ClusterInitOptions& o, const std::string& dir,
                      const std::vector<std::string>& sans, const std::string& address) {
  std::cout << "trainctl-coordinator init: wrote to " << dir << ":\n"
            << "  ca.crt, ca.key            the cluster CA (keep ca.key private; copy ca.crt to "
               "every host)\n"
            << "  coordinator.crt/.key      the coordinator's certificate (SANs: "
            << absl::StrJoin(sans, ", ") << ")\n"
            << "  admin.token               the bootstrap admin token\n"
            << "  worker.token              a worker token (stored in "
            << StateStore::DescribeSpec(o.store_spec) << ")\n"
            << (JoinTokenCount(o) > 0 ? absl::StrCat("  join-1.token ... join-", JoinTokenCount(o),
                                                     ".token   one-time join tokens (expire in ",
                                                     o.join_ttl_h, " h)\n")
                                      : std::string())
            << "  trainctl.yaml             a CLI config (coordinator " << address
            << ", admin token, CA)\n"
            << "Start: trainctl-coordinator --tls-dir " << dir
            << o.store_flag_text
            // The address init wrote into trainctl.yaml and the worker line:
            // without it the coordinator would listen on its default.
            << (o.listen.empty() ? std::string() : absl::StrCat(" --listen ", o.listen)) << "\n"
            << "Workers: trainctl token create --role join   (one-time), then on the worker host:\n"
            << "  trainctl-worker --coordinator " << address
            << " --ca ca.crt --join-token-file join.token\n"
            << "  (or, without joining: --token-file worker.token)\n";
}

}  // namespace

// trainctl-coordinator init --dir DIR [--san a,b] [--db PATH]: the cluster CA,
// the coordinator's certificate, the admin token, a worker token (stored in
// --db) and a CLI config, in DIR. Refuses to overwrite an existing CA.
int RunClusterInit(const ClusterInitOptions& o) {
  namespace fs = std::filesystem;
  const std::string& dir_flag = o.dir;
  if (dir_flag.empty()) {
    std::cerr << "trainctl-coordinator init: --dir: required\n";
    return 2;
  }
  std::error_code ec;
  fs::create_directories(dir_flag, ec);
  const std::string dir = ec ? dir_flag : fs::absolute(dir_flag, ec).string();
  if (!ec) fs::permissions(dir, fs::perms::owner_all, ec);
  if (ec) {
    std::cerr << "trainctl-coordinator init: --dir " << dir_flag
              << ": cannot create it owner-only (0700): " << ec.message() << "\n";
    return 1;
  }
  if (fs::exists(dir + "/ca.key")) {
    std::cerr << "trainctl-coordinator init: " << dir
              << "/ca.key exists: refusing to replace the cluster CA "
              << "(every certificate it signed would stop working); use another --dir\n";
    return 1;
  }
  const std::vector<std::string> sans = CoordinatorSans(o);
  bool created = false;
  absl::StatusOr<std::string> admin;
  absl::Status s = WriteTlsFiles(dir, sans);
  if (s.ok()) {
    admin = trainctl::auth::ReadOrCreateTokenFile(dir + "/admin.token", &created);
    s = admin.ok() ? WriteClusterTokens(o, dir) : InitStep("admin.token", admin.status());
  }
  // The port the coordinator will listen on: --listen's, when given with init.
  std::string port = "7070";
  if (const std::string& listen = o.listen; !listen.empty()) {
    const std::string given = listen.substr(listen.rfind(':') + 1);
    int n = 0;
    if (absl::SimpleAtoi(given, &n) && n > 0 && n < 65536) port = given;
  }
  const std::string address = absl::StrCat(InitAddressHost(o), ":", port);
  if (s.ok()) {
    const std::string config = absl::StrCat(
        "# trainctl CLI config written by `trainctl-coordinator init`: copy to\n",
        "# ~/.config/trainctl/config.yaml (admin token: keep it private).\n", "coordinator: \"",
        address, "\"\ntoken: \"", *admin, "\"\nca: \"", dir, "/ca.crt\"\n");
    if (absl::Status w = trainctl::auth::WritePrivateFile(dir + "/trainctl.yaml", config);
        !w.ok()) {
      s = InitStep("trainctl.yaml", w);
    }
  }
  if (!s.ok()) {
    std::cerr << "trainctl-coordinator init: " << s.message() << "\n";
    return 1;
  }
  PrintInitSummary(o, dir, sans, address);
  return 0;
}

// trainctl-coordinator worker-cert --dir TLSDIR --worker_id ID [--san ...]
// [--out DIR]: a key and a certificate for worker ID signed by the cluster CA
// in TLSDIR. With them (--cert/--key) the worker is ID, with no token.
int RunWorkerCert(const WorkerCertOptions& o) {
  const std::string& dir = o.dir;
  const std::string& id = o.worker_id;
  const std::string out = o.out.empty() ? dir : o.out;
  if (dir.empty() || id.empty()) {
    std::cerr << "trainctl-coordinator worker-cert: --dir (the init directory) and --worker-id are "
                 "required\n";
    return 2;
  }
  absl::StatusOr<std::string> ca_key = trainctl::auth::ReadFile(dir + "/ca.key");
  absl::StatusOr<std::string> ca_cert = trainctl::auth::ReadFile(dir + "/ca.crt");
  if (!ca_key.ok() || !ca_cert.ok()) {
    std::cerr << "trainctl-coordinator worker-cert: --dir: " << dir
              << " has no ca.key/ca.crt (run init)\n";
    return 2;
  }
  absl::StatusOr<std::string> key = trainctl::auth::NewPrivateKey();
  // Client authentication only, as a joined worker's: the admin's --san
  // names are where ranks may reach the worker, not a server to trust.
  std::vector<std::string> sans = o.sans;
  sans.push_back(trainctl::auth::WorkerUri(id));
  absl::StatusOr<std::string> cert =
      key.ok() ? trainctl::auth::SignCsr({*ca_key, *ca_cert}, *trainctl::auth::NewCsr(*key, id), id,
                                         sans, absl::Hours(24 * 825),
                                         trainctl::auth::CertPurpose::kClient)
               : key.status();
  if (!cert.ok()) {
    std::cerr << "trainctl-coordinator worker-cert: " << cert.status().message() << "\n";
    return 1;
  }
  for (auto [name, text] :
       {std::pair<std::string, const std::string*>{out + "/" + id + ".key", &*key},
        {out + "/" + id + ".crt", &*cert}}) {
    if (absl::Status w = trainctl::auth::WritePrivateFile(name, *text); !w.ok()) {
      std::cerr << "trainctl-coordinator worker-cert: " << w.message() << "\n";
      return 1;
    }
  }
  std::cout << "wrote " << out << "/" << id << ".crt and .key: trainctl-worker --ca ca.crt --cert "
            << id << ".crt --key " << id << ".key\n";
  return 0;
}

}  // namespace trainctl::coordinator

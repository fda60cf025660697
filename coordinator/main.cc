// trainctl-coordinator: the control plane. See docs/operator.md.
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/auth/pki.h"
#include "common/auth/secret.h"
#include "common/daemon_flags.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/stop_signals.h"
#include "coordinator/ha/await_leadership.h"
#include "coordinator/server/cluster_init.h"
#include "coordinator/server/coordinator_server.h"

ABSL_FLAG(std::string, listen, "",
          "host:port to serve gRPC on; port 0 picks a free port (printed at start). Default: "
          "0.0.0.0:7070 with TLS, 127.0.0.1:7070 without");
ABSL_FLAG(std::string, db, "trainctl.db",
          "SQLite database holding every job, event and worker (short for --store sqlite:PATH)");
ABSL_FLAG(
    std::string, store, "",
    "where the state lives: sqlite:PATH (as --db PATH) or a PostgreSQL connection URI "
    "postgresql://USER@HOST:PORT/DB?sslmode=verify-full (libpq: the password from ~/.pgpass or "
    "PGPASSFILE, not the URI); default: --db");
ABSL_FLAG(
    std::string, store_password_file, "",
    "PostgreSQL store: a file whose first line is the password (keep it 0600); handed to libpq "
    "in this process's environment (PGPASSWORD, readable by its user and root only), never on a "
    "command line. Or libpq's own ~/.pgpass / PGPASSFILE");
ABSL_FLAG(
    std::string, advertise_address, "",
    "HOST:PORT clients reach this coordinator at, recorded in a PostgreSQL store when it becomes "
    "active (standbys name it); default: --listen with a wildcard host replaced by this host's "
    "name");
ABSL_FLAG(
    double, leader_lease_s, 5,
    "PostgreSQL store: an active coordinator silent this long (stopped, hung, cut off) loses its "
    "session and the store's lock, and a standby takes over; > 0");
ABSL_FLAG(int, standby_poll_ms, 500,
          "PostgreSQL store: how often a standby coordinator tries to take the store's lock");
ABSL_FLAG(int, heartbeat_interval_ms, 1000, "how often workers heartbeat");
ABSL_FLAG(int, lease_timeout_ms, 3000, "a worker silent this long is LOST and its ranks fail");
ABSL_FLAG(int, max_heartbeats_per_sec, 10000,
          "the most heartbeats a second the whole fleet sends: a fleet larger than this times "
          "--heartbeat-interval-ms is told a longer interval, with leases longer in proportion "
          "(0: no bound)");
ABSL_FLAG(int64_t, gone_worker_ttl_s, 86400,
          "a LOST or LEFT worker with no ranks is forgotten this long after its last heartbeat");
ABSL_FLAG(int, disconnect_grace_ms, 1000,
          "a worker whose session broke without a goodbye is LOST after this long "
          "(or at its lease, if sooner) unless it reconnects");
ABSL_FLAG(int, recovery_grace_s, 15,
          "after a restart, known workers get this long to reconnect before they are LOST");
ABSL_FLAG(int, progress_timeout_s, 300,
          "a running attempt with no step progress this long is failed as hung (per job: "
          "restart.progress_timeout_s)");
ABSL_FLAG(int, rendezvous_timeout_s, 120, "an attempt whose ranks are not all ready by then fails");
ABSL_FLAG(
    double, restart_backoff_s, 1,
    "a job restarted after a failure waits this long before its next attempt, doubling with each "
    "restart up to 30 s; 0 = at once");
ABSL_FLAG(
    bool, preflight, true,
    "workers check data files, checkpoint dir and command before any rank of an attempt starts");
ABSL_FLAG(int, stop_grace_s, 10, "SIGTERM-to-SIGKILL grace for stopped ranks");
ABSL_FLAG(int, preemption_grace_s, 60,
          "SIGTERM-to-SIGKILL grace for the ranks of a job preempted to reclaim its queue's quota "
          "(docs/queues.md)");
ABSL_FLAG(double, fair_share_half_life_s, 3600,
          "half-life of the usage that orders queues for fair share (docs/queues.md); > 0");
ABSL_FLAG(int64_t, max_active_jobs, 100000, "most unfinished jobs held; more are refused");
ABSL_FLAG(int64_t, metric_points_per_job, 100000,
          "metric points kept per job (older ones downsampled to min/max/last per bucket)");
ABSL_FLAG(int64_t, log_lines_per_rank, 10000,
          "log lines kept per rank and attempt (oldest dropped)");
ABSL_FLAG(int, max_message_mb, 16, "largest gRPC message accepted or sent");
ABSL_FLAG(int64_t, max_code_bytes, int64_t{64} << 20,
          "largest code archive a client may upload with a job (JobService.UploadCode), in bytes; "
          "at most 1 GiB");
ABSL_FLAG(int, db_check_timeout_s, 30,
          "at start, an existing --db is checked (PRAGMA quick_check) for at most this long before "
          "anything is written; a damaged one is refused and left as it was; 0: no check");
ABSL_FLAG(std::string, log_level, "info",
          "service log lines below this level are dropped: debug, info, warn, error");
ABSL_FLAG(
    std::string, http_listen, "",
    "HOST:PORT of an HTTP endpoint serving /metrics in Prometheus' text format and the web "
    "dashboard at / (port 0: a free one); HTTPS with the coordinator's certificate when TLS is "
    "set, else plain HTTP on a loopback address only (or with --insecure); empty (default): off");
ABSL_FLAG(bool, metrics_open, false,
          "serve /metrics without a token (default: it needs a viewer token or better, sent as "
          "`Authorization: Bearer`; Prometheus: authorization: {credentials_file: FILE})");

ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the bootstrap admin token (created with mode 0600 when absent); "
          "default: admin.token in --tls-dir, else beside --db");
ABSL_FLAG(std::string, tls_dir, "",
          "serve TLS with DIR/coordinator.crt and DIR/coordinator.key, client certificates "
          "checked against DIR/ca.crt (the files `trainctl-coordinator init` writes)");
ABSL_FLAG(std::string, tls_cert, "", "the coordinator's certificate (PEM); overrides --tls-dir's");
ABSL_FLAG(std::string, tls_key, "", "the coordinator's private key (PEM); overrides --tls-dir's");
ABSL_FLAG(std::string, tls_ca, "", "the cluster CA certificate (PEM); overrides --tls-dir's");
ABSL_FLAG(std::string, tls_ca_key, "",
          "the cluster CA's private key (PEM): sign joining workers' certificates (trainctl-worker "
          "--join-token); default: --tls-dir's ca.key when present; without it Join is refused");
ABSL_FLAG(double, worker_cert_days, 365,
          "how long a joined worker's certificate is valid, in days (fractions allowed); the "
          "worker renews "
          "it when a third is left");
ABSL_FLAG(
    bool, insecure, false,
    "allow plaintext on a non-loopback --listen or --http-listen (tokens then cross the network "
    "in clear)");
ABSL_FLAG(std::string, dir, "", "init: the directory to write the CA, certificates and tokens to");
ABSL_FLAG(std::vector<std::string>, san, {},
          "init, worker-cert: extra names or IP addresses for the certificate (comma-separated)");
ABSL_FLAG(int, join_tokens, 0,
          "init: also write N one-time join tokens, join-1.token ... join-N.token (role join, "
          "expiring after --join-ttl-h), one per worker to join");
ABSL_FLAG(int, join_ttl_h, 24, "init: hours until the --join-tokens expire");
ABSL_FLAG(
    std::vector<std::string>, join_addresses, {},
    "init: the address (host name or IP) each join token authorises, in order: join-I.token's "
    "worker gets a certificate naming the I-th (comma-separated; implies --join-tokens N)");
ABSL_FLAG(std::string, worker_id, "", "worker-cert: the worker id the certificate names (its CN)");
ABSL_FLAG(std::string, out, "", "worker-cert: where to write ID.crt and ID.key (default: --dir)");

namespace {

// Whether a PostgreSQL connection string carries a password: in a URI's
// user info (postgresql://USER:PASSWORD@HOST) or a password= parameter.
bool StoreSpecHasPassword(const std::string& spec) {
  for (const char* scheme : {"postgresql://", "postgres://"}) {
    if (!absl::StartsWith(spec, scheme)) continue;
    const std::string rest = spec.substr(std::strlen(scheme));
    const std::string authority = rest.substr(0, rest.find_first_of("/?"));
    const size_t at = authority.rfind('@');
    if (at != std::string::npos && authority.substr(0, at).find(':') != std::string::npos)
      return true;
    const size_t query = rest.find('?');
    return query != std::string::npos && (absl::StrContains(rest.substr(query), "?password=") ||
                                          absl::StrContains(rest.substr(query), "&password="));
  }
  // key=value form.
  for (size_t pos = spec.find("password"); pos != std::string::npos;
       pos = spec.find("password", pos + 1)) {
    const bool starts = pos == 0 || spec[pos - 1] == ' ' || spec[pos - 1] == '\t';
    size_t eq = pos + 8;
    while (eq < spec.size() && spec[eq] == ' ') ++eq;
    if (starts && eq < spec.size() && spec[eq] == '=') return true;
  }
  return false;
}

// --store-password-file: the password into this process's environment,
// where libpq reads it (PGPASSWORD); a password in --store itself is
// readable by every local user in /proc/PID/cmdline: warned. Before any
// thread starts.
absl::Status ApplyStorePassword() {
  const std::string store = absl::GetFlag(FLAGS_store);
  const bool postgres = absl::StartsWith(store, "postgres");
  if (StoreSpecHasPassword(store)) {
    std::cerr << "trainctl-coordinator: warning: --store holds a password, which every local user "
                 "can read "
                 "in /proc/PID/cmdline; give it with --store-password-file or libpq's ~/.pgpass / "
                 "PGPASSFILE\n";
  }
  const std::string file = absl::GetFlag(FLAGS_store_password_file);
  if (file.empty()) return absl::OkStatus();
  if (!postgres)
    return absl::InvalidArgumentError("--store-password-file: only with a PostgreSQL --store");
  absl::StatusOr<std::string> content = trainctl::auth::ReadFile(file);
  if (!content.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--store-password-file: ", content.status().message()));
  }
  const std::string password = content->substr(0, content->find_first_of("\r\n"));
  if (password.empty())
    return absl::InvalidArgumentError(absl::StrCat("--store-password-file: ", file, ": empty"));
  if (::setenv("PGPASSWORD", password.c_str(), 1) != 0) {
    return absl::InternalError(
        absl::StrCat("--store-password-file: setenv: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The store the flags name: --store, else --db as sqlite:PATH. Both given is
// an error (which one was meant?).
absl::StatusOr<std::string> StoreSpecFromFlags() {
  const std::string store = absl::GetFlag(FLAGS_store);
  if (store.empty()) return absl::StrCat("sqlite:", absl::GetFlag(FLAGS_db));
  if (absl::GetFlag(FLAGS_db) != "trainctl.db") {
    return absl::InvalidArgumentError(
        "--store and --db: give one (--db PATH is --store sqlite:PATH)");
  }
  return store;
}

// init: the flags as cluster_init's options.
int RunInit() {
  trainctl::coordinator::ClusterInitOptions o;
  o.dir = absl::GetFlag(FLAGS_dir);
  o.sans = absl::GetFlag(FLAGS_san);
  o.join_tokens = absl::GetFlag(FLAGS_join_tokens);
  o.join_ttl_h = absl::GetFlag(FLAGS_join_ttl_h);
  o.join_addresses = absl::GetFlag(FLAGS_join_addresses);
  o.listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<std::string> spec = StoreSpecFromFlags();
  if (spec.ok()) {
    o.store_spec = *spec;
  } else {
    o.store_spec_error = std::string(spec.status().message());
  }
  o.store_flag_text = absl::GetFlag(FLAGS_store).empty()
                          ? absl::StrCat(" --db ", absl::GetFlag(FLAGS_db))
                          : std::string(" --store (the same as here)");
  return trainctl::coordinator::RunClusterInit(o);
}

// The TLS files named by --tls-dir / --tls-cert / --tls-key / --tls-ca and
// --tls-ca-key, read into `o`; the error names the flag.
absl::Status TlsFromFlags(const std::string& tls_dir,
                          trainctl::coordinator::CoordinatorOptions& o) {
  auto tls_file = [&](const std::string& flag, const char* name) {
    return !flag.empty() ? flag : tls_dir.empty() ? std::string() : tls_dir + "/" + name;
  };
  const std::string cert = tls_file(absl::GetFlag(FLAGS_tls_cert), "coordinator.crt");
  const std::string key = tls_file(absl::GetFlag(FLAGS_tls_key), "coordinator.key");
  const std::string ca = tls_file(absl::GetFlag(FLAGS_tls_ca), "ca.crt");
  if (!cert.empty() || !key.empty()) {
    for (auto [path, dest, flag] : {std::tuple{cert, &o.tls_cert_pem, "--tls-cert"},
                                    std::tuple{key, &o.tls_key_pem, "--tls-key"},
                                    std::tuple{ca, &o.tls_ca_pem, "--tls-ca"}}) {
      absl::StatusOr<std::string> pem =
          path.empty() ? absl::InvalidArgumentError("not set") : trainctl::auth::ReadFile(path);
      if (!pem.ok())
        return absl::InvalidArgumentError(absl::StrCat(flag, ": ", pem.status().message()));
      *dest = *pem;
    }
  }
  std::string ca_key = absl::GetFlag(FLAGS_tls_ca_key);
  if (ca_key.empty() && !tls_dir.empty() && std::filesystem::exists(tls_dir + "/ca.key")) {
    ca_key = tls_dir + "/ca.key";
  }
  if (ca_key.empty()) return absl::OkStatus();
  if (o.tls_cert_pem.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca-key: needs TLS (--tls-dir or --tls-cert/--tls-key/--tls-ca)");
  }
  absl::StatusOr<std::string> pem = trainctl::auth::ReadFile(ca_key);
  if (!pem.ok())
    return absl::InvalidArgumentError(absl::StrCat("--tls-ca-key: ", pem.status().message()));
  o.tls_ca_key_pem = *pem;
  return absl::OkStatus();
}

// Every other serving flag, into `o`; the error names the flag.
absl::Status OptionsFromFlags(trainctl::coordinator::CoordinatorOptions& o) {
  o.worker_cert_validity = absl::Hours(24 * absl::GetFlag(FLAGS_worker_cert_days));
  if (!(o.worker_cert_validity >= absl::Seconds(30))) {
    return absl::InvalidArgumentError("--worker-cert-days: must be at least 30 s (0.00035)");
  }
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.listen = absl::GetFlag(FLAGS_listen);
  if (o.listen.empty()) o.listen = o.tls_cert_pem.empty() ? "127.0.0.1:7070" : "0.0.0.0:7070";
  o.db_path = absl::GetFlag(FLAGS_db);
  TRAINCTL_ASSIGN_OR_RETURN(o.store_spec, StoreSpecFromFlags());
  // admin.token's default place is beside an SQLite database.
  if (absl::StartsWith(o.store_spec, "sqlite:")) o.db_path = o.store_spec.substr(7);
  o.registry.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  o.registry.lease_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  o.registry.max_heartbeats_per_sec = absl::GetFlag(FLAGS_max_heartbeats_per_sec);
  o.registry.disconnect_grace = absl::Milliseconds(absl::GetFlag(FLAGS_disconnect_grace_ms));
  o.registry.gone_ttl = absl::Seconds(absl::GetFlag(FLAGS_gone_worker_ttl_s));
  if (o.registry.gone_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--gone-worker-ttl-s must be > 0");
  }
  o.registry.recovery_grace = absl::Seconds(absl::GetFlag(FLAGS_recovery_grace_s));
  o.jobs.progress_timeout = absl::Seconds(absl::GetFlag(FLAGS_progress_timeout_s));
  o.jobs.rendezvous_timeout = absl::Seconds(absl::GetFlag(FLAGS_rendezvous_timeout_s));
  const double backoff_s = absl::GetFlag(FLAGS_restart_backoff_s);
  if (!(backoff_s >= 0 && backoff_s <= 30))
    return absl::InvalidArgumentError("--restart-backoff-s must be in [0, 30]");
  o.jobs.restart_backoff = absl::Seconds(backoff_s);
  o.jobs.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_stop_grace_s));
  o.jobs.placer.preemption_grace = absl::Seconds(absl::GetFlag(FLAGS_preemption_grace_s));
  const double half_life_s = absl::GetFlag(FLAGS_fair_share_half_life_s);
  if (!(half_life_s > 0 && half_life_s <= 1e9)) {
    return absl::InvalidArgumentError("--fair-share-half-life-s must be > 0 (seconds)");
  }
  o.jobs.placer.fair_share_half_life = absl::Seconds(half_life_s);
  if (absl::GetFlag(FLAGS_preemption_grace_s) < 0)
    return absl::InvalidArgumentError("--preemption-grace-s must be >= 0");
  o.jobs.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  o.jobs.preflight = absl::GetFlag(FLAGS_preflight);
  o.jobs.refuse_unschedulable = true;
  // A survivor's collective error waits this long for a dead peer's broken
  // stream, so the failure names the lost worker rather than the survivor.
  o.jobs.lost_worker_wait = o.registry.disconnect_grace;
  o.store.max_metric_points_per_job = absl::GetFlag(FLAGS_metric_points_per_job);
  o.store.max_log_lines_per_rank = absl::GetFlag(FLAGS_log_lines_per_rank);
  if (absl::GetFlag(FLAGS_db_check_timeout_s) < 0) {
    return absl::InvalidArgumentError("--db-check-timeout-s: must be >= 0 (0: no check)");
  }
  o.store.integrity_check_timeout = absl::Seconds(absl::GetFlag(FLAGS_db_check_timeout_s));
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  o.max_code_bytes = absl::GetFlag(FLAGS_max_code_bytes);
  if (o.max_code_bytes <= 0 || o.max_code_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "--max-code-bytes: must be > 0 and at most 1073741824 (1 GiB)");
  }
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  o.metrics_open = absl::GetFlag(FLAGS_metrics_open);
  const double lease_s = absl::GetFlag(FLAGS_leader_lease_s);
  if (!(lease_s > 0 && lease_s <= 3600)) {
    return absl::InvalidArgumentError("--leader-lease-s: must be > 0 and at most 3600 (seconds)");
  }
  o.store.leader_lease = absl::Seconds(lease_s);
  const int poll_ms = absl::GetFlag(FLAGS_standby_poll_ms);
  if (poll_ms < 10 || poll_ms > 60000) {
    return absl::InvalidArgumentError("--standby-poll-ms: must be in [10, 60000]");
  }
  const std::string advertise = absl::GetFlag(FLAGS_advertise_address);
  if (!advertise.empty()) {
    const size_t colon = advertise.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(advertise.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise-address: '", advertise,
                                                     "' is not HOST:PORT with a port in 1..65535"));
    }
  }
  return absl::OkStatus();
}

// The command line this process started with, for ReExec.
std::vector<std::string>& OriginalArgs() {
  static std::vector<std::string> args;
  return args;
}

// A deposed coordinator (its PostgreSQL store found another one active)
// replaces itself with a fresh run of the same command line: whatever it
// held in memory is gone before it could act on it, it keeps its pid (a
// supervisor sees no exit), and it comes back through the normal start as
// a standby. Called on the thread that found the deposition, inside the
// failing store call, so nothing after that write runs. Every descriptor
// above stderr is closed first (the HTTP listener need not be close-on-exec).
[[noreturn]] void ReExec(const absl::Status& why) {
  trainctl::LogEvent(trainctl::LogLevel::kError, "coordinator", "deposed",
                     {{"error", std::string(why.message())},
                      {"then", "re-executing as a standby; nothing more is written or acted on"}});
  std::cout.flush();
  std::cerr.flush();
  std::vector<char*> argv;
  for (std::string& a : OriginalArgs()) argv.push_back(a.data());
  argv.push_back(nullptr);
  syscall(SYS_close_range, 3u, ~0u, 0u);
  execv("/proc/self/exe", argv.data());
  const std::string line =
      absl::StrCat("trainctl-coordinator: deposed, and cannot re-execute itself (",
                   std::strerror(errno), "): exiting\n");
  (void)!write(2, line.data(), line.size());
  _exit(75);
}

// --admin-token-file, else the --tls-dir's admin.token, else admin.token
// beside the database.
std::string AdminTokenFile(const std::string& tls_dir, const std::string& db_path) {
  std::string admin_file = absl::GetFlag(FLAGS_admin_token_file);
  if (admin_file.empty() && !tls_dir.empty()) admin_file = tls_dir + "/admin.token";
  if (admin_file.empty()) {
    std::filesystem::path db(db_path);
    admin_file = (db.has_parent_path() ? db.parent_path() / "admin.token"
                                       : std::filesystem::path("admin.token"))
                     .string();
  }
  return admin_file;
}

absl::Status CheckRegistryTimes(const trainctl::coordinator::RegistryOptions& r) {
  if (r.heartbeat_interval <= absl::ZeroDuration() || r.lease_timeout <= r.heartbeat_interval) {
    return absl::InvalidArgumentError(
        "--lease-timeout-ms must be greater than --heartbeat-interval-ms > 0");
  }
  if (r.disconnect_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--disconnect-grace-ms must be >= 0");
  }
  if (r.max_heartbeats_per_sec < 0) {
    return absl::InvalidArgumentError("--max-heartbeats-per-sec must be >= 0 (0: no bound)");
  }
  return absl::OkStatus();
}

// What a started coordinator tells its operator (stdout, and the log).
void Announce(const trainctl::coordinator::CoordinatorServer& server,
              const trainctl::coordinator::CoordinatorOptions& o, const std::string& addr,
              const std::string& admin_file, bool created) {
  std::cout << "trainctl-coordinator listening on " << addr << std::endl;
  const std::string http = server.http_address().empty()
                               ? ""
                               : absl::StrCat(server.http_scheme(), "://", server.http_address());
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "listening",
                     {{"address", addr},
                      {"db", trainctl::coordinator::StateStore::DescribeSpec(o.store_spec)},
                      {"metrics", http.empty() ? "off" : http + "/metrics"}});
  if (!http.empty()) {
    std::cout << "trainctl-coordinator: metrics on " << http << "/metrics"
              << (o.metrics_open ? " (open: no token needed)" : " (needs a viewer token)")
              << std::endl;
    std::cout << "trainctl-coordinator: dashboard on " << http << "/" << std::endl;
  }
  if (!http.empty() && std::string(server.http_scheme()) == "http" &&
      !trainctl::coordinator::IsLoopbackListen(o.http_listen)) {
    std::cerr << "trainctl-coordinator: WARNING: --insecure: the dashboard on " << http
              << " takes tokens in clear text (docs/security.md)" << std::endl;
  }
  if (o.tls_cert_pem.empty() && !trainctl::coordinator::IsLoopbackListen(o.listen)) {
    std::cerr << "trainctl-coordinator: WARNING: --insecure: serving plaintext on " << addr
              << ": tokens and job data cross the network unencrypted (docs/security.md)"
              << std::endl;
  }
  std::cout << "trainctl-coordinator: admin token " << (created ? "created in " : "read from ")
            << admin_file << std::endl;
}

// Options from the flags, or a usage error (exit 2) naming the flag.
absl::Status ServeOptions(trainctl::coordinator::CoordinatorOptions& o, std::string* admin_file,
                          bool* created) {
  const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir);
  TRAINCTL_RETURN_IF_ERROR(TlsFromFlags(tls_dir, o));
  TRAINCTL_RETURN_IF_ERROR(OptionsFromFlags(o));
  // Beside an SQLite file is a place of the coordinator's own; a
  // PostgreSQL store has none (it would be the working directory), and every
  // coordinator of the store must hold the same admin token.
  if (!absl::StartsWith(o.store_spec, "sqlite:") && absl::GetFlag(FLAGS_admin_token_file).empty() &&
      tls_dir.empty()) {
    return absl::InvalidArgumentError(
        "--admin-token-file: needed with a PostgreSQL --store (or --tls-dir, whose admin.token is "
        "used): the "
        "bootstrap admin token has no place beside the database, and every coordinator of one "
        "store must "
        "read the same file");
  }
  *admin_file = AdminTokenFile(tls_dir, o.db_path);
  // An absent file is written only once the store is open (before_serving):
  // a refused start (a damaged or foreign --db) leaves nothing behind.
  std::error_code ec;
  *created = !std::filesystem::exists(*admin_file, ec);
  absl::StatusOr<std::string> admin =
      *created ? trainctl::auth::NewSecret("admin") : trainctl::auth::ReadTokenFile(*admin_file);
  if (!admin.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admin-token-file: ", admin.status().message()));
  }
  o.admin_token = *admin;
  return CheckRegistryTimes(o.registry);
}

}  // namespace

int main(int argc, char** argv) {
  OriginalArgs().assign(argv, argv + argc);
  std::vector<char*> args = trainctl::ParseDaemonFlags(
      argc, argv,
      "trainctl-coordinator [--tls-dir DIR] --listen HOST:PORT --db PATH\n"
      "trainctl-coordinator init --dir DIR [--san NAME,...] --db PATH [--join-tokens N]   (CA, "
      "certificates, tokens)\n"
      "trainctl-coordinator worker-cert --dir DIR --worker-id ID [--san NAME,...] [--out DIR]\n"
      "The trainctl control plane: accepts jobs, gang-schedules ranks on worker daemons, runs "
      "the rendezvous, watches health, and stores everything in SQLite.",
      "coordinator/main.cc");
  // Private by default: the database and its -wal/-shm (every job, token
  // hash and log line), keys and tokens are this user's alone, whatever
  // umask the coordinator was started with. Public files (ca.crt) get
  // their mode explicitly.
  ::umask(077);
  if (absl::Status s = ApplyStorePassword(); !s.ok()) {
    std::cerr << "trainctl-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (args.size() > 1 && std::string(args[1]) == "init") return RunInit();
  if (args.size() > 1 && std::string(args[1]) == "worker-cert") {
    return trainctl::coordinator::RunWorkerCert(
        {absl::GetFlag(FLAGS_dir), absl::GetFlag(FLAGS_worker_id), absl::GetFlag(FLAGS_out),
         absl::GetFlag(FLAGS_san)});
  }
  if (args.size() > 1) {
    std::cerr << "trainctl-coordinator: unknown argument '" << args[1]
              << "' (commands: init, worker-cert)\n";
    return 2;
  }
  trainctl::BlockStopSignals();  // before any thread starts (see common/stop_signals.h)
  // Debian's abseil keeps deadlock detection on in release builds; it costs
  // every lock a graph update (about 6% of the coordinator's CPU at 10k workers).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  trainctl::LogLevel level;
  if (!trainctl::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    std::cerr << "trainctl-coordinator: --log-level: '" << absl::GetFlag(FLAGS_log_level)
              << "' is not one of debug, info, warn, error\n";
    return 2;
  }
  trainctl::SetLogLevel(level);

  trainctl::coordinator::CoordinatorOptions o;
  std::string admin_file;
  bool created = false;
  if (absl::Status s = ServeOptions(o, &admin_file, &created); !s.ok()) {
    std::cerr << "trainctl-coordinator: " << s.message() << "\n";
    return 2;
  }

  std::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<trainctl::coordinator::StateStore> leader_store;
  if (!absl::StartsWith(o.store_spec, "sqlite:")) {
    // PostgreSQL: active/standby (docs/operator.md, "High availability").
    o.store.on_deposed = ReExec;
    absl::StatusOr<std::unique_ptr<trainctl::coordinator::StateStore>> store =
        trainctl::coordinator::AwaitLeadership(
            o, absl::Milliseconds(absl::GetFlag(FLAGS_standby_poll_ms)),
            absl::GetFlag(FLAGS_advertise_address));
    if (!store.ok()) {
      if (store.status().code() == absl::StatusCode::kCancelled) {
        trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "shutting_down",
                           {{"reason", "stop signal (standby)"}});
        return 0;
      }
      std::cerr << "trainctl-coordinator: " << store.status().message() << "\n";
      return 1;
    }
    leader_store = std::move(store).value();
    // While this one waited, another coordinator may have created the
    // admin token file: use it rather than replace it with another secret.
    std::error_code ec;
    if (created && std::filesystem::exists(admin_file, ec)) {
      absl::StatusOr<std::string> admin = trainctl::auth::ReadTokenFile(admin_file);
      if (!admin.ok()) {
        std::cerr << "trainctl-coordinator: --admin-token-file: " << admin.status().message()
                  << "\n";
        return 2;
      }
      o.admin_token = *admin;
      created = false;
    }
  }
  if (created) {
    // Once the store opened (a refused start leaves no file behind), and
    // before the server answers: whoever sees it serving finds the file.
    o.before_serving = [&admin_file, token = o.admin_token]() -> absl::Status {
      absl::Status w = trainctl::auth::WritePrivateFile(admin_file, absl::StrCat(token, "\n"));
      if (w.ok()) return w;
      return absl::Status(w.code(), absl::StrCat("--admin-token-file: ", w.message()));
    };
  }
  trainctl::coordinator::CoordinatorServer server(o);
  if (leader_store != nullptr) server.AdoptStore(std::move(leader_store));
  absl::StatusOr<std::string> addr = server.Start();
  if (!addr.ok()) {
    std::cerr << "trainctl-coordinator: " << addr.status().message() << "\n";
    return 1;
  }
  Announce(server, o, *addr, admin_file, created);

  trainctl::WaitForStopSignal();
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "coordinator", "shutting_down",
                     {{"reason", "stop signal"}});
  server.Shutdown();
  return 0;
}

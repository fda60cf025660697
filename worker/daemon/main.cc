// trainctl-worker: the per-host daemon. See docs/operator.md.
//
// main reads the flags into DaemonOptions in named steps (the base options,
// the identity: certificate or join, the token and CA, what ranks run, what
// the host offers, the log level), then runs the daemon until SIGTERM or
// SIGINT. Single-threaded until WorkerDaemon::Start.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/auth/secret.h"
#include "common/coordinator_failover.h"
#include "common/daemon_flags.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "worker/daemon/join.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/route_address.h"
#include "worker/daemon/slot_inventory.h"
#include "worker/daemon/worker_daemon.h"

ABSL_FLAG(
    std::string, coordinator, "localhost:7070",
    "coordinator host:port, or a comma-separated list of them (active and standby coordinators): "
    "a standby's answer leads to the active one, an unreachable one to the next");
ABSL_FLAG(std::string, token_file, "",
          "file holding a worker-role token (trainctl token create --role worker); required");
ABSL_FLAG(std::string, join_token, "",
          "a one-time join token (trainctl token create --role join): on first start, trade it for "
          "this worker's certificate (kept in --work-dir, reused on restarts); needs --ca");
ABSL_FLAG(std::string, join_token_file, "",
          "a file holding the join token (instead of --join-token)");
ABSL_FLAG(std::string, ca, "",
          "cluster CA certificate (PEM): connect to the coordinator over TLS and verify it");
ABSL_FLAG(std::string, cert, "",
          "this worker's certificate (PEM, signed by the cluster CA, CN = its worker id): mutual "
          "TLS; the worker then registers as that id and needs no token");
ABSL_FLAG(std::string, key, "", "the private key of --cert (PEM)");
ABSL_FLAG(std::string, gpus, "",
          "GPUs to offer: all, none, or indices like 0,1 (default: every visible GPU; CPU slots "
          "when there is none)");
ABSL_FLAG(
    std::string, gpu_flavor, "",
    "the flavor (GPU model) this worker's GPU slots are labelled with, which jobs ask for with "
    "resources.gpu_flavor: lowercase letters, digits, '.', '_', '-' (default: each GPU's name "
    "normalized, \"NVIDIA H100 80GB HBM3\" -> h100); not with CPU slots");
ABSL_FLAG(int, slots, 0, "CPU slots to offer (default 1 on a host without GPUs); implies CPU");
ABSL_FLAG(std::string, work_dir, "./trainctl-worker",
          "keeps the stable worker id and each rank's files and checkpoints");
ABSL_FLAG(std::string, labels, "", "labels as key=value,key=value");
ABSL_FLAG(
    std::string, address, "",
    "address other hosts reach this one at: their ranks meet rank 0 there, and the coordinator "
    "accepts it "
    "only when it is (or resolves to) the address this worker connects from, or one its token or "
    "certificate names (default: this host's IP address on its route to the coordinator)");
ABSL_FLAG(std::string, rank_binary, "",
          "the rank process (default: trainctl-rank next to this binary, or in the build tree)");
ABSL_FLAG(int, rank_timeout_s, 120, "collective and rendezvous timeout handed to ranks");
ABSL_FLAG(int, stop_grace_s, 10, "SIGTERM-to-SIGKILL grace when the daemon stops");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "directories (comma separated) a job's data and model files must lie in, after resolving "
          "symlinks and '..' (default: anywhere the worker's user can read)");
ABSL_FLAG(std::vector<std::string>, checkpoint_root, {},
          "directories (comma separated) a job's checkpoint.dir must lie in (default: anywhere); a "
          "job without checkpoint.dir writes to <first root>/<owner>/<job id> (without roots: the "
          "work dir)");
ABSL_FLAG(bool, allow_commands, false,
          "run command jobs (the submitter's own program, as --rank-user); off by default "
          "because such a job runs arbitrary code on this host");
ABSL_FLAG(std::string, rank_user, "",
          "Unix user that rank processes (engine ranks, command jobs and all they start) run as, "
          "so they cannot read this daemon's key, token or other jobs' rank.conf; needs a daemon "
          "running as root (default: this daemon's user; the deploy/ units and images set "
          "trainctl-rank)");
ABSL_FLAG(
    std::string, rank_uids, "",
    "FIRST-LAST: run each job owner's ranks as a uid (and gid) of their own from this range, "
    "the same on every worker, so that jobs of different owners cannot read each other's "
    "files or signal each other's processes; ids no user or group of this host has; needs "
    "--rank-user, whose groups the ranks get besides (default: every rank runs as --rank-user)");
ABSL_FLAG(std::string, cgroup_root, "/sys/fs/cgroup",
          "where the cgroup filesystem is mounted: a job's `resources` limits are enforced with a "
          "cgroup per rank "
          "there (v2, or v1's memory, cpu and pids hierarchies); \"\" turns them off (such jobs "
          "then fail to "
          "launch here, saying why)");
ABSL_FLAG(std::string, python_dir, "",
          "directory holding the trainctl Python module, put on command ranks' PYTHONPATH "
          "(default: the source tree's python/ when run from a build tree, else none: the "
          "installed module is on Python's own path)");
ABSL_FLAG(std::string, log_level, "info",
          "service log lines below this level are dropped: debug, info, warn, error");
ABSL_FLAG(
    std::string, http_listen, "",
    "HOST:PORT of an HTTP endpoint serving /metrics in Prometheus' text format (port 0: a free "
    "one); empty (default): off");
ABSL_FLAG(std::string, umask, "0077",
          "file mode mask for everything the daemon and its ranks create (work dir, rank files, "
          "checkpoints, models): 0077 keeps them to this user; 0027 shares them with its group "
          "(docs/security.md)");
ABSL_FLAG(int, telemetry_buffer_mb, 64,
          "metrics, logs and rank reports held until the coordinator acknowledges them; when "
          "full, log lines are dropped first");

namespace {

using trainctl::worker::DaemonOptions;

// Every startup step's error is a value; main prints it and exits with
// ExitCode: 2 for a configuration that cannot work, 1 when the coordinator
// could not be reached for a join (Unavailable: a restart may succeed).
absl::Status Misconfigured(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(flag.empty() ? std::string(message)
                                                 : absl::StrCat(flag, ": ", message));
}

int ExitCode(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable ? 1 : 2; }

std::string DefaultRankBinary() {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "trainctl-rank";
  std::filesystem::path dir = std::filesystem::path(std::string(self, n)).parent_path();
  for (const auto& p : {dir / "trainctl-rank", dir / ".." / "trainer" / "trainctl-rank"}) {
    if (access(p.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(p).string();
  }
  return (dir / "trainctl-rank").string();
}

// Without --address: this host's IP on its route to the (first reachable)
// coordinator, which the coordinator can verify (route_address.h); the host
// name only when no coordinator resolves now.
std::string DefaultAddress(const std::vector<std::string>& coordinators,
                           const std::string& hostname) {
  std::string why;
  for (const std::string& c : coordinators) {
    absl::StatusOr<std::string> ip = trainctl::worker::RouteSourceAddress(c);
    // An IPv6 route only: the host name, as before (HOST:PORT with an IPv6
    // literal would be ambiguous where the address is joined with a port).
    if (ip.ok() && ip->find(':') != std::string::npos) {
      why = absl::StrCat("only an IPv6 route (", *ip, ")");
      continue;
    }
    if (ip.ok()) {
      trainctl::LogEvent(trainctl::LogLevel::kInfo, "worker", "address",
                         {{"address", *ip}, {"route_to", c}});
      return *ip;
    }
    why = std::string(ip.status().message());
  }
  trainctl::LogEvent(trainctl::LogLevel::kWarn, "worker", "address",
                     {{"address", hostname},
                      {"reason", absl::StrCat("no route to a coordinator (", why,
                                              "); advertising the host name: set --address")}});
  return hostname;
}

// Flags → the options that need no file and no network: the coordinator,
// the TLS files named, the work dir, this host's names.
absl::StatusOr<DaemonOptions> BaseOptions() {
  DaemonOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  absl::StatusOr<std::vector<std::string>> coordinators =
      trainctl::ParseCoordinatorList(o.coordinator, "--coordinator");
  if (!coordinators.ok()) return coordinators.status();
  o.cert_file = absl::GetFlag(FLAGS_cert);
  o.key_file = absl::GetFlag(FLAGS_key);
  o.ca_file = absl::GetFlag(FLAGS_ca);
  if (!o.cert_file.empty() && (o.key_file.empty() || o.ca_file.empty())) {
    return Misconfigured("--cert", "needs --key and --ca");
  }
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  o.hostname = host;
  o.address = absl::GetFlag(FLAGS_address);
  if (o.address.empty()) o.address = DefaultAddress(*coordinators, o.hostname);
  return o;
}

// Trades the join token (--join-token or --join-token-file) for this
// worker's certificate, kept in the work dir.
absl::StatusOr<trainctl::worker::WorkerIdentity> JoinNow(const DaemonOptions& o) {
  std::string join_token = absl::GetFlag(FLAGS_join_token);
  if (!absl::GetFlag(FLAGS_join_token_file).empty()) {
    absl::StatusOr<std::string> t =
        trainctl::auth::ReadTokenFile(absl::GetFlag(FLAGS_join_token_file));
    if (!t.ok()) return Misconfigured("--join-token-file", t.status().message());
    join_token = *t;
  }
  if (o.ca_file.empty()) {
    return Misconfigured("--join-token", "needs --ca (the cluster CA verifies the coordinator)");
  }
  trainctl::worker::JoinOptions j;
  j.coordinator = o.coordinator;
  j.ca_file = o.ca_file;
  j.join_token = join_token;
  j.work_dir = o.work_dir;
  j.addresses = {o.address};
  if (o.hostname != o.address) j.addresses.push_back(o.hostname);
  absl::StatusOr<trainctl::worker::WorkerIdentity> id = trainctl::worker::Join(j);
  // Unavailable stays Unavailable (exit 1: the coordinator may come back).
  if (!id.ok() && id.status().code() != absl::StatusCode::kUnavailable) {
    return Misconfigured("", id.status().message());
  }
  return id;
}

// Without --cert: a certificate from an earlier join (kept in the work dir)
// comes first; else a join token gets one now. The token (file) is read
// only then: a spent one may stay configured, or be deleted, after the join.
absl::Status ResolveIdentity(DaemonOptions& o) {
  if (!o.cert_file.empty()) return absl::OkStatus();
  absl::StatusOr<trainctl::worker::WorkerIdentity> id =
      trainctl::worker::JoinedIdentity(o.work_dir);
  if (!id.ok() && id.status().code() != absl::StatusCode::kNotFound) {
    return Misconfigured("", id.status().message());
  }
  const bool join_configured =
      !absl::GetFlag(FLAGS_join_token).empty() || !absl::GetFlag(FLAGS_join_token_file).empty();
  if (!id.ok() && join_configured) id = JoinNow(o);
  if (!id.ok())
    return id.status().code() == absl::StatusCode::kNotFound ? absl::OkStatus() : id.status();
  if (o.ca_file.empty())
    return Misconfigured("", absl::StrCat(id->cert_file, " (joined): needs --ca"));
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "worker", id->joined_now ? "joined" : "certificate",
                     {{"worker_id", id->worker_id}, {"cert", id->cert_file}});
  o.cert_file = id->cert_file;
  o.key_file = id->key_file;
  o.renew_certificate = true;
  // The daemon registers as its worker-id file says: the certificate's id.
  if (absl::Status w = trainctl::auth::WritePrivateFile(o.work_dir + "/worker-id", id->worker_id);
      !w.ok()) {
    return Misconfigured("", w.message());
  }
  return absl::OkStatus();
}

// A worker without a certificate authenticates with its token; a CA given
// must be readable (TLS to the coordinator).
absl::Status ResolveTokenAndCa(DaemonOptions& o) {
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (o.cert_file.empty()) {
    if (token_file.empty()) {
      return Misconfigured(
          "--token_file",
          "required (a worker-role token: trainctl token create --role worker), unless "
          "--cert or --join-token is given");
    }
    absl::StatusOr<std::string> token = trainctl::auth::ReadTokenFile(token_file);
    if (!token.ok()) return Misconfigured("--token_file", token.status().message());
    o.token = *token;
  }
  if (!o.ca_file.empty() && !trainctl::auth::ReadFile(o.ca_file).ok()) {
    return Misconfigured("--ca", absl::StrCat(o.ca_file, ": cannot read"));
  }
  return absl::OkStatus();
}

// --rank-user, looked up once (the rank launches then only make system
// calls): a user that does not exist, or one a non-root daemon cannot
// become, is a configuration error. The daemon's own user needs no switch.
absl::Status ResolveRankUser(DaemonOptions& o) {
  const std::string name = absl::GetFlag(FLAGS_rank_user);
  if (name.empty()) return absl::OkStatus();
  absl::StatusOr<trainctl::RunAs> user = trainctl::LookupUser(name);
  if (!user.ok()) return Misconfigured("--rank-user", user.status().message());
  if (user->uid == geteuid()) return absl::OkStatus();
  if (geteuid() != 0) {
    return Misconfigured(
        "--rank-user",
        absl::StrCat("this daemon runs as uid ", geteuid(),
                     ", not root: it cannot start "
                     "ranks as ",
                     name, " (uid ", user->uid, "); run it as root, or leave --rank-user out"));
  }
  o.rank_user = *std::move(user);
  return absl::OkStatus();
}

// --rank-uids: a range no user or group of this host has, on top of a
// --rank-user (the daemon is then root).
absl::Status ResolveRankUids(DaemonOptions& o) {
  const std::string text = absl::GetFlag(FLAGS_rank_uids);
  if (text.empty()) return absl::OkStatus();
  absl::StatusOr<trainctl::worker::RankUidRange> range = trainctl::worker::ParseRankUids(text);
  if (!range.ok()) return Misconfigured("", range.status().message());
  if (!o.rank_user.has_value()) {
    return Misconfigured("--rank-uids",
                         "needs --rank-user (another user than this daemon's, whose groups every "
                         "owner's ranks get besides their own)");
  }
  if (absl::Status unused = trainctl::worker::CheckRankUidsUnused(*range); !unused.ok()) {
    return Misconfigured("", unused.message());
  }
  o.rank_uids = *range;
  return absl::OkStatus();
}

// What ranks run and where their files may lie.
absl::Status ApplyRankFlags(DaemonOptions& o) {
  if (absl::Status s = ResolveRankUser(o); !s.ok()) return s;
  if (absl::Status s = ResolveRankUids(o); !s.ok()) return s;
  o.rank_binary = absl::GetFlag(FLAGS_rank_binary).empty() ? DefaultRankBinary()
                                                           : absl::GetFlag(FLAGS_rank_binary);
  o.rank_timeout_s = absl::GetFlag(FLAGS_rank_timeout_s);
  o.allow_commands = absl::GetFlag(FLAGS_allow_commands);
  o.cgroup_root = absl::GetFlag(FLAGS_cgroup_root);
  o.python_dir = absl::GetFlag(FLAGS_python_dir).empty() ? trainctl::worker::DefaultPythonDir()
                                                         : absl::GetFlag(FLAGS_python_dir);
  for (auto [flag, roots, out] :
       {std::tuple{"--data-root", absl::GetFlag(FLAGS_data_root), &o.data_roots},
        std::tuple{"--checkpoint-root", absl::GetFlag(FLAGS_checkpoint_root),
                   &o.checkpoint_roots}}) {
    absl::StatusOr<std::vector<std::string>> canonical =
        trainctl::worker::CanonicalRoots(roots, flag);
    if (!canonical.ok()) return Misconfigured("", canonical.status().message());
    *out = *canonical;
  }
  return absl::OkStatus();
}

// --labels key=value,key=value.
absl::Status ParseLabels(const std::string& labels, std::map<std::string, std::string>& out) {
  if (labels.empty()) return absl::OkStatus();
  for (absl::string_view kv : absl::StrSplit(labels, ',')) {
    std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.size() != 2 || p[0].empty())
      return Misconfigured("--labels", absl::StrCat("expected key=value, got '", kv, "'"));
    out[p[0]] = p[1];
  }
  return absl::OkStatus();
}

// What this host offers and reports: telemetry bound, labels, slots, /metrics.
absl::Status ApplyHostFlags(DaemonOptions& o) {
  if (absl::GetFlag(FLAGS_telemetry_buffer_mb) < 1) {
    return Misconfigured("", "--telemetry-buffer-mb must be at least 1");
  }
  o.telemetry_buffer_bytes = int64_t{absl::GetFlag(FLAGS_telemetry_buffer_mb)} << 20;
  if (absl::Status s = ParseLabels(absl::GetFlag(FLAGS_labels), o.labels); !s.ok()) return s;
  auto slots = trainctl::worker::ChooseSlots(absl::GetFlag(FLAGS_gpus), absl::GetFlag(FLAGS_slots),
                                             trainctl::worker::DiscoverGpus(),
                                             absl::GetFlag(FLAGS_gpu_flavor));
  if (!slots.ok()) return Misconfigured("", slots.status().message());
  o.slots = *slots;
  o.http_listen = absl::GetFlag(FLAGS_http_listen);
  return absl::OkStatus();
}

// Every flag, in the order a misconfiguration is reported.
absl::StatusOr<DaemonOptions> OptionsFromFlags() {
  absl::StatusOr<DaemonOptions> o = BaseOptions();
  if (!o.ok()) return o.status();
  for (absl::Status (*step)(DaemonOptions&) :
       {ResolveIdentity, ResolveTokenAndCa, ApplyRankFlags, ApplyHostFlags}) {
    if (absl::Status s = step(*o); !s.ok()) return s;
  }
  if (absl::Status s = trainctl::SetLogLevelFlag(absl::GetFlag(FLAGS_log_level)); !s.ok()) return s;
  return o;
}

// Starts the daemon, says where it serves, and runs until SIGTERM or
// SIGINT; then stops the ranks and says goodbye to the coordinator.
int RunUntilStopSignal(const DaemonOptions& o) {
  std::signal(SIGPIPE, SIG_IGN);
  trainctl::worker::WorkerDaemon daemon(o);
  if (absl::Status s = daemon.Start(); !s.ok()) {
    std::cerr << "trainctl-worker: " << s.message() << "\n";
    return 2;
  }
  const std::string metrics =
      daemon.http_address().empty() ? "" : "http://" + daemon.http_address() + "/metrics";
  std::cout << "trainctl-worker: " << o.slots.size() << " "
            << (o.slots[0].kind() == trainctl::v1::Slot::KIND_GPU ? "GPU" : "CPU")
            << " slot(s), coordinator " << o.coordinator << std::endl;
  if (!metrics.empty()) std::cout << "trainctl-worker: metrics on " << metrics << std::endl;
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "worker", "started",
                     {{"coordinator", o.coordinator},
                      {"slots", absl::StrCat(o.slots.size())},
                      {"work_dir", o.work_dir},
                      {"metrics", metrics.empty() ? "off" : metrics}});
  trainctl::WaitForStopSignal();
  trainctl::LogEvent(trainctl::LogLevel::kInfo, "worker", "stopping",
                     {{"reason", "stop signal"}, {"then", "stop ranks, say goodbye"}});
  daemon.Shutdown(/*goodbye=*/true, absl::Seconds(absl::GetFlag(FLAGS_stop_grace_s)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  trainctl::ParseDaemonFlags(
      argc, argv,
      "trainctl-worker --coordinator HOST:PORT[,HOST:PORT] --ca CA [--join-token T | --token-file "
      "F] [--gpus all|0,1 | --slots N] [--work-dir DIR]\n"
      "The per-host daemon: registers this host's GPUs or CPU slots, launches and supervises "
      "rank processes, forwards their metrics and logs.",
      "worker/daemon/main.cc");
  // Private by default, before the first file (a joined certificate, the
  // work dir) is made: ranks inherit it, so checkpoints and models are too.
  absl::StatusOr<mode_t> mask = trainctl::ParseUmask(absl::GetFlag(FLAGS_umask));
  if (!mask.ok()) {
    std::cerr << "trainctl-worker: " << mask.status().message() << "\n";
    return 2;
  }
  ::umask(*mask);
  trainctl::BlockStopSignals();  // before any thread starts (see common/stop_signals.h)
  // Debian's abseil keeps deadlock detection on in release builds; it costs
  // every lock a graph update (about 6% of the coordinator's CPU at 10k workers).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<DaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "trainctl-worker: " << options.status().message() << "\n";
    return ExitCode(options.status());
  }
  return RunUntilStopSignal(*options);
}

// The README's cluster, set up exactly as it says (issue #47, item 1):
// `trainctl-coordinator init --dir tls --san HOST --db state.db`, the
// coordinator started by the words of init's `Start:` line (`--tls-dir tls --db
// state.db` and init's --listen; TLS on every interface),
// each worker daemon with `--coordinator HOST:PORT --ca tls/ca.crt
// --token-file tls/worker.token` and no other flag (in a directory of its
// own, as on its own host: the default --work-dir is relative), the admin's
// config copied to ~/.config/trainctl/config.yaml, then `trainctl submit
// examples/mlp-synthetic.yaml --follow`. Two workers of one CPU slot each
// (a host without GPUs offers one), so the 2-rank example spans both and its
// ranks must meet at rank 0's advertised address.
//
// Differences from the README, each because a test needs it: the
// coordinator listens on a free port (on 0.0.0.0, the README's interface)
// instead of 7070; HOST is this machine's host name (the README's `coord`)
// or, across network namespaces, the coordinator's bridge address.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/support/cluster.h"
#include "tests/support/ports.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using testing::BuildDirOfThisTest;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Process;
using testing::SourceDir;

std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "trainctl_readme_XXXXXX").string();
  char* made = mkdtemp(tmpl.data());
  return made == nullptr ? "" : std::string(made);
}

bool ExitedOk(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Runs a shell command line; true when it exits 0 (its output in `*out`).
bool Sh(const std::string& cmd, std::string* out = nullptr) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return false;
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  const int rc = pclose(p);
  if (out != nullptr) *out = text;
  return rc == 0;
}

class ReadmeCluster {
 public:
  // `wrap(i)`: words put before worker i's command line ({} on this host;
  // `ip netns exec NS` for a namespace of its own).
  ReadmeCluster()
      : dir_(MakeTempDir()), build_(BuildDirOfThisTest()), port_(testing::UnusedPort()) {}
  ~ReadmeCluster() {
    for (auto& w : workers_) {
      w->Kill(SIGTERM);
      if (w->Wait(absl::Seconds(10)) < 0) w->Kill(SIGKILL);
    }
    workers_.clear();
    if (coordinator_) {
      coordinator_->Kill(SIGTERM);
      if (coordinator_->Wait(absl::Seconds(10)) < 0) coordinator_->Kill(SIGKILL);
    }
    if (std::getenv("TRAINCTL_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(dir_);
  }

  const std::string& dir() const { return dir_; }
  std::string address() const { return absl::StrCat(host_, ":", port_); }

  // init + the coordinator, with the CLI config copied where the README copies it.
  bool Start(const std::string& host) {
    host_ = host;
    if (dir_.empty() || port_ == 0) return false;
    Process init({build_ + "/coordinator/trainctl-coordinator", "init", "--dir", "tls", "--san",
                  host_, "--db", "state.db", "--listen", absl::StrCat("0.0.0.0:", port_)},
                 dir_ + "/init.log", dir_);
    if (!init.Start() || !ExitedOk(init.Wait(absl::Seconds(60)))) {
      ADD_FAILURE() << "init: " << init.ReadLog();
      return false;
    }
    std::filesystem::create_directories(dir_ + "/home/.config/trainctl");
    std::filesystem::copy_file(dir_ + "/tls/trainctl.yaml",
                               dir_ + "/home/.config/trainctl/config.yaml");
    // The coordinator as init's `Start:` line starts it, word for word
    // (issue #44 item 10: the line left out init's --listen, and the
    // coordinator then listened on 7070, not where the config points).
    const std::string summary = init.ReadLog();
    std::vector<std::string> start;
    for (absl::string_view line : absl::StrSplit(summary, '\n')) {
      if (absl::ConsumePrefix(&line, "Start: trainctl-coordinator ")) {
        start = absl::StrSplit(line, ' ', absl::SkipEmpty());
      }
    }
    if (start.empty()) {
      ADD_FAILURE() << "init printed no Start: line: " << summary;
      return false;
    }
    EXPECT_THAT(start, ::testing::ElementsAre("--tls-dir", dir_ + "/tls", "--db", "state.db",
                                              "--listen", absl::StrCat("0.0.0.0:", port_)))
        << summary;
    // Each certificate name once, though --san names the host (the README's
    // `--san coord` on the host coord).
    std::vector<std::string> sans;
    for (absl::string_view line : absl::StrSplit(summary, '\n')) {
      const size_t at = line.find("(SANs: ");
      if (at == absl::string_view::npos) continue;
      line.remove_prefix(at + 7);
      absl::ConsumeSuffix(&line, ")");
      sans = absl::StrSplit(line, ", ");
    }
    EXPECT_EQ(std::count(sans.begin(), sans.end(), host_), 1) << summary;
    EXPECT_EQ(std::set<std::string>(sans.begin(), sans.end()).size(), sans.size()) << summary;
    start.insert(start.begin(), build_ + "/coordinator/trainctl-coordinator");
    coordinator_ = std::make_unique<Process>(start, dir_ + "/coordinator.log", dir_);
    if (!coordinator_->Start()) return false;
    for (absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
      if (coordinator_->ReadLog().find("listening on ") != std::string::npos) return true;
      if (!coordinator_->running()) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "the coordinator did not start: " << coordinator_->ReadLog();
    return false;
  }

  // A worker daemon as the README starts one, run in a directory of its own.
  bool StartWorker(const std::string& name, const std::vector<std::string>& wrap = {},
                   const std::vector<std::string>& extra = {}) {
    const std::string wdir = dir_ + "/" + name;
    std::filesystem::create_directories(wdir);
    std::vector<std::string> argv = wrap;
    for (const std::string& a :
         {build_ + "/worker/daemon/trainctl-worker", std::string("--coordinator"), address(),
          std::string("--ca"), dir_ + "/tls/ca.crt", std::string("--token-file"),
          dir_ + "/tls/worker.token"}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    workers_.push_back(std::make_unique<Process>(argv, dir_ + "/" + name + ".log", wdir));
    return workers_.back()->Start();
  }

  // The CLI with the README's config (HOME is the test's), its output in `*out`.
  int Cli(const std::vector<std::string>& args, std::string* out,
          absl::Duration timeout = absl::Seconds(180)) {
    std::vector<std::string> argv{"/usr/bin/env",
                                  "-u",
                                  "XDG_CONFIG_HOME",
                                  "-u",
                                  "TRAINCTL_COORDINATOR",
                                  "-u",
                                  "TRAINCTL_ADDRESS",
                                  "-u",
                                  "TRAINCTL_TOKEN",
                                  "-u",
                                  "TRAINCTL_CA",
                                  "HOME=" + dir_ + "/home",
                                  build_ + "/client/trainctl"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = absl::StrCat(dir_, "/cli-", ++cli_runs_, ".log");
    Process cli(argv, log, SourceDir());
    if (!cli.Start()) return -1;
    const int status = cli.Wait(timeout);
    if (status < 0) cli.Kill(SIGKILL);
    *out = cli.ReadLog();
    return status;
  }

  // Until `trainctl workers` lists `n` workers (its output in `*out`).
  bool WaitWorkers(int n, std::string* out) {
    for (absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline;) {
      if (ExitedOk(Cli({"workers", "-o", "json"}, out, absl::Seconds(30)))) {
        int alive = 0;
        for (size_t at = 0; (at = out->find("WORKER_STATE_ALIVE", at)) != std::string::npos; ++at)
          ++alive;
        if (alive >= n) return ExitedOk(Cli({"workers"}, out, absl::Seconds(30)));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  std::string Logs() const {
    std::string all =
        absl::StrCat("--- coordinator\n", coordinator_ ? coordinator_->ReadLog() : "");
    for (const auto& w : workers_) absl::StrAppend(&all, "--- ", w->log_path(), "\n", w->ReadLog());
    return all;
  }

 private:
  std::string dir_, build_, host_;
  int port_ = 0;
  int cli_runs_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
};

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// The 2-rank example trains across two workers, and `trainctl workers`
// shows both with their addresses accepted.
void TrainAcrossTwo(ReadmeCluster& cluster) {
  std::string out;
  ASSERT_TRUE(cluster.WaitWorkers(2, &out)) << out << cluster.Logs();
  EXPECT_THAT(out, Not(HasSubstr("refused"))) << out;
  const absl::Time start = absl::Now();
  const int status = cluster.Cli({"submit", "examples/mlp-synthetic.yaml", "--follow"}, &out);
  EXPECT_TRUE(ExitedOk(status)) << "status " << status << "\n" << out << cluster.Logs();
  EXPECT_THAT(out, HasSubstr("SUCCEEDED")) << out;
  std::cout << "the README's example across two workers: "
            << absl::FormatDuration(absl::Now() - start) << "\n";
  // Each worker offers one CPU slot (the default on a host without GPUs):
  // the 2-rank job could only run with a rank on each.
}

TEST(ReadmeClusterE2ETest, TwoWorkersOnOneHostTrainTheExample) {
  ReadmeCluster cluster;
  ASSERT_TRUE(cluster.Start(HostName()));
  ASSERT_TRUE(cluster.StartWorker("worker-a"));
  ASSERT_TRUE(cluster.StartWorker("worker-b"));
  TrainAcrossTwo(cluster);
}

// A worker whose --address the coordinator cannot verify is told so at
// registration (its log) and `trainctl workers` shows it, with the flag
// that fixes it.
TEST(ReadmeClusterE2ETest, AnAddressTheCoordinatorCannotVerifyIsRefusedAtRegistration) {
  ReadmeCluster cluster;
  ASSERT_TRUE(cluster.Start(HostName()));
  ASSERT_TRUE(cluster.StartWorker("worker-a", {}, {"--address", "192.0.2.7"}));
  std::string out;
  ASSERT_TRUE(cluster.WaitWorkers(1, &out)) << out << cluster.Logs();
  EXPECT_THAT(out, HasSubstr("192.0.2.7 (refused)")) << out;
  EXPECT_THAT(out,
              HasSubstr("address refused: address '192.0.2.7' is not the address it connects from"))
      << out;
  EXPECT_THAT(out, HasSubstr("--address")) << out;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       absl::Now() < deadline && cluster.Logs().find("address_refused") == std::string::npos;) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(cluster.Logs(), HasSubstr("address_refused")) << "the worker's own log says it";
}

// Two hosts: each worker in a network namespace of its own, joined to the
// coordinator's by a bridge. Each advertises its own namespace's address
// (its route to the coordinator), and rank 1 dials rank 0 in the other.
class NetnsPair {
 public:
  NetnsPair() {
    const int id = static_cast<int>(getpid() % 200) + 20;
    tag_ = absl::StrCat("tc", getpid() % 100000);
    net_ = absl::StrCat("10.213.", id);
    std::string out;
    const std::string br = tag_ + "br";
    std::vector<std::string> steps = {
        absl::StrCat("ip link add ", br, " type bridge"),
        absl::StrCat("ip addr add ", net_, ".1/24 dev ", br),
        absl::StrCat("ip link set ", br, " up"),
    };
    for (int i = 0; i < 2; ++i) {
      const std::string ns = Ns(i), veth = absl::StrCat(tag_, "v", i),
                        peer = absl::StrCat(tag_, "p", i);
      steps.push_back("ip netns add " + ns);
      steps.push_back(absl::StrCat("ip link add ", veth, " type veth peer name ", peer));
      steps.push_back(absl::StrCat("ip link set ", peer, " netns ", ns));
      steps.push_back(absl::StrCat("ip link set ", veth, " master ", br, " up"));
      steps.push_back(
          absl::StrCat("ip netns exec ", ns, " ip addr add ", net_, ".", i + 2, "/24 dev ", peer));
      steps.push_back(absl::StrCat("ip netns exec ", ns, " ip link set ", peer, " up"));
      steps.push_back(absl::StrCat("ip netns exec ", ns, " ip link set lo up"));
    }
    made_ = true;
    for (const std::string& s : steps) {
      if (!Sh(s, &out)) {
        why_ = absl::StrCat("`", s, "`: ", out);
        return;
      }
    }
    ok_ = true;
  }
  ~NetnsPair() {
    if (!made_) return;
    for (int i = 0; i < 2; ++i) Sh("ip netns del " + Ns(i));
    Sh(absl::StrCat("ip link del ", tag_, "br"));
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string Ns(int i) const { return absl::StrCat(tag_, "-ns", i); }
  std::string CoordinatorIp() const { return net_ + ".1"; }

 private:
  std::string tag_, net_, why_;
  bool made_ = false, ok_ = false;
};

TEST(ReadmeClusterE2ETest, TwoWorkersInNetworkNamespacesTrainTheExample) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  NetnsPair hosts;
  if (!hosts.ok()) GTEST_SKIP() << "cannot make network namespaces here: " << hosts.why();
  ReadmeCluster cluster;
  ASSERT_TRUE(cluster.Start(hosts.CoordinatorIp()));
  ASSERT_TRUE(cluster.StartWorker("worker-a", {"/usr/sbin/ip", "netns", "exec", hosts.Ns(0)}));
  ASSERT_TRUE(cluster.StartWorker("worker-b", {"/usr/sbin/ip", "netns", "exec", hosts.Ns(1)}));
  TrainAcrossTwo(cluster);
}

}  // namespace
}  // namespace trainctl

// The trainctl CLI against a real coordinator (cli_test_support.h): usage
// and exit codes, validation errors, tokens, submit/status/list/describe/
// workers in tables and JSON, metrics, errors, cancel, checkpoints, resume.
#include "client/cli_test_support.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <mutex>

#include <grpcpp/grpcpp.h>

#include "common/auth/secret.h"
#include "trainctl/v1/job_service.grpc.pb.h"

namespace trainctl {
namespace {

using namespace cli_testing;  // NOLINT: the CLI tests' shared fixture

// A TCP listener on every interface that accepts whatever connects, keeps
// every byte it is sent, and answers an empty HTTP/2 SETTINGS frame, so
// that a gRPC client counts the connection ready and sends its calls: the
// eavesdropper on a plaintext connection.
class RecordingListener {
 public:
  RecordingListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "recording listener: " << strerror(errno);
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~RecordingListener() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_; }
  std::string bytes() const {
    std::lock_guard<std::mutex> l(mu_);
    return bytes_;
  }

 private:
  void Serve() {
    std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
    while (!stop_) {
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          ++connections_;
          static constexpr char kSettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
          (void)!write(c, kSettings, sizeof kSettings);
          fds.push_back({c, POLLIN, 0});
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        char buf[4096];
        ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n > 0) {
          std::lock_guard<std::mutex> l(mu_);
          bytes_.append(buf, static_cast<size_t>(n));
        } else {
          close(fds[i].fd);
          fds.erase(fds.begin() + static_cast<long>(i));
          --i;
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) close(fds[i].fd);
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  mutable std::mutex mu_;
  std::string bytes_;  // guarded by mu_
  std::thread thread_;
};

// An IPv4 address of an interface of this host that is up and not
// loopback, or "" when it has none.
std::string NonLoopbackIpv4() {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  std::string found;
  for (ifaddrs* i = all; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_UP) == 0)
      continue;
    char text[INET_ADDRSTRLEN] = {0};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (!auth::IsLoopbackAddress(text)) found = text;
  }
  freeifaddrs(all);
  return found;
}

// --- usage ---------------------------------------------------------------------

TEST(CliUsageTest, UsageErrorsExitTwoAndHelpHasAnExampleForEveryVerb) {
  EXPECT_EQ(RunTrainctl({}).code, 2);
  CliRun r = RunTrainctl({"frobnicate", "x"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown verb 'frobnicate'"));
  EXPECT_EQ(RunTrainctl({"submit"}).code, 2) << "FILE is required";
  EXPECT_EQ(RunTrainctl({"-o", "xml", "list"}).code, 2);
  EXPECT_EQ(RunTrainctl({"logs", "j", "--rank", "zero"}).code, 2);
  // cancel: one JOB or filters, never both, never neither (refused before
  // any coordinator is asked).
  r = RunTrainctl({"cancel"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("JOB: name a job, or cancel many with --queue, --owner or --state"));
  r = RunTrainctl({"cancel", "j", "--owner", "alice"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("JOB and --queue/--owner/--state exclude each other"));
  r = RunTrainctl({"cancel", "j", "--dry-run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--dry-run: only with --queue, --owner or --state"));
  r = RunTrainctl({"cancel", "--state", "pending,bogus", "--yes"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--state: unknown state 'bogus'"));
  r = RunTrainctl({"cancel", "--state", "FAILED", "-y"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--state: failed jobs have ended and cannot be cancelled"));

  r = RunTrainctl({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* verb : {"submit", "status", "describe", "list", "logs", "cancel", "workers"}) {
    EXPECT_THAT(r.out, HasSubstr(verb));
    CliRun help = RunTrainctl({verb, "--help"});
    EXPECT_EQ(help.code, 0) << verb;
    EXPECT_THAT(help.out,
                AllOf(HasSubstr(absl::StrCat("Usage: trainctl ", verb)), HasSubstr("Example:"),
                      HasSubstr(absl::StrCat("  trainctl ", verb))))
        << help.out;
  }
}

TEST(CliUsageTest, CoordinatorComesFromFlagThenEnvThenConfigThenDefault) {
  std::string home = testing::MakeTempDir();
  std::map<std::string, std::string> vars = {{"HOME", home}};
  cli::CliEnvironment env = testing::TestEnvironment();
  env.getenv = [&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  std::string error;
  EXPECT_EQ(cli::ResolveCoordinator("", env, &error)->address, "localhost:7070");
  ASSERT_EQ(system(("mkdir -p " + home + "/.config/trainctl").c_str()), 0);
  std::string config =
      testing::WriteFile(home + "/.config/trainctl", "config.yaml", "coordinator: cfg:1\n");
  auto resolved = cli::ResolveCoordinator("", env, &error);
  EXPECT_EQ(resolved->address, "cfg:1");
  EXPECT_EQ(resolved->source, config);
  vars["TRAINCTL_COORDINATOR"] = "env:2";
  EXPECT_EQ(cli::ResolveCoordinator("", env, &error)->address, "env:2");
  EXPECT_EQ(cli::ResolveCoordinator("flag:3", env, &error)->address, "flag:3");

  vars.erase("TRAINCTL_COORDINATOR");
  testing::WriteFile(home + "/.config/trainctl", "config.yaml", "coordinator: [a, b]\n");
  EXPECT_FALSE(cli::ResolveCoordinator("", env, &error).has_value());
  EXPECT_EQ(error, config + ":1:14: coordinator: expected host:port[,host:port...]");
  CliRun r = RunTrainctl({"list"}, env);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "trainctl list: " + config + ":1:14: coordinator: expected host:port[,host:port...]\n");
}

// --- validation ----------------------------------------------------------------

TEST(CliUsageTest, InvalidFilesPrintEveryErrorWithPathAndPositionAndExitTwo) {
  std::string dir = testing::MakeTempDir();
  std::string bad =
      testing::WriteFile(dir, "bad.yaml",
                         "name: Bad_Name\n"
                         "world_size: 0\n"
                         "model: {name: mlp, input_dim: 5, classes: 2}\n"
                         "data:\n"
                         "  train: {format: synthetic, length: 10, size: 5, classes: 2}\n"
                         "training:\n"
                         "  optimizer: {name: adamm, lr: -1}\n");
  // Nothing is contacted: the coordinator address leads nowhere.
  CliRun r = RunTrainctl({"--coordinator", Unreachable(), "submit", bad});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(
      r.err,
      bad +
          ":1:7: name: must be lower-case letters, digits and '-', starting and ending with a "
          "letter or digit, got 'Bad_Name'\n" +
          bad + ":2:13: world_size: must be > 0, got 0\n" + bad +
          ":7:21: training.optimizer.name: must be one of sgd, adam, adamw, got 'adamm'; did you "
          "mean 'adam'?\n" +
          bad + ":7:32: training.optimizer.lr: must be > 0, got -1\n");

  // --dry-run validates the same way.
  CliRun dry = RunTrainctl({"--coordinator", Unreachable(), "submit", bad, "--dry-run"});
  EXPECT_EQ(dry.code, 2);
  EXPECT_EQ(dry.err, r.err);

  std::string broken = testing::WriteFile(dir, "broken.yaml", "name: [unclosed\n");
  r = RunTrainctl({"submit", broken, "--dry-run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, broken + ":2:1: not valid YAML: end of sequence flow not found\n");

  std::string good = testing::WriteFile(dir, "good.yaml", testing::ValidJobYaml(2));
  r = RunTrainctl(
      {"submit", good, "--dry-run", "--set", "world_size=x", "--set", "training.epochs=0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "--set: world_size: must be an integer, got 'x'\n"
            "--set: training.epochs: must be > 0, got 0\n");
}

TEST(CliUsageTest, DryRunWithoutACoordinatorValidatesAndSkipsThePlacement) {
  std::string dir = testing::MakeTempDir();
  std::string good = testing::WriteFile(dir, "good.yaml", testing::ValidJobYaml(2));
  std::string nowhere = Unreachable();
  CliRun r =
      RunTrainctl({"--coordinator", nowhere, "submit", good, "--dry-run", "--set", "world_size=3"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(good + ": valid\n"));
  EXPECT_THAT(r.out, HasSubstr("  ranks:       3, device cpu, backend auto, priority 0\n"));
  EXPECT_THAT(r.out, HasSubstr("  model:       mlp 5 → 2\n"));
  EXPECT_THAT(r.out,
              HasSubstr("Placement: not checked (cannot reach the coordinator at " + nowhere));

  r = RunTrainctl({"--coordinator", nowhere, "-o", "json", "submit", good, "--dry-run"});
  EXPECT_EQ(r.code, 0);
  ASSERT_EQ(Lines(r.out).size(), 1u);
  auto resp = ParseJson<v1::SubmitJobResponse>(r.out);
  EXPECT_EQ(resp.job().spec().world_size(), 2);
  EXPECT_EQ(resp.job().spec().data().batch_size(), 30);
  EXPECT_TRUE(resp.planned().empty());
}

// --max-runtime sets scheduling.max_runtime_s from seconds or a duration;
// anything else is a usage error naming the flag.
TEST(CliUsageTest, MaxRuntimeTakesSecondsOrADuration) {
  std::string dir = testing::MakeTempDir();
  std::string good = testing::WriteFile(dir, "good.yaml", testing::ValidJobYaml(2));
  std::string nowhere = Unreachable();
  CliRun r = RunTrainctl(
      {"--coordinator", nowhere, "submit", good, "--dry-run", "--max-runtime", "1h30m"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("max runtime:"));
  EXPECT_THAT(r.out, HasSubstr(" 1h30m (scheduling.max_runtime_s; past it: TIMEOUT)\n"));
  r = RunTrainctl(
      {"--coordinator", nowhere, "-o", "json", "submit", good, "--dry-run", "--max-runtime", "90"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ParseJson<v1::SubmitJobResponse>(r.out).job().spec().scheduling().max_runtime_s(), 90);
  r = RunTrainctl({"--coordinator", nowhere, "submit", good, "--dry-run", "--max-runtime", "soon"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-runtime: must be seconds or a duration such as 90m or "
                               "2h30m, got 'soon'"));
  r = RunTrainctl({"--coordinator", nowhere, "submit", good, "--dry-run", "--max-runtime", "-5"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max-runtime: must be > 0, got '-5'"));
}

TEST_F(CliTest, TokenVerbsAndLoginWriteAConfigTheOtherVerbsUse) {
  CliRun created = Run({"token", "create", "--role", "viewer", "--name", "carol", "--ttl", "1d"});
  ASSERT_EQ(created.code, 0) << created.err;
  EXPECT_THAT(created.out, HasSubstr("(carol), role viewer"));
  std::string secret = created.out.substr(created.out.rfind("tct_"));
  secret = secret.substr(0, secret.find('\n'));
  CliRun bad = Run({"token", "create", "--role", "root"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--role: 'root' is not one of admin, submitter, viewer, worker"));
  CliRun listed = Run({"token", "list"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("carol"));

  // login checks the token and writes the config (0600); the other verbs read it.
  std::string home = ::testing::TempDir() + "/cli_login_home";
  std::filesystem::remove_all(home);
  cli::CliEnvironment env = testing::TestEnvironment();
  env.getenv = [home](const std::string& name) -> std::optional<std::string> {
    if (name == "XDG_CONFIG_HOME") return home;
    return std::nullopt;
  };
  CliRun wrong =
      RunTrainctl({"login", "--address", cluster_.address(), "--token", "tct_t-0_00"}, env);
  EXPECT_EQ(wrong.code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("unknown token"));
  EXPECT_FALSE(std::filesystem::exists(home + "/trainctl/config.yaml"))
      << "a bad token is not saved";
  CliRun login = RunTrainctl({"login", "--address", cluster_.address(), "--token-file",
                              testing::WriteFile(dir_, "carol.token", secret)},
                             env);
  ASSERT_EQ(login.code, 0) << login.err;
  auto perms = std::filesystem::status(home + "/trainctl/config.yaml").permissions();
  EXPECT_EQ(perms & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  CliRun list = RunTrainctl({"list"}, env);
  EXPECT_EQ(list.code, 0) << list.err;
  CliRun submit = RunTrainctl({"submit", job_file_}, env);
  EXPECT_EQ(submit.code, 1);
  EXPECT_THAT(submit.err, HasSubstr("SubmitJob needs role admin or submitter; token"));
  // Revoked: the saved token stops working.
  CliRun revoked = Run({"token", "revoke", secret.substr(4, secret.rfind('_') - 4)});
  ASSERT_EQ(revoked.code, 0) << revoked.err;
  list = RunTrainctl({"list"}, env);
  EXPECT_EQ(list.code, 1);
  EXPECT_THAT(list.err, HasSubstr("revoked"));
  // No token at all.
  CliRun none = RunTrainctl({"--coordinator", cluster_.address(), "list"});
  EXPECT_EQ(none.code, 1);
  EXPECT_THAT(none.err, HasSubstr("no token"));
}

// Issue #45 item 3: a client given a non-loopback address and no CA used
// to send its Bearer token in clear text. The CLI (token from a file or
// from the environment, alone or in a list), `login` and the C++ client
// now refuse before they dial: the listener on that address hears nothing,
// though it does hear a client with no token to protect.
TEST_F(CliTest, ATokenIsNeverSentInClearTextToANonLoopbackAddress) {
  const std::string ip = NonLoopbackIpv4();
  if (ip.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  RecordingListener eavesdropper;
  ASSERT_GT(eavesdropper.port(), 0);
  const std::string remote = absl::StrCat(ip, ":", eavesdropper.port());
  const std::string token = cluster_.admin_token();
  const std::string token_file = AdminTokenFile();
  const std::string refused = "refusing to send the token in clear text to " + remote;

  CliRun list = RunTrainctl({"--coordinator", remote, "--token-file", token_file, "list"});
  EXPECT_EQ(list.code, 1);
  EXPECT_THAT(list.err, AllOf(HasSubstr(refused),
                              HasSubstr("--ca FILE, $TRAINCTL_CA or `ca:` in the config file")));
  EXPECT_THAT(list.err, Not(HasSubstr(token)));
  // The standby of a list may be the remote one: nothing is dialled at all.
  CliRun pair = RunTrainctl(
      {"--coordinator", cluster_.address() + "," + remote, "--token-file", token_file, "list"});
  EXPECT_EQ(pair.code, 1);
  EXPECT_THAT(pair.err, HasSubstr(refused));
  // From the environment, as from a config file.
  cli::CliEnvironment env = testing::TestEnvironment();
  env.getenv = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "TRAINCTL_COORDINATOR") return remote;
    if (name == "TRAINCTL_TOKEN") return token;
    return std::nullopt;
  };
  CliRun from_env = RunTrainctl({"list"}, env);
  EXPECT_EQ(from_env.code, 1);
  EXPECT_THAT(from_env.err, HasSubstr(refused));
  // login: refused, nothing saved.
  const std::string home = testing::MakeTempDir();
  env.getenv = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "XDG_CONFIG_HOME") return home;
    return std::nullopt;
  };
  CliRun login = RunTrainctl({"login", "--address", remote, "--token-file", token_file}, env);
  EXPECT_EQ(login.code, 1);
  EXPECT_THAT(login.err, HasSubstr(refused));
  EXPECT_FALSE(std::filesystem::exists(home + "/trainctl/config.yaml"));
  // The library itself.
  ClientOptions options;
  options.address = remote;
  options.token = token;
  options.timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr(refused));

  EXPECT_EQ(eavesdropper.connections(), 0);
  EXPECT_EQ(eavesdropper.bytes(), "");
  // Loopback stays plaintext, by name as by address.
  CliRun local = RunTrainctl(
      {"--coordinator", "localhost:" + cluster_.address().substr(cluster_.address().rfind(':') + 1),
       "--token-file", token_file, "list"});
  EXPECT_EQ(local.code, 0) << local.err;

  // What the clients did before: a plaintext channel with the token (the
  // one they were built on) hands the eavesdropper the token verbatim.
  auth::ChannelSecurity plain;
  plain.token = token;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      auth::MakeChannel(remote, plain, grpc::ChannelArguments());
  ASSERT_TRUE(channel.ok()) << channel.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  v1::ListJobsResponse ignored;
  (void)v1::JobService::NewStub(*channel)->ListJobs(&ctx, v1::ListJobsRequest(), &ignored);
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       absl::Now() < deadline && eavesdropper.bytes().find(token) == std::string::npos;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(eavesdropper.bytes(),
              AllOf(StartsWith("PRI * HTTP/2.0"), HasSubstr("Bearer " + token)));
}

// Issue #45 item 4: --token-file keeps the token off the command line;
// --token still works but says that others can read it there.
TEST_F(CliTest, TokenFileReplacesTokenOnTheCommandLine) {
  CliRun from_file = Run({"list"});
  EXPECT_EQ(from_file.code, 0) << from_file.err;
  EXPECT_EQ(from_file.err, "");
  CliRun flag =
      RunTrainctl({"--coordinator", cluster_.address(), "--token", cluster_.admin_token(), "list"});
  EXPECT_EQ(flag.code, 0) << flag.err;
  EXPECT_THAT(
      flag.err,
      HasSubstr(
          "warning: --token puts the token on the command line, where every user of this host "
          "can read it (ps, /proc/PID/cmdline); use --token-file FILE or $TRAINCTL_TOKEN"));
  CliRun both = Run({"--token", cluster_.admin_token(), "list"});
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, HasSubstr("--token and --token-file: give one of them"));
  CliRun missing =
      RunTrainctl({"--coordinator", cluster_.address(), "--token-file", dir_ + "/nothere", "list"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, AllOf(HasSubstr("--token-file: "), HasSubstr(dir_ + "/nothere")));
}

TEST_F(CliTest, DryRunWithACoordinatorShowsThePlacement) {
  CliRun r = Run({"submit", job_file_, "--dry-run"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Placement now (coordinator " + cluster_.address() +
                               "):\n  the job would wait: "));

  cluster_.AddWorker("w0", 2);
  r = Run({"submit", job_file_, "--dry-run"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Placement now (coordinator " + cluster_.address() +
                               "):\n"
                               "  RANK  NODE  LOCAL  HOST     WORKER  SLOT\n"
                               "  0     0     0      host-w0  w0      cpu:0\n"
                               "  1     0     1      host-w0  w0      cpu:1\n"));
  r = Run({"submit", job_file_, "--dry-run", "-o", "json"});
  auto resp = ParseJson<v1::SubmitJobResponse>(r.out);
  ASSERT_EQ(resp.planned_size(), 2);
  EXPECT_EQ(resp.planned(1).slot().index(), 1);
  EXPECT_TRUE(Client::FromChannel(cluster_.channel())->List()->empty())
      << "a dry run stores nothing";
}

// --- submit, status, list, describe, workers ------------------------------------

TEST_F(CliTest, SubmitAppliesSetOverridesAndPrintsTheJob) {
  CliRun r = Run({"submit", job_file_, "--set", "world_size=1", "--set", "training.epochs=5",
                  "--set", "training.optimizer.lr=0.05"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, MatchesRegex("submitted job classic-[a-z0-9]+ \\(PENDING.*\\)\n"));
  std::string id = r.out.substr(std::string("submitted job ").size());
  id = id.substr(0, id.find(' '));
  absl::StatusOr<v1::Job> job = Client::FromChannel(cluster_.channel())->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().world_size(), 1);
  EXPECT_EQ(job->spec().training().epochs(), 5);
  EXPECT_DOUBLE_EQ(job->spec().training().optimizer().lr(), 0.05);

  CliRun refused = Run({"submit", job_file_, "--set", "world_size=100000"});
  EXPECT_EQ(refused.code, 2);
  EXPECT_EQ(refused.err, "--set: world_size: must be in [1, 65536], got 100000\n");
}

// Code travels with the job (docs/command-jobs.md): --no-upload keeps the
// directory as a path every worker has; nothing is packed or sent.
TEST_F(CliTest, SubmitNoUploadKeepsTheDirectoryAsTheWorkingDir) {
  const std::string code = dir_ + "/code";
  std::filesystem::create_directories(code);
  CliRun r = Run({"-o", "json", "submit", "--wait-for-capacity", "--no-upload", "--working-dir",
                  code, "--nproc-per-node", "1", "train.py"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("code:")));
  v1::Job job = ParseJson<v1::Job>(r.out);
  EXPECT_EQ(job.spec().command().working_dir(), code);
  EXPECT_FALSE(job.spec().command().has_code());
  EXPECT_THAT(job.spec().command().argv(), ElementsAre("python3", "train.py"));

  // Without --working-dir: the current directory, as before.
  r = Run({"-o", "json", "submit", "--wait-for-capacity", "--no-upload", "--nproc-per-node", "1",
           "train.py"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ParseJson<v1::Job>(r.out).spec().command().working_dir(),
            std::filesystem::current_path().string());
}

TEST_F(CliTest, SubmitWorkingDirIsRefusedForAJobThatIsNotACommandJob) {
  CliRun r = Run({"submit", "--working-dir", dir_, job_file_});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(
      r.err,
      HasSubstr(
          "trainctl submit: --working-dir: the job is not a command job (it has no command:)"));
  r = Run({"submit", "--working-dir", dir_ + "/missing", "--nproc-per-node", "1", "train.py"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--working-dir " + dir_ + "/missing: not a directory"));
}

// The client's limit (64 MiB) is checked before the coordinator is dialled:
// a listener that records connections sees none.
TEST_F(CliTest, SubmitRefusesAnOversizeDirectoryBeforeAnyCallNamingTheBiggestFiles) {
  const std::string code = dir_ + "/big";
  std::filesystem::create_directories(code + "/data");
  std::ofstream(code + "/train.py") << "print('hi')\n";
  // Sparse: 65 MiB on paper, nothing on disk (the refusal reads no file).
  std::filesystem::resize_file(testing::WriteFile(code + "/data", "shard0.bin", ""),
                               int64_t{65} << 20);
  std::filesystem::resize_file(testing::WriteFile(code + "/data", "shard1.bin", ""),
                               int64_t{3} << 20);
  RecordingListener listener;
  CliRun r = RunTrainctl({"--coordinator", absl::StrCat("127.0.0.1:", listener.port()),
                          "--token-file", AdminTokenFile(), "submit", "--working-dir", code,
                          "--nproc-per-node", "1", "train.py"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("over the limit of 64 MiB"));
  EXPECT_THAT(
      r.err,
      HasSubstr("the biggest files: data/shard0.bin (65 MiB), data/shard1.bin (3 MiB), train.py"));
  EXPECT_THAT(r.err, HasSubstr(".trainctlignore"));
  EXPECT_EQ(listener.connections(), 0);

  // Ignored, it is left out and the rest goes (here: to a coordinator
  // that does not take uploads yet, or does).
  std::ofstream(code + "/.trainctlignore") << "data/\n";
  r = RunTrainctl({"--coordinator", absl::StrCat("127.0.0.1:", listener.port()), "--token-file",
                   AdminTokenFile(), "--timeout", "1", "submit", "--working-dir", code,
                   "--nproc-per-node", "1", "train.py"});
  EXPECT_THAT(r.err, Not(HasSubstr("over the limit")));
  EXPECT_GE(listener.connections(), 1);
}

// The whole submit path against a fake coordinator that stores uploads:
// the code line, command.code in the submitted spec, working_dir empty,
// and a second submit of the same tree finds it stored.
class FakeCodeCoordinator final : public v1::JobService::Service {
 public:
  grpc::Status UploadCode(grpc::ServerContext*, grpc::ServerReader<v1::UploadCodeChunk>* reader,
                          v1::UploadCodeResponse* resp) override {
    v1::UploadCodeChunk chunk;
    std::string digest, data;
    while (reader->Read(&chunk)) {
      if (digest.empty()) {
        digest = chunk.digest();
        resp->set_digest(digest);
        std::lock_guard<std::mutex> l(mu_);
        if (stored_.count(digest) > 0) {
          resp->set_already_stored(true);
          return grpc::Status::OK;
        }
      }
      data += chunk.data();
    }
    resp->set_size_bytes(static_cast<int64_t>(data.size()));
    if (auth::Sha256Hex(data) != digest.substr(7))
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "digest");
    std::lock_guard<std::mutex> l(mu_);
    stored_[digest] = data;
    return grpc::Status::OK;
  }
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    resp->mutable_job()->set_id("fake-1");
    resp->mutable_job()->set_state(v1::JOB_STATE_PENDING);
    *resp->mutable_job()->mutable_spec() = req->spec();
    return grpc::Status::OK;
  }
  std::map<std::string, std::string> stored() {
    std::lock_guard<std::mutex> l(mu_);
    return stored_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> stored_;
};

TEST_F(CliTest, SubmitPacksUploadsAndNamesTheCodeInTheSpec) {
  FakeCodeCoordinator fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  const std::string code = dir_ + "/proj";
  std::filesystem::create_directories(code + "/pkg");
  std::ofstream(code + "/train.py") << "print('hi')\n";
  std::ofstream(code + "/pkg/model.py") << "X = 1\n";
  std::ofstream(code + "/.gitignore") << "*.log\n";
  std::ofstream(code + "/run.log") << "left out\n";
  const std::vector<std::string> args = {"--coordinator",
                                         absl::StrCat("127.0.0.1:", port),
                                         "--token-file",
                                         AdminTokenFile(),
                                         "-o",
                                         "json",
                                         "submit",
                                         "--working-dir",
                                         code,
                                         "--nproc-per-node",
                                         "1",
                                         "train.py"};
  CliRun r = RunTrainctl(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err,
              MatchesRegex("code: 3 files, 4.5 KiB, sha256:[0-9a-f]{8}\u2026 \\(uploaded\\)\n"));
  v1::Job job = ParseJson<v1::Job>(r.out);
  const v1::CommandSpec& c = job.spec().command();
  EXPECT_EQ(c.working_dir(), "");
  EXPECT_THAT(c.argv(), ElementsAre("python3", "train.py"));
  EXPECT_EQ(c.code().source(), code);
  EXPECT_EQ(c.code().files(), 3);
  EXPECT_EQ(c.code().size_bytes(), 4608);  // 3 files, a directory, the end marker
  ASSERT_EQ(fake.stored().size(), 1u);
  EXPECT_EQ(fake.stored().begin()->first, c.code().digest());

  // The same tree again: found stored, the same digest.
  r = RunTrainctl(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(already stored)"));
  EXPECT_EQ(ParseJson<v1::Job>(r.out).spec().command().code().digest(), c.code().digest());
  server->Shutdown();
}

TEST_F(CliTest, StatusListDescribeAndWorkersInTablesAndJson) {
  cluster_.AddWorker("w0", 1, {{"zone", "lab"}, {"disk", "ssd"}});
  cluster_.AddWorker("w1", 1);
  std::string done = Submit();
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(done, 1, 2));
  std::string waiting = Submit({"world_size=4"});

  // status
  CliRun r = Run({"status", done});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job:        " + done + "\n"));
  EXPECT_THAT(r.out, HasSubstr("Name:       classic\n"));
  EXPECT_THAT(r.out, HasSubstr("State:      SUCCEEDED\n"));
  EXPECT_THAT(r.out, HasSubstr("Attempt:    1 (restarts 0 of 3)\n"));
  EXPECT_THAT(
      r.out,
      HasSubstr("Progress:   [====================] 100%  epoch 2/2  step 10/10  loss 0.2500"));
  EXPECT_THAT(r.out, HasSubstr("Last eval:  epoch 2: loss 0.1250, accuracy 85.00%\n"));
  r = Run({"status", waiting});
  EXPECT_THAT(r.out, HasSubstr("State:      PENDING\n"));
  EXPECT_THAT(r.out, HasSubstr("Reason:     needs 4 cpu slots"));
  EXPECT_THAT(r.out, Not(HasSubstr("Progress:"))) << "nothing trained yet";
  r = Run({"status", done, "-o", "json"});
  EXPECT_EQ(r.code, 0);
  auto job = ParseJson<v1::Job>(r.out);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.attempts_size(), 1);

  // list: newest first, state filter, JSON.
  r = Run({"list"});
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(lines[0],
              MatchesRegex("ID +NAME +QUEUE +STATE +RANKS +PROGRESS +RESTARTS +SUBMITTED +REASON"));
  EXPECT_THAT(
      lines[1],
      MatchesRegex(waiting +
                   " +classic +default +PENDING +4 +- +0 +(just now|.* ago) +needs 4 cpu slots.*"));
  EXPECT_THAT(
      lines[2],
      MatchesRegex(done +
                   " +classic +default +SUCCEEDED +2 +epoch 2/2 100% +0 +(just now|.* ago) +-"));
  r = Run({"list", "--state", "succeeded,failed"});
  EXPECT_EQ(Lines(r.out).size(), 2u) << r.out;
  EXPECT_THAT(r.out, HasSubstr(done));
  r = Run({"list", "--state", "running"});
  EXPECT_EQ(r.out, "no jobs\n");
  r = Run({"list", "-o", "json", "--state", "pending"});
  auto listed = ParseJson<v1::ListJobsResponse>(r.out);
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), waiting);
  r = Run({"list", "--state", "bogus"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, StartsWith("trainctl list: --state: unknown state 'bogus'"));

  // describe: spec, attempt placement and rank states, events.
  r = Run({"describe", done});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("\nSpec:\n  ranks:       2, device cpu, backend auto, priority 0\n"));
  EXPECT_THAT(r.out, HasSubstr("  train data:  synthetic 600 × 5, 2 classes, seed 0\n"));
  EXPECT_THAT(r.out, HasSubstr("  eval data:   synthetic 60 × 5, 2 classes, seed 1\n"));
  EXPECT_THAT(r.out, HasSubstr("\nAttempt 1: SUCCEEDED, "));
  EXPECT_THAT(
      r.out, MatchesRegex(
                 "(.|\n)*  RANK  NODE  LOCAL  HOST     WORKER  SLOT   STATE      STEP  EXIT\n"
                 "  0     0     0      host-w[01]  w[01]      cpu:0  SUCCEEDED  20    -\n"
                 "  1     1     0      host-w[01]  w[01]      cpu:0  SUCCEEDED  20    -\n(.|\n)*"));
  EXPECT_THAT(r.out, HasSubstr("\nEvents:\n  TIME"));
  for (const char* type : {"submitted", "scheduled", "running", "epoch_end", "succeeded"}) {
    EXPECT_THAT(r.out, MatchesRegex(absl::StrCat("(.|\n)*\n  [0-9-]+ [0-9:]+  [-1]  +[-0]  +", type,
                                                 " +.*(.|\n)*")))
        << type;
  }
  EXPECT_THAT(r.out, HasSubstr("epoch 1/2 done: loss 0.5000, eval loss 0.2500, accuracy 75.00%"));
  r = Run({"describe", done, "-o", "json"});
  EXPECT_EQ(r.code, 0);
  ASSERT_EQ(Lines(r.out).size(), 1u);
  auto doc = ParseJson<google::protobuf::Struct>(r.out);
  std::string job_json, event_json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(doc.fields().at("job"), &job_json).ok());
  EXPECT_EQ(ParseJson<v1::Job>(job_json).attempts(0).ranks_size(), 2);
  const auto& events = doc.fields().at("events").list_value();
  ASSERT_GE(events.values_size(), 5);
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(events.values(0), &event_json).ok());
  EXPECT_EQ(ParseJson<v1::Event>(event_json).type(), "submitted");

  // workers
  r = Run({"workers"});
  EXPECT_EQ(r.code, 0) << r.err;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(
      lines[0],
      MatchesRegex(
          "ID +HOST +ADDRESS +STATE +SLOTS +FLAVOR +BUSY +CPUS +MEMORY +LIMITS +LABELS +HEARTBEAT "
          "+VERSION"));
  EXPECT_THAT(
      r.out,
      MatchesRegex(
          "(.|\n)*\nw0 +host-w0 +127.0.0.1 +ALIVE +1 cpu +- +0/1 +- +- +no +disk=ssd,zone=lab "
          "+.* +-\n(.|\n)*"));
  EXPECT_THAT(r.out, MatchesRegex(
                         "(.|\n)*\nw1 +host-w1 +127.0.0.1 +ALIVE +1 cpu +- +0/1 +- +- +no +- +.*"));
  cluster_.RemoveWorker("w1");
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (absl::Now() < deadline && Lines(Run({"workers"}).out).size() != 2)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Lines(Run({"workers"}).out).size(), 2u);
  r = Run({"workers", "--all", "-o", "json"});
  auto workers = ParseJson<v1::ListWorkersResponse>(r.out);
  ASSERT_EQ(workers.workers_size(), 2);
  r = Run({"workers", "--all"});
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*\nw1 +host-w1 +127.0.0.1 +LEFT +1 cpu +- +0/1 .*"));
}

// The table shows what a worker reported it can give ranks, as placement
// counts it (#26: a job's `resources` are placed by these).
TEST_F(CliTest, WorkersShowsAllocatableCpusMemoryAndLimits) {
  testing::FakeWorker& w = cluster_.AddWorker("w-big", 2);
  v1::Allocatable a;
  a.set_cpus(7.5);
  a.set_memory_bytes(int64_t{3} << 30);
  a.set_enforces_limits(true);
  w.set_allocatable(a);
  w.Leave();
  ASSERT_TRUE(w.Connect());
  CliRun r = Run({"workers"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      MatchesRegex(
          "(.|\n)*\nw-big +host-w-big +127.0.0.1 +ALIVE +2 cpu +- +0/2 +7.5 +3 GiB +yes +- .*"));
}

// A GPU worker's flavor (Slot.flavor) shows in the table and in -o json:
// what a job names in resources.gpu_flavor.
TEST_F(CliTest, WorkersShowsTheGpuFlavor) {
  testing::FakeWorker& w = cluster_.AddWorker("w-gpu", 2);
  w.set_gpus("NVIDIA H100 80GB HBM3", "h100");
  w.Leave();
  ASSERT_TRUE(w.Connect());
  CliRun r = Run({"workers"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(
      r.out, MatchesRegex("(.|\n)*\nw-gpu +host-w-gpu +127.0.0.1 +ALIVE +2 gpu \\(NVIDIA H100 80GB "
                          "HBM3\\) +h100 +0/2 .*"));
  r = Run({"workers", "-o", "json"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto workers = ParseJson<v1::ListWorkersResponse>(r.out);
  ASSERT_EQ(workers.workers_size(), 1);
  ASSERT_EQ(workers.workers(0).slots_size(), 2);
  EXPECT_EQ(workers.workers(0).slots(1).flavor(), "h100");
  EXPECT_THAT(r.out, HasSubstr("\"flavor\":\"h100\""));
}

TEST_F(CliTest, EveryVerbTakesAnIdANameOrAnIdPrefix) {
  cluster_.AddWorker("w0", 2);
  std::string only = Submit({"name=only-one", "world_size=1"});
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(only, 1, 1));
  std::string twin1 = Submit({"name=twin", "world_size=8"});
  std::string twin2 = Submit({"name=twin", "world_size=8"});
  CliRun r = Run({"status", "only-one"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job:        " + only + "\n"));
  r = Run({"describe", "only-one", "-o", "json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(only));
  r = Run({"logs", "only-one"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank0]: rank 0 trained 1 epochs\n");
  // The verbs that took only an id take a name too, and a unique id prefix.
  for (const char* verb : {"checkpoints", "metrics"}) {
    r = Run({verb, "only-one", "-o", "json"});
    EXPECT_EQ(r.code, 0) << verb << ": " << r.err;
  }
  const std::string prefix = only.substr(0, only.size() - 2);
  r = Run({"status", prefix});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Job:        " + only + "\n"));
  // Several matches: listed newest first, or the newest with --latest.
  r = Run({"status", "twin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err,
              HasSubstr("'twin' matches 2 jobs by name, newest first: " + twin2 + ", " + twin1));
  EXPECT_THAT(r.err, HasSubstr("give an id, or --latest for the newest"));
  r = Run({"cancel", "twin", "--latest"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job " + twin2 + " CANCELLED"));
  r = Run({"status", "nobody"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "trainctl status: no job 'nobody' (not an id, a job name or the start of an id)\n");
}

// --- errors from the coordinator -------------------------------------------------

TEST_F(CliTest, MetricsPrintsTheHistoryOfAnEndedJobAndDescribeSummarizesIt) {
  cluster_.AddWorker("w0", 1);
  cluster_.AddWorker("w1", 1);
  std::string id = Submit();
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 2));

  // Every stored point, after the job ended: 2 ranks x 2 epochs x (train, eval).
  CliRun r = Run({"metrics", id});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 9u) << r.out;
  EXPECT_THAT(
      lines[0],
      MatchesRegex("ATTEMPT +RANK +KIND +EPOCH +STEP +LOSS +LR +SAMPLES/S +DATA_MS +COMPUTE_MS "
                   "+COMM_MS +LOSS_SCALE +EVAL_LOSS +EVAL_ACC +TIME"));
  // Accuracy in percent, as status, describe and --follow print it (issue
  // #44 item 10: "0.9129" here, "91.29%" there); the CSV keeps the fraction.
  r = Run({"metrics", id, "--rank", "1", "--kind", "eval"});
  ASSERT_EQ(r.code, 0) << r.err;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(lines[1], MatchesRegex("1 +1 +eval +1 +10 +0.5 +- +- +- +- +- +- +0.25 +75.00% .*"))
      << r.out;
  EXPECT_THAT(lines[2], MatchesRegex("1 +1 +eval +2 +10 +0.25 +- +- +- +- +- +- +0.125 +85.00% .*"))
      << r.out;

  r = Run({"metrics", id, "--rank", "1", "--kind", "eval", "-o", "csv"});
  ASSERT_EQ(r.code, 0) << r.err;
  lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(
      lines[0],
      "attempt,rank,kind,epoch,step,loss,lr,samples_per_sec,data_ms,compute_ms,comm_ms,loss_scale,"
      "eval_loss,eval_accuracy,time");
  // The stand-in's epoch ends carry a loss and the eval, nothing else:
  // the cells of what they did not report are empty, not 0.
  EXPECT_THAT(lines[1], StartsWith("1,1,eval,1,10,0.5,,,,,,,0.25,0.7500,"));
  EXPECT_THAT(lines[2], StartsWith("1,1,eval,2,10,0.25,,,,,,,0.125,0.8500,"));

  r = Run({"metrics", id, "--kind", "train", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto resp = ParseJson<v1::GetMetricsResponse>(r.out);
  ASSERT_EQ(resp.batches_size(), 1);
  EXPECT_EQ(resp.batches(0).attempt(), 1);
  EXPECT_EQ(resp.batches(0).points_size(), 4);

  // The summary: best eval, rank 0's last loss, both ranks' mean throughput.
  r = Run({"describe", id});
  EXPECT_THAT(r.out, HasSubstr("Last eval:  epoch 2: loss 0.1250, accuracy 85.00%\n"));
  EXPECT_THAT(
      r.out,
      HasSubstr("Summary:     best eval accuracy 85.00% (epoch 2, loss 0.1250), last loss 0.2500, "
                "mean 2000 samples/s\n"));

  // Bad input names the field.
  r = Run({"metrics", id, "--kind", "loss"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--kind"));
  r = Run({"metrics", "no-such-job"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no-such-job"));
  r = Run({"status", id, "-o", "csv"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--output: csv is only for `trainctl metrics`"));
}

TEST_F(CliTest, RpcErrorsPrintTheCoordinatorsReasonAndExitOne) {
  CliRun r = Run({"status", "no-such-job"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(
      r.err,
      "trainctl status: no job 'no-such-job' (not an id, a job name or the start of an id)\n");
  EXPECT_EQ(r.out, "");

  std::string nowhere = Unreachable();
  r = RunTrainctl({"--coordinator", nowhere, "--timeout", "2", "list"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              StartsWith("trainctl list: cannot reach the coordinator at " + nowhere + ": "));
}

TEST_F(CliTest, CancelStopsAPendingJobAndRefusesAFinishedOne) {
  std::string pending = Submit();
  CliRun r = Run({"cancel", pending, "--reason", "wrong learning rate"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job " + pending + " CANCELLED: cancelled: wrong learning rate\n");

  r = Run({"cancel", pending});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "trainctl cancel: job " + pending + " already ended (CANCELLED)\n");

  cluster_.AddWorker("w0", 2);
  std::string done = Submit();
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(done, 1, 1));
  r = Run({"cancel", done, "-o", "json"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "trainctl cancel: job " + done + " already ended (SUCCEEDED)\n");
}

// --- checkpoints and resume ------------------------------------------------------

TEST_F(CliTest, CheckpointsListsRecordsAndResumeContinuesFromThem) {
  testing::FakeWorker& w = cluster_.AddWorker("w0", 2);
  std::string id = Submit();
  CliRun r = Run({"checkpoints", id});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job " + id + " has recorded no checkpoint\n");
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 2));
  // Rank 0's worker reports its final checkpoint (the coordinator records it).
  v1::WorkerMessage m;
  v1::CheckpointReport* rep = m.mutable_checkpoint();
  rep->set_job_id(id);
  rep->set_attempt(1);
  rep->set_rank(0);
  rep->mutable_record()->set_epochs_done(2);
  rep->mutable_record()->set_global_step(20);
  rep->mutable_record()->set_size_bytes(3000);
  rep->mutable_record()->set_checksum("crc32:12345678");
  rep->mutable_record()->set_path("/work/jobs/" + id + "/checkpoints/" + id +
                                  ".ckpt-epoch-000002.pt");
  ASSERT_TRUE(w.Send(m));
  for (int i = 0; i < 200; ++i) {
    r = Run({"checkpoints", id});
    if (r.out.find("crc32:12345678") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_THAT(lines[0], StartsWith("EPOCHS  STEP  JOB"));
  EXPECT_THAT(lines[1],
              AllOf(HasSubstr(" 20 "), HasSubstr(id), HasSubstr(" w0 "), HasSubstr("2.9 KiB"),
                    HasSubstr("crc32:12345678"), HasSubstr(".ckpt-epoch-000002.pt")));

  r = Run({"status", id});
  EXPECT_THAT(r.out, HasSubstr("epoch 2, step 20 on w0"));

  // The checkpoint already finished 2 epochs: resuming to 2 is refused.
  r = Run({"resume", id});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("training.epochs: 2, but job " + id +
                               "'s checkpoint already completed 2 epoch(s)"));
  // Another model cannot load it.
  r = Run({"resume", id, "--set", "training.epochs=4", "--set", "model.hidden=[8]"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("model: differs from job " + id));
  // More epochs: a new job that starts from the record.
  r = Run({"resume", id, "--set", "training.epochs=4", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  v1::Job next = ParseJson<v1::Job>(r.out);
  EXPECT_NE(next.id(), id);
  EXPECT_EQ(next.spec().resume_from().job(), id);
  EXPECT_EQ(next.spec().training().epochs(), 4);
  ASSERT_EQ(next.checkpoints_size(), 1);
  EXPECT_EQ(next.checkpoints(0).job_id(), id);
  EXPECT_EQ(next.checkpoints(0).global_step(), 20);
  auto start = w.WaitFor([&](const v1::CoordinatorMessage& c) {
    return c.has_start_ranks() && c.start_ranks().job_id() == next.id();
  });
  ASSERT_TRUE(start.has_value());
  EXPECT_EQ(start->start_ranks().resume().path(),
            "/work/jobs/" + id + "/checkpoints/" + id + ".ckpt-epoch-000002.pt");
  EXPECT_EQ(start->start_ranks().resume().checksum(), "crc32:12345678");
}

}  // namespace
}  // namespace trainctl

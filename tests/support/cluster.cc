#include "tests/support/cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/subprocess.h"
#include "common/temp_dir.h"

namespace trainctl::testing {

std::string BuildDirOfThisTest() {
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string exe(self, n > 0 ? static_cast<size_t>(n) : 0);
  if (const char* b = std::getenv("TRAINCTL_BINARY_DIR")) return b;
  std::string dir = exe.substr(0, exe.rfind('/'));
  return dir.substr(0, dir.rfind('/'));
}

Process::Process(std::vector<std::string> argv, std::string log_path, std::string cwd)
    : argv_(std::move(argv)), log_path_(std::move(log_path)), cwd_(std::move(cwd)) {}

Process::~Process() = default;  // The Subprocess kills and reaps a running child.

bool Process::Start() {
  const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  SpawnOptions o;
  o.argv = argv_;
  o.work_dir = cwd_;
  o.fds = {{1, fd}, {2, fd}};
  // A test that dies takes its cluster with it.
  o.parent_death_signal = SIGKILL;
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  close(fd);
  if (!p.ok()) return false;
  process_ = std::move(*p);
  return true;
}

void Process::Kill(int sig) { process_.Signal(sig); }

int Process::Wait(absl::Duration timeout) {
  if (!process_.running()) return 0;
  std::optional<ExitStatus> st = process_.WaitFor(timeout);
  return st ? st->raw : -1;
}

bool Process::running() { return process_.running() && !process_.Poll().has_value(); }

std::string Process::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Cluster::Cluster(std::string build_dir, std::string rank_binary)
    : build_dir_(std::move(build_dir)), rank_binary_(std::move(rank_binary)) {
  dir_ = MakeTempDir("trainctl_cluster");
}

Cluster::~Cluster() {
  for (auto& [name, w] : workers_) {
    w->Kill(SIGTERM);
    if (w->Wait(absl::Seconds(10)) < 0) w->Kill(SIGKILL);
  }
  workers_.clear();
  if (coordinator_) {
    coordinator_->Kill(SIGTERM);
    if (coordinator_->Wait(absl::Seconds(5)) < 0) coordinator_->Kill(SIGKILL);
  }
  coordinator_.reset();
  if (std::getenv("TRAINCTL_KEEP_TEST_DIRS") == nullptr) {
    std::string cmd = "rm -rf " + dir_;
    (void)std::system(cmd.c_str());
  }
}

bool Cluster::StartCoordinator(std::vector<std::string> extra) {
  std::string listen = address_.empty() ? "127.0.0.1:0" : address_;
  std::vector<std::string> argv{build_dir_ + "/coordinator/trainctl-coordinator",
                                "--listen=" + listen,
                                "--heartbeat_interval_ms=200",
                                "--lease_timeout_ms=1500",
                                "--stop_grace_s=2",
                                "--admin_token_file=" + dir_ + "/admin.token"};
  // A test's own --store (or --db) replaces the cluster's SQLite file.
  if (std::none_of(extra.begin(), extra.end(), [](const std::string& f) {
        return f.rfind("--store=", 0) == 0 || f.rfind("--db=", 0) == 0;
      })) {
    argv.push_back("--db=" + dir_ + "/state.db");
  }
  if (!tls_dir_.empty()) argv.push_back("--tls_dir=" + tls_dir_);
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.begin(), prefix_.begin(), prefix_.end());
  std::string log = absl::StrCat(dir_, "/coordinator-", restarts_++, ".log");
  coordinator_ = std::make_unique<Process>(argv, log);
  if (!coordinator_->Start()) return false;
  absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline) {
    std::string out = coordinator_->ReadLog();
    size_t pos = out.find("listening on ");
    if (pos != std::string::npos && out.find('\n', pos) != std::string::npos) {
      std::string line = out.substr(pos + 13, out.find('\n', pos) - pos - 13);
      address_ = line;
      absl::StatusOr<std::string> admin = auth::ReadTokenFile(dir_ + "/admin.token");
      if (!admin.ok()) return false;
      admin_token_ = *admin;
      Connect();
      return true;
    }
    if (!coordinator_->running()) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

bool Cluster::InitTls() {
  std::string cmd = absl::StrCat(build_dir_, "/coordinator/trainctl-coordinator init --dir=", dir_,
                                 "/tls --db=", dir_, "/state.db > ", dir_, "/init.log 2>&1");
  if (std::system(cmd.c_str()) != 0) return false;
  tls_dir_ = dir_ + "/tls";
  return true;
}

void Cluster::UseCoordinatorAt(const std::string& address) {
  address_ = address;
  Connect();
}

void Cluster::Connect() {
  auth::ChannelSecurity security;
  security.token = admin_token_;
  security.ca_file = ca_file();
  auto channel = *auth::MakeChannel(address_, security, grpc::ChannelArguments());
  jobs_ = v1::JobService::NewStub(channel);
  workers_stub_ = v1::WorkerService::NewStub(channel);
  auth_stub_ = v1::AuthService::NewStub(channel);
}

std::string Cluster::CreateToken(v1::Role role, const std::string& name, int64_t ttl_s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CreateTokenRequest req;
  req.set_role(role);
  req.set_name(name);
  req.mutable_ttl()->set_seconds(ttl_s);
  v1::CreateTokenResponse resp;
  return auth_stub_->CreateToken(&ctx, req, &resp).ok() ? resp.secret() : "";
}

void Cluster::KillCoordinator(int sig) {
  coordinator_->Kill(sig);
  coordinator_->Wait(absl::Seconds(10));
}

bool Cluster::StartWorker(const std::string& name, int slots, bool relative_paths,
                          const std::vector<std::string>& extra_flags) {
  std::string rank_binary = rank_binary_;
  if (relative_paths) {
    // ../../<absolute path>: relative to dir_, resolves to the same file.
    std::string up;
    for (char c : dir_) up += c == '/' ? "../" : "";
    rank_binary = up + rank_binary_.substr(1);
  }
  std::vector<std::string> argv{
      build_dir_ + "/worker/daemon/trainctl-worker",
      "--coordinator=" + address_,
      absl::StrCat("--slots=", slots),
      relative_paths ? "--work_dir=worker-" + name : "--work_dir=" + dir_ + "/worker-" + name,
      "--address=127.0.0.1",
      "--rank_binary=" + rank_binary,
      "--rank_timeout_s=20",
      "--stop_grace_s=2"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  // Each worker has its own worker token (its id is bound to it), unless
  // the test passes its own --token_file.
  bool own_token = false;
  for (const std::string& f : extra_flags) {
    own_token |= f.rfind("--token_file=", 0) == 0 || f.rfind("--join_token", 0) == 0 ||
                 f.rfind("--cert=", 0) == 0;
  }
  if (!own_token) {
    if (!auth::ReadTokenFile(WorkerTokenFile(name)).ok()) {
      std::string token = CreateToken(v1::ROLE_WORKER, "worker-" + name);
      if (token.empty() || !auth::WritePrivateFile(WorkerTokenFile(name), token + "\n").ok())
        return false;
    }
    argv.push_back("--token_file=" + WorkerTokenFile(name));
  }
  if (!tls_dir_.empty()) argv.push_back("--ca=" + ca_file());
  argv.insert(argv.begin(), prefix_.begin(), prefix_.end());
  auto p = std::make_unique<Process>(argv, dir_ + "/worker-" + name + ".log",
                                     relative_paths ? dir_ : std::string());
  if (!p->Start()) return false;
  workers_[name] = std::move(p);
  return true;
}

void Cluster::KillWorker(const std::string& name, int sig) {
  workers_[name]->Kill(sig);
  workers_[name]->Wait(absl::Seconds(10));
}

bool Cluster::WaitWorkers(int n, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListWorkersResponse resp;
    if (workers_stub_->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok() &&
        resp.workers_size() >= n) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

grpc::Status Cluster::TrySubmit(const v1::JobSpec& spec, std::string* id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  grpc::Status s = jobs_->SubmitJob(&ctx, req, &resp);
  if (s.ok() && id != nullptr) *id = resp.job().id();
  return s;
}

grpc::Status Cluster::SubmitAs(const std::string& token, const v1::JobSpec& spec, std::string* id) {
  auth::ChannelSecurity security;
  security.token = token;
  security.ca_file = ca_file();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      auth::MakeChannel(address_, security, grpc::ChannelArguments());
  if (!channel.ok())
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(channel.status().message()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  grpc::Status s = v1::JobService::NewStub(*channel)->SubmitJob(&ctx, req, &resp);
  if (s.ok() && id != nullptr) *id = resp.job().id();
  return s;
}

std::string Cluster::Submit(const v1::JobSpec& spec) {
  std::string id;
  const grpc::Status s = TrySubmit(spec, &id);
  if (!s.ok())
    std::cerr << "Cluster::Submit(" << spec.name() << ") refused: " << s.error_message() << "\n";
  return s.ok() ? id : "";
}

v1::Job Cluster::Get(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::Job job;
  (void)jobs_->GetJob(&ctx, req, &job);
  return job;
}

v1::Job Cluster::WaitFor(const std::string& id, const std::function<bool(const v1::Job&)>& done,
                         absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  v1::Job j;
  while (absl::Now() < deadline) {
    j = Get(id);
    if (done(j)) return j;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return j;
}

std::string Cluster::RankLog(const std::string& id, int attempt, int rank) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetLogsRequest req;
  req.set_job_id(id);
  req.set_attempt(attempt);
  req.set_rank(rank);
  auto logs = jobs_->GetLogs(&ctx, req);
  std::string all;
  v1::LogChunk c;
  while (logs->Read(&c)) {
    for (const auto& l : c.lines()) all += l.text() + "\n";
  }
  return all;
}

std::vector<v1::Event> Cluster::Events(const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::WatchJobRequest req;
  req.set_job_id(id);
  req.set_include_history(true);
  auto reader = jobs_->WatchJob(&ctx, req);
  std::vector<v1::Event> out;
  v1::JobUpdate u;
  while (reader->Read(&u)) {
    if (u.has_event()) out.push_back(u.event());
    if (u.has_job()) break;
  }
  ctx.TryCancel();
  return out;
}

grpc::Status Cluster::Follow(const std::string& id, absl::Duration timeout,
                             const std::function<void(const v1::JobUpdate&)>& on_update) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::WatchJobRequest req;
  req.set_job_id(id);
  req.set_include_history(true);
  auto reader = jobs_->WatchJob(&ctx, req);
  v1::JobUpdate u;
  while (reader->Read(&u)) on_update(u);
  return reader->Finish();
}

v1::Job Cluster::WaitState(const std::string& id, v1::JobState want, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (absl::Now() < deadline) {
    job = Get(id);
    if (job.state() == want) return job;
    bool terminal = job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
                    job.state() == v1::JOB_STATE_CANCELLED || job.state() == v1::JOB_STATE_TIMEOUT;
    if (terminal) return job;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return job;
}

namespace {

// A /proc file's contents, or "" when the process is gone (reading a file of
// a process that exits meanwhile fails with ESRCH; std::ifstream turned that
// into an exception that failed a test now and then).
std::string ReadProcFile(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace

std::vector<pid_t> Cluster::ProcessesMatching(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::string cmd = ReadProcFile(absl::StrCat("/proc/", pid, "/cmdline"));
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    std::string stat = ReadProcFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    bool zombie = paren != std::string::npos && stat.size() > paren + 2 && stat[paren + 2] == 'Z';
    // Or its working directory: an engine rank gets its config as an
    // inherited fd (no path on its command line) and runs in
    // <work dir>/jobs/<job>/attempt-N/rank-R.
    char cwd[4096];
    const ssize_t n = readlink(absl::StrCat("/proc/", pid, "/cwd").c_str(), cwd, sizeof(cwd) - 1);
    const std::string dir = n > 0 ? std::string(cwd, static_cast<size_t>(n)) + "/" : "";
    if (!zombie && (absl::StrContains(cmd, needle) || absl::StrContains(dir, needle)))
      out.push_back(pid);
  }
  closedir(d);
  return out;
}

}  // namespace trainctl::testing

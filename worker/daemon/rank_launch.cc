// Starting an attempt's ranks on this host: the attempt's record (its
// identity and paths from the RankWorkspace), the one rendezvous flow (rank
// 0's daemon makes it with the attempt's RendezvousBackend and reports it,
// the others wait for the coordinator's delivery), and each rank's launch: an engine rank with
// its config file, a command rank (docs/command-jobs.md) with torchrun's
// environment. With --rank-user every rank runs as that user, in
// directories the RankWorkspace lays out as rank_files.h says, with its
// config handed over as an open fd.
//
// Threading: every function here runs on the daemon's EventLoop.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/random_secret.h"
#include "worker/daemon/oom_events.h"
#include "worker/daemon/path_policy.h"
#include "worker/daemon/preflight.h"
#include "worker/daemon/rank_files.h"
#include "worker/daemon/rank_table_internal.h"

namespace trainctl::worker {

namespace fs = std::filesystem;
namespace rk = rankproto::run_keys;

namespace {

// The fd an engine rank reads its config from (--config-fd).
constexpr int kConfigFd = 4;

// argv[0] as a shell finds it: through PATH without a '/', else against the
// working directory `dir`.
std::string ResolveProgram(const std::string& program, const std::string& dir) {
  if (program.find('/') == std::string::npos) {
    std::error_code ec;
    const char* path = std::getenv("PATH");
    for (absl::string_view d : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
      std::string candidate = absl::StrCat(d.empty() ? "." : d, "/", program);
      if (access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec))
        return candidate;
    }
    return program;
  }
  if (program[0] != '/') return (fs::path(dir) / program).lexically_normal().string();
  return program;
}

// The variables of CommandEnvironment an engine rank gets too.
bool EngineVariable(const std::string& entry) {
  static const char* const kNames[] = {
      "RANK",        "LOCAL_RANK",  "WORLD_SIZE",      "LOCAL_WORLD_SIZE", "GROUP_RANK",
      "MASTER_ADDR", "MASTER_PORT", "TRAINCTL_JOB_ID", "TRAINCTL_ATTEMPT"};
  const std::string name = entry.substr(0, entry.find('='));
  return std::any_of(std::begin(kNames), std::end(kNames),
                     [&](const char* n) { return name == n; });
}

}  // namespace

std::vector<std::string> CommandEnvironment(const std::string& job_id, int32_t attempt,
                                            const v1::RankAssignment& ra, int32_t max_restarts,
                                            const std::string& master_addr,
                                            const std::string& master_port,
                                            const std::string& checkpoint_dir) {
  return {absl::StrCat("RANK=", ra.rank()),
          absl::StrCat("LOCAL_RANK=", ra.local_rank()),
          absl::StrCat("WORLD_SIZE=", ra.world_size()),
          absl::StrCat("LOCAL_WORLD_SIZE=", ra.local_world_size()),
          absl::StrCat("GROUP_RANK=", ra.node_rank()),
          absl::StrCat("GROUP_WORLD_SIZE=", std::max(1, ra.num_nodes())),
          absl::StrCat("ROLE_RANK=", ra.rank()),
          absl::StrCat("ROLE_WORLD_SIZE=", ra.world_size()),
          "ROLE_NAME=default",
          absl::StrCat("MASTER_ADDR=", master_addr),
          absl::StrCat("MASTER_PORT=", master_port),
          absl::StrCat("TORCHELASTIC_RESTART_COUNT=", std::max(0, attempt - 1)),
          absl::StrCat("TORCHELASTIC_MAX_RESTARTS=", max_restarts),
          absl::StrCat("TORCHELASTIC_RUN_ID=", job_id),
          absl::StrCat("TRAINCTL_JOB_ID=", job_id),
          absl::StrCat("TRAINCTL_ATTEMPT=", attempt),
          absl::StrCat("TRAINCTL_CHECKPOINT_DIR=", checkpoint_dir),
          "TRAINCTL_STATUS_FD=3"};
}

namespace {
// Where deploy/install.sh (prefix /usr) puts the rank start-up hook.
constexpr char kInstalledRankBootDir[] = "/usr/lib/python3/dist-packages/trainctl/_rank_boot";
}  // namespace

std::string RankBootDir(const std::string& python_dir) {
  return (fs::path(python_dir) / "trainctl" / "_rank_boot").string();
}

std::string DefaultPythonDir() {
#ifdef TRAINCTL_SOURCE_PYTHON_DIR
  std::error_code ec;
  if (fs::exists(fs::path(TRAINCTL_SOURCE_PYTHON_DIR) / "trainctl" / "__init__.py", ec)) {
    return TRAINCTL_SOURCE_PYTHON_DIR;
  }
#endif
  return "";
}

void RankTable::OnPreflight(const v1::Preflight& p) {
  PreflightContext ctx;
  ctx.job_id = p.job_id();
  ctx.owner = p.owner();
  ctx.resume_owner = p.resume_owner();
  ctx.base_dir = workspace_.paths().base_dir;
  ctx.work_dir = options_.work_dir;
  ctx.data_roots = workspace_.paths().data_read_roots;
  ctx.data_roots_name = workspace_.paths().data_roots_name;
  ctx.command_dir_roots = options_.data_roots;
  ctx.checkpoint_roots = options_.checkpoint_roots;
  ctx.allow_commands = options_.allow_commands;
  ctx.manifest_writers = workspace_.ManifestWritersHere();
  ctx.checkpoint_bytes = p.has_resume() ? p.resume().size_bytes() : 0;
  for (const v1::RankAssignment& r : p.ranks()) {
    if (r.slot().kind() == v1::Slot::KIND_GPU) ctx.gpu_indices.push_back(r.slot().index());
  }
  std::vector<std::string> problems;
  int space_problems = 0;
  absl::StatusOr<std::optional<RunAs>> as = workspace_.JobIdentity(p.owner_number());
  if (!as.ok()) {
    problems.push_back(std::string(as.status().message()));
  } else if (absl::Status dirs = workspace_.MakeJobDirs(p.job_id(), p.spec(), *as); !dirs.ok()) {
    problems.push_back(std::string(dirs.message()));
  } else {
    // The checks touch the job's files as its ranks will: a file only root
    // could read, or a checkpoint.dir only root could create, is refused
    // here (and root creates nothing there for the job).
    AsRankUser as_rank_user(*as);
    ctx.as_rank_user = as->has_value();
    if (as_rank_user.ok()) {
      problems = PreflightProblems(p.spec(), ctx, &space_problems);
    } else {
      problems.push_back("cannot take on the ranks' identity for the checks");
    }
  }
  LogEvent(problems.empty() ? LogLevel::kInfo : LogLevel::kWarn, "worker", "preflight",
           {{"job_id", p.job_id()},
            {"attempt", absl::StrCat(p.attempt())},
            {"problems", absl::StrJoin(problems, "; ").substr(0, 500)}});
  v1::WorkerMessage m;
  v1::PreflightReport* rep = m.mutable_preflight();
  rep->set_job_id(p.job_id());
  rep->set_attempt(p.attempt());
  rep->set_waiting_for_space(!problems.empty() &&
                             space_problems == static_cast<int>(problems.size()));
  for (std::string& line : problems) rep->add_problems(std::move(line));
  out_.Send(m, /*critical=*/true);
}

void RankTable::OnStartRanks(const v1::StartRanks& s) {
  const std::string akey = AttemptKey(s.job_id(), s.attempt());
  if (attempts_.count(akey) > 0) return;  // A re-send after a reconnect.
  std::unique_ptr<LocalAttempt> a = NewAttempt(s);
  LocalAttempt& at = *a;
  attempts_[akey] = std::move(a);
  if (at.command && at.spec.command().has_code() && at.paths.error.empty()) {
    // Nothing starts before the code is here: OnCodeReady goes on (at once
    // when this host has the archive already).
    at.code_pending = true;
    code_->Want(at.job_id, at.spec.command().code().digest(),
                [this, akey](const absl::StatusOr<std::string>& archive)
                    ABSL_NO_THREAD_SAFETY_ANALYSIS {
                      // The cache calls back on the loop.
                      OnCodeReady(akey, archive);
                    });
    return;
  }
  if (at.produce_rendezvous) ProduceRendezvous(at);
  // Otherwise the ranks wait for the delivery (OnRendezvous).
}

void RankTable::OnCodeReady(const std::string& attempt_key,
                            const absl::StatusOr<std::string>& archive) {
  auto it = attempts_.find(attempt_key);
  if (it == attempts_.end() || !it->second->code_pending) return;  // Stopped meanwhile.
  LocalAttempt& a = *it->second;
  a.code_pending = false;
  absl::Status ready = archive.status();
  if (archive.ok()) {
    absl::StatusOr<std::string> dir =
        workspace_.UnpackCode(a.job_id, a.number, a.spec, a.run_as, *archive);
    ready = dir.status();
    if (dir.ok()) a.paths.command_dir = *std::move(dir);
  }
  bool waiting = false;
  for (auto& [rank, r] : a.ranks) waiting = waiting || r.state.waiting();
  if (!waiting) return;
  if (!ready.ok()) {
    // A bad archive (or working_dir) would only fail again; a fetch that
    // failed may work on a retry.
    const v1::FailureKind kind = archive.ok() ? v1::FAILURE_KIND_CONFIG : v1::FAILURE_KIND_LAUNCH;
    for (auto& [rank, r] : a.ranks) {
      if (r.state.waiting()) ReportLaunchFailure(a, r, std::string(ready.message()), kind);
    }
    MaybeForget(attempt_key);
    return;
  }
  if (a.produce_rendezvous) {
    ProduceRendezvous(a);
  } else if (a.rendezvous.has_value()) {
    LaunchPending(a);
  }
}

std::unique_ptr<RankTable::LocalAttempt> RankTable::NewAttempt(const v1::StartRanks& s) {
  auto a = std::make_unique<LocalAttempt>();
  a->job_id = s.job_id();
  a->number = s.attempt();
  a->spec = s.spec();
  a->produce_rendezvous = s.produce_rendezvous();
  if (s.has_resume()) a->resume = s.resume();
  a->spec_hash = s.spec_hash();
  a->skip_steps = absl::StrJoin(s.skip_steps(), ",");
  a->command = s.spec().has_command();
  AttemptClaim claim{s.job_id(), s.owner(), s.resume_owner(),
                     workspace_.JobIdentity(s.owner_number())};
  if (claim.run_as.ok()) a->run_as = *claim.run_as;  // Else the refusal is in paths.error.
  // A coordinator that sends none (older than this daemon, or a test's
  // stand-in) still gets a store no stranger can use: a secret made here
  // works where every rank of the attempt runs on this worker.
  a->store_secret = s.rendezvous_secret().empty() ? NewSecretHex() : s.rendezvous_secret();
  a->paths = workspace_.ResolvePaths(a->spec, claim);
  const std::string akey = AttemptKey(s.job_id(), s.attempt());
  for (const v1::RankAssignment& ra : s.ranks()) {
    LocalRank& r = a->ranks[ra.rank()];
    r.assignment = ra;
    r.key = absl::StrCat(akey, "/", ra.rank());
    a->gpu = ra.slot().kind() == v1::Slot::KIND_GPU;
  }
  a->rendezvous_backend = MakeRendezvousBackend(a->gpu, a->command);
  return a;
}

void RankTable::ProduceRendezvous(LocalAttempt& a) {
  auto zero = a.ranks.find(0);
  if (zero == a.ranks.end()) return;
  absl::StatusOr<std::optional<v1::RendezvousInfo>> made =
      a.rendezvous_backend->Produce(options_.address);
  if (!made.ok()) {
    for (auto& [rank, r] : a.ranks) ReportLaunchFailure(a, r, std::string(made.status().message()));
    MaybeForget(AttemptKey(a.job_id, a.number));
    return;
  }
  if (!made->has_value()) {
    Launch(a, zero->second);  // Rank 0 picks a port and reports it.
    return;
  }
  // Known before any rank runs: report it and start every local rank at once
  // (each spends ~0.5 s loading LibTorch; rank 0 first and the others after
  // it reported would take that twice).
  ReportRendezvous(a, **made);
  a.rendezvous = *std::move(*made);
  LaunchPending(a);
}

void RankTable::ReportRendezvous(const LocalAttempt& a, const v1::RendezvousInfo& info) {
  v1::WorkerMessage m;
  v1::RendezvousReport* rep = m.mutable_rendezvous();
  rep->set_job_id(a.job_id);
  rep->set_attempt(a.number);
  *rep->mutable_info() = info;
  out_.Send(m, true);
}

void RankTable::OnRendezvous(const v1::RendezvousDelivery& d) {
  auto it = attempts_.find(AttemptKey(d.job_id(), d.attempt()));
  if (it == attempts_.end()) return;
  it->second->rendezvous = d.info();
  if (!it->second->code_pending) LaunchPending(*it->second);  // Else OnCodeReady does.
}

void RankTable::LaunchPending(LocalAttempt& a) {
  for (auto& [rank, r] : a.ranks) {
    if (r.state.waiting()) Launch(a, r);
  }
}

void RankTable::Launch(LocalAttempt& a, LocalRank& r) {
  const v1::RankAssignment& ra = r.assignment;
  if (!a.paths.error.empty()) {
    ReportLaunchFailure(a, r, a.paths.error, v1::FAILURE_KIND_CONFIG);
    return;
  }
  if (a.command) {
    LaunchCommand(a, r);
    return;
  }
  // A checkpoint.dir the job chose is the writer rank's to create (and check).
  absl::StatusOr<std::string> dir =
      workspace_.MakeRankDirs(a.job_id, a.number, a.spec, a.run_as, ra.rank());
  if (!dir.ok()) {
    ReportLaunchFailure(a, r, absl::StrCat("rank directory: ", dir.status().message()));
    return;
  }
  absl::StatusOr<rankproto::FlatConfig> cfg = RankConfig(a, ra, *dir);
  if (!cfg.ok()) {
    ReportLaunchFailure(a, r, std::string(cfg.status().message()), v1::FAILURE_KIND_CONFIG);
    return;
  }
  // Beside the rank's directory, in the attempt's (the daemon's): the rank
  // gets it as an open fd and has no permission on the file, so no rank
  // reads another's store secret.
  const std::string config_path = workspace_.RankConfigFile(a.job_id, a.number, ra.rank());
  if (absl::Status s = rankproto::WriteConfigFile(config_path, *cfg); !s.ok()) {
    ReportLaunchFailure(a, r, std::string(s.message()));
    return;
  }
  const int config_fd = ::open(config_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (config_fd < 0) {
    ReportLaunchFailure(a, r,
                        absl::StrCat("cannot open ", config_path, ": ", std::strerror(errno)));
    return;
  }
  RankLaunch l;
  l.key = r.key;
  l.binary = options_.rank_binary;
  l.args = options_.rank_binary_args;
  l.args.push_back("--config-fd");
  l.args.push_back(absl::StrCat(kConfigFd));
  l.extra_fds = {{kConfigFd, config_fd}};
  l.run_as = a.run_as;
  l.work_dir = *dir;
  const auto [master_addr, master_port] = MasterEndpoint(a.rendezvous, options_.address);
  for (std::string& v : CommandEnvironment(a.job_id, a.number, ra, a.spec.restart().max_restarts(),
                                           master_addr, master_port, a.paths.checkpoint_dir)) {
    if (EngineVariable(v)) l.env.push_back(std::move(v));
  }
  if (a.gpu) l.env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", ra.slot().index()));
  StartProcess(a, r, l, "cannot start the rank process");
  ::close(config_fd);
}

absl::StatusOr<rankproto::FlatConfig> RankTable::RankConfig(const LocalAttempt& a,
                                                            const v1::RankAssignment& ra,
                                                            const std::string& dir) {
  rankproto::FlatConfig cfg = JobSpecToFlat(a.spec);
  cfg[rk::kJobId] = a.job_id;
  cfg[rk::kAttempt] = absl::StrCat(a.number);
  cfg[rk::kRank] = absl::StrCat(ra.rank());
  cfg[rk::kLocalRank] = absl::StrCat(ra.local_rank());
  cfg[rk::kWorldSize] = absl::StrCat(ra.world_size());
  cfg[rk::kLocalWorldSize] = absl::StrCat(ra.local_world_size());
  cfg[rk::kNodeRank] = absl::StrCat(ra.node_rank());
  cfg[rk::kDevice] = a.gpu ? "cuda" : "cpu";
  cfg[rk::kCudaDevice] = a.gpu ? "0" : "";
  cfg[rk::kBackend] = a.gpu ? "nccl" : "gloo";
  if (!a.gpu) cfg[rk::kStoreSecret] = a.store_secret;
  cfg[rk::kWorkDir] = dir;
  cfg[rk::kPreemptFile] = workspace_.PreemptFile(a.job_id, a.number, ra.rank());
  if (absl::Status paths =
          ResolveDataPaths(cfg, workspace_.paths().base_dir, workspace_.paths().data_read_roots,
                           workspace_.paths().data_roots_name);
      !paths.ok())
    return paths;
  cfg[rk::kCheckpointDir] = a.paths.checkpoint_dir;
  if (!a.paths.tensorboard_dir.empty()) cfg[rk::kTensorBoardDir] = a.paths.tensorboard_dir;
  // One writer per host (its first rank), or only rank 0 on a shared dir.
  const bool writer = a.spec.checkpoint().shared() ? ra.rank() == 0 : ra.local_rank() == 0;
  cfg[rk::kCheckpointWriter] = writer ? "true" : "false";
  // Per-host copies carry this worker's id in their names: hosts that share
  // one directory never write one path. The coordinator alone decides which
  // checkpoints go (DropCheckpoints): a rank of a stale attempt deletes none.
  if (!a.spec.checkpoint().shared())
    cfg[rk::kCheckpointWriterTag] = CheckpointWriterTag(out_.worker_id());
  cfg[rk::kCheckpointPrune] = "false";
  cfg[rk::kSpecHash] = a.spec_hash;
  if (!a.skip_steps.empty()) cfg[rk::kSkipSteps] = a.skip_steps;
  if (a.resume.has_value()) {
    cfg[rk::kResumeFrom] = a.resume->path();
    cfg[rk::kResumeChecksum] = a.resume->checksum();
    cfg[rk::kResumeJobId] = a.resume->job_id();
  }
  cfg[rk::kStatusFd] = "3";
  cfg[rk::kTimeoutSeconds] = absl::StrCat(options_.rank_timeout_s);
  cfg[rk::kAdvertiseHost] = options_.address;
  a.rendezvous_backend->ConfigureRank(a.rendezvous, ra.rank() == 0 && a.produce_rendezvous, cfg);
  return cfg;
}

void RankTable::LaunchCommand(LocalAttempt& a, LocalRank& r) {
  const v1::RankAssignment& ra = r.assignment;
  const v1::CommandSpec& cmd = a.spec.command();
  absl::StatusOr<std::string> scratch =
      workspace_.MakeRankDirs(a.job_id, a.number, a.spec, a.run_as, ra.rank());
  if (!scratch.ok()) {
    ReportLaunchFailure(a, r, absl::StrCat("rank directory: ", scratch.status().message()));
    return;
  }
  std::string dir = a.paths.command_dir.empty() ? *scratch : a.paths.command_dir;

  RankLaunch l;
  l.key = r.key;
  l.work_dir = dir;
  l.run_as = a.run_as;
  l.binary = ResolveProgram(cmd.argv(0), dir);
  l.args.assign(cmd.argv().begin() + 1, cmd.argv().end());
  if (cmd.local_rank() == v1::LOCAL_RANK_MODE_ARG || cmd.local_rank() == v1::LOCAL_RANK_MODE_BOTH) {
    l.args.push_back(absl::StrCat(
        cmd.arg_style() == v1::LOCAL_RANK_ARG_STYLE_DASH ? "--local-rank=" : "--local_rank=",
        ra.local_rank()));
  }
  l.env = CommandLaunchEnvironment(a, ra);
  // As torchrun: where torch.distributed.elastic's @record writes the
  // exception that ends the rank (read by DescribeFailure).
  r.program = l.binary;
  r.error_file = absl::StrCat(*scratch, "/error.json");
  l.env.push_back(absl::StrCat("TORCHELASTIC_ERROR_FILE=", r.error_file));
  if (!StartProcess(a, r, l, absl::StrCat("cannot start ", cmd.argv(0)))) return;
  // The program need not speak the rank protocol: started is ready.
  r.state.Apply(RankEvent::kReady);
  ReportStatus(a, r);
}

std::vector<std::string> RankTable::CommandLaunchEnvironment(const LocalAttempt& a,
                                                             const v1::RankAssignment& ra) {
  const v1::CommandSpec& cmd = a.spec.command();
  std::vector<std::string> env;
  for (const auto& [k, v] : cmd.env()) {
    if (k != "PYTHONPATH")
      env.push_back(absl::StrCat(k, "=", v));  // PYTHONPATH: below, after the hook
  }
  // torchrun's rule: one thread per rank when several share the host,
  // unless the job (or the daemon's environment) says otherwise.
  if (ra.local_world_size() > 1 && cmd.env().count("OMP_NUM_THREADS") == 0 &&
      std::getenv("OMP_NUM_THREADS") == nullptr) {
    env.push_back("OMP_NUM_THREADS=1");
  }
  const auto [master_addr, master_port] = MasterEndpoint(a.rendezvous, options_.address);
  std::vector<std::string> contract =
      CommandEnvironment(a.job_id, a.number, ra, a.spec.restart().max_restarts(), master_addr,
                         master_port, a.paths.checkpoint_dir);
  env.insert(env.end(), contract.begin(), contract.end());
  // trainctl.should_checkpoint() (python/trainctl) looks for it.
  env.push_back(absl::StrCat("TRAINCTL_PREEMPT_FILE=",
                             workspace_.PreemptFile(a.job_id, a.number, ra.rank())));
  // trainctl.load_checkpoint(): the record this attempt continues from,
  // where this host has the file (its own copy, or a shared directory; the
  // coordinator puts rank 0 on the holder).
  if (a.resume.has_value() && (a.resume->shared() || a.resume->worker_id() == out_.worker_id())) {
    env.push_back(absl::StrCat("TRAINCTL_RESUME_FROM=", a.resume->path()));
    env.push_back(absl::StrCat("TRAINCTL_RESUME_EPOCH=", a.resume->epochs_done()));
    env.push_back(absl::StrCat("TRAINCTL_RESUME_STEP=", a.resume->global_step()));
  }
  if (a.gpu) {
    // Every local rank's GPU, in local-rank order: LOCAL_RANK indexes the
    // visible devices, as under torchrun (torch.cuda.set_device(local_rank)).
    std::vector<std::pair<int32_t, int32_t>> local;
    for (const auto& [rank, other] : a.ranks) {
      local.emplace_back(other.assignment.local_rank(), other.assignment.slot().index());
    }
    std::sort(local.begin(), local.end());
    std::vector<std::string> devices;
    for (const auto& [lr, index] : local) devices.push_back(absl::StrCat(index));
    env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", absl::StrJoin(devices, ",")));
  }
  if (!options_.python_dir.empty()) {
    // First the rank start-up hook (its sitecustomize registers faulthandler
    // for the hang's stack dump and sends the heartbeat script_watch.h
    // judges; docs/failures.md#hangs), then the job's own PYTHONPATH, or
    // else the trainctl module and the daemon's.
    std::string rest;
    if (auto it = cmd.env().find("PYTHONPATH"); it != cmd.env().end()) {
      rest = it->second;
    } else {
      const char* existing = std::getenv("PYTHONPATH");
      rest = absl::StrCat(options_.python_dir,
                          existing != nullptr && *existing != 0 ? absl::StrCat(":", existing) : "");
    }
    env.push_back(absl::StrCat("PYTHONPATH=", RankBootDir(options_.python_dir),
                               rest.empty() ? "" : ":", rest));
  } else if (std::error_code ec;
             fs::exists(fs::path(kInstalledRankBootDir) / "sitecustomize.py", ec)) {
    // An installed worker (deploy/install.sh, prefix /usr): the trainctl
    // module is where python3 finds it; only the hook goes first.
    std::string rest;
    if (auto it = cmd.env().find("PYTHONPATH"); it != cmd.env().end()) {
      rest = it->second;
    } else if (const char* existing = std::getenv("PYTHONPATH"); existing != nullptr) {
      rest = existing;
    }
    env.push_back(
        absl::StrCat("PYTHONPATH=", kInstalledRankBootDir, rest.empty() ? "" : ":", rest));
  } else if (auto it = cmd.env().find("PYTHONPATH"); it != cmd.env().end()) {
    env.push_back(absl::StrCat("PYTHONPATH=", it->second));
  }
  return env;
}

namespace {

bool HasLimits(const v1::ResourceSpec& r) { return r.cpus() > 0 || r.memory() > 0 || r.pids() > 0; }

}  // namespace

absl::Status RankTable::MakeRankCgroup(const LocalAttempt& a, LocalRank& r) {
  if (!HasLimits(a.spec.resources())) return absl::OkStatus();
  if (!cgroups_.has_value()) {
    cgroups_ = CgroupLimits::DetectHere(options_.cgroup_root);
    LogEvent(cgroups_->available() ? LogLevel::kInfo : LogLevel::kWarn, "worker", "cgroups",
             {{"available", cgroups_->available() ? "true" : "false"},
              {"layout", cgroups_->Describe()}});
  }
  absl::StatusOr<RankCgroup> g = cgroups_->Create(
      absl::StrCat(a.job_id, "-", a.number, "-rank", r.assignment.rank()), a.spec.resources());
  if (!g.ok()) {
    // Limits the user asked for are never dropped silently: the rank does
    // not start, and the job says why (docs/job-yaml.md, resources).
    return absl::FailedPreconditionError(absl::StrCat(
        "resources: this worker cannot enforce the job's limits: ", g.status().message(),
        " (the worker needs root and a writable cgroup v1 or v2 hierarchy; or leave out "
        "resources)"));
  }
  r.cgroup = *std::move(g);
  return absl::OkStatus();
}

bool RankTable::StartProcess(LocalAttempt& a, LocalRank& r, const RankLaunch& l,
                             const std::string& what) {
  r.state.Apply(RankEvent::kLaunch);
  r.oom_kills_at_launch = ReadOomKillCount();
  if (absl::Status s = MakeRankCgroup(a, r); !s.ok()) {
    LogEvent(LogLevel::kWarn, "worker", "rank_limits_unenforceable",
             {{"job_id", a.job_id},
              {"attempt", absl::StrCat(a.number)},
              {"rank", absl::StrCat(r.assignment.rank())},
              {"reason", std::string(s.message())}});
    ReportLaunchFailure(a, r, std::string(s.message()), v1::FAILURE_KIND_CONFIG);
    return false;
  }
  RankLaunch launch = l;
  if (r.cgroup.has_value()) launch.cgroup_procs_fds = r.cgroup->procs_fds();
  absl::StatusOr<pid_t> pid = launcher_.Launch(launch);
  if (r.cgroup.has_value()) r.cgroup->CloseProcsFds();
  if (!pid.ok()) {
    RemoveRankCgroup(a, r);
    ReportLaunchFailure(a, r, absl::StrCat(what, ": ", pid.status().message()));
    return false;
  }
  r.pid = *pid;
  LogEvent(LogLevel::kInfo, "worker", "rank_started",
           {{"job_id", a.job_id},
            {"attempt", absl::StrCat(a.number)},
            {"rank", absl::StrCat(r.assignment.rank())},
            {"pid", absl::StrCat(r.pid)}});
  ReportStatus(a, r);
  return true;
}

}  // namespace trainctl::worker

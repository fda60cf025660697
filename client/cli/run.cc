// `trainctl run FILE`: local mode. Starts an embedded coordinator (state in
// the run's own directory under the runs directory, or a given one) and one
// local worker daemon offering the host's GPUs, or as many CPU slots as the
// job has ranks, submits the job, follows it, and exits with its outcome —
// torchrun's convenience with the whole system (scheduling, rendezvous,
// supervision, restarts) underneath. Runs are kept: `trainctl runs` lists
// them and `--run RUN` points any verb at one: a live run's own coordinator
// (live.txt, below), or for a finished one an embedded coordinator on its
// state, no worker.
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "client/cli/run_records.h"
#include "client/cli/script_job.h"
#include "common/auth/secret.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/server/coordinator_server.h"
#include "worker/daemon/slot_inventory.h"
#include "worker/daemon/worker_daemon.h"

namespace trainctl::cli {
namespace {

namespace fs = std::filesystem;

struct RunFlags {
  std::string file;
  std::vector<std::string> sets;
  std::string state_dir;
  std::string rank_binary;
  std::string gpus;
  int slots = 0;
  bool keep_state = false;
  std::string resume;
  ScriptJobFlags script;
};

// Shell-quotes `s` when it needs it.
std::string Quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of(
                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// trainctl-rank beside this binary (installed), or in the build tree.
std::string FindRankBinary(const CliEnvironment& env) {
  if (std::optional<std::string> e = env.getenv("TRAINCTL_RANK_BINARY")) return *e;
  char self[4096] = {0};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "trainctl-rank";
  fs::path dir = fs::path(std::string(self, static_cast<size_t>(n))).parent_path();
  for (const fs::path& p :
       {dir / "trainctl-rank", dir / ".." / "worker" / "trainer" / "trainctl-rank"}) {
    if (access(p.c_str(), X_OK) == 0) return fs::weakly_canonical(p).string();
  }
  return (dir / "trainctl-rank").string();
}

// The job as the user asked for it, made ready for a local run (checkpoints
// in ./checkpoints/<name>/<id>, --resume). Nullopt, with `*code` set and the
// reason said, when it cannot run here.
std::optional<v1::JobSpec> LocalJobSpec(CliContext& ctx, const RunFlags& flags, int* code) {
  const bool script = IsScriptForm(flags.file, flags.script);
  if (script && flags.script.nnodes > 1) {
    // torchrun's --nnodes N starts one agent per host; a local run is one
    // host (its own worker), so N nodes here would only be N x more ranks
    // on this machine, not what the script's GROUP_WORLD_SIZE would say.
    *code = ctx.Fail(absl::InvalidArgumentError(
        absl::StrCat("--nnodes ", flags.script.nnodes,
                     ": trainctl run starts ranks on this host only (one node); use "
                     "--nproc-per-node for more ranks here, "
                     "or trainctl submit --nnodes ",
                     flags.script.nnodes, " to run on a cluster")));
    return std::nullopt;
  }
  // A program restarts as torchrun's would (ScriptJobSpec: not at all,
  // unless --max-restarts says so).
  ParsedJobSpec parsed = script ? ScriptJobSpec(flags.file, flags.script, flags.sets)
                                : ParseJobSpecFile(flags.file, flags.sets);
  if (!parsed.ok()) {
    for (const SpecError& e : parsed.errors) ctx.err << e.ToString() << "\n";
    ctx.err << std::flush;
    *code = kExitUsage;
    return std::nullopt;
  }
  v1::JobSpec spec = parsed.spec;
  if (spec.scheduling().nodes() > 1) {
    // One worker here: a job that must span N hosts would wait forever.
    *code = ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
        "scheduling.nodes: ", spec.scheduling().nodes(),
        ": trainctl run starts ranks on this host only (one node); leave it out (or 1) here, or "
        "trainctl submit the job to run on a cluster")));
    return std::nullopt;
  }
  // The final model and checkpoints land where the user can find them, in a
  // directory of this job's own (the coordinator fills in the id).
  if (spec.checkpoint().dir().empty()) {
    spec.mutable_checkpoint()->set_dir(
        (fs::absolute(fs::path("checkpoints") / spec.name()) / "{job_id}").string());
  }
  if (!flags.resume.empty()) spec.mutable_resume_from()->set_job(flags.resume);
  // A CUDA job on a host without a usable GPU would wait for a slot forever:
  // say so before starting anything.
  if (spec.device() == v1::DEVICE_CUDA &&
      (flags.gpus == "none" || worker::DiscoverGpus().empty())) {
    *code = ctx.Fail(absl::FailedPreconditionError(
        flags.gpus == "none"
            ? "device: cuda, but --gpus none leaves this run no GPU; use --set device=cpu (or "
              "device=auto)"
            : "device: cuda, but this host has no GPU visible (no NVIDIA driver or device found "
              "through "
              "NVML); use --set device=cpu, or device=auto to take a GPU only where there is one"));
    return std::nullopt;
  }
  return spec;
}

// Slots: every GPU for a job that may use them, else one CPU slot per rank.
absl::StatusOr<std::vector<v1::Slot>> LocalSlots(const v1::JobSpec& spec, const RunFlags& flags) {
  std::vector<worker::GpuInfo> gpus = worker::DiscoverGpus();
  std::string gpu_flag = flags.gpus;
  int cpu_slots = flags.slots;
  if (spec.device() == v1::DEVICE_CPU || (gpus.empty() && gpu_flag.empty())) {
    gpu_flag = "none";
    if (cpu_slots == 0) cpu_slots = spec.world_size();
  }
  return worker::ChooseSlots(gpu_flag, cpu_slots, gpus);
}

coordinator::CoordinatorOptions LocalCoordinatorOptions(const std::string& state_dir) {
  coordinator::CoordinatorOptions co;
  co.listen = "127.0.0.1:0";
  co.db_path = state_dir + "/state.db";
  co.registry.heartbeat_interval = absl::Milliseconds(500);
  co.registry.lease_timeout = absl::Seconds(5);
  // A missing file or program is named before any rank starts.
  co.jobs.preflight = true;
  return co;
}

// Zero-config auth on loopback: the coordinator made a random admin secret
// for this run; the local worker gets a worker token, kept in the state
// dir so that a reused --state-dir keeps the worker's id (ids are bound to
// the token that first registered them).
absl::StatusOr<std::string> LocalWorkerToken(coordinator::CoordinatorServer& server,
                                             const std::string& state_dir) {
  const std::string worker_token_file = state_dir + "/worker.token";
  absl::StatusOr<std::string> worker_token = auth::ReadTokenFile(worker_token_file);
  if (worker_token.ok()) return worker_token;
  worker_token = server.IssueToken(v1::ROLE_WORKER, "local-worker");
  if (!worker_token.ok()) return worker_token;
  if (absl::Status w = auth::WritePrivateFile(worker_token_file, *worker_token + "\n"); !w.ok())
    return w;
  return worker_token;
}

worker::DaemonOptions LocalDaemonOptions(CliContext& ctx, const RunFlags& flags,
                                         const std::string& coordinator, const std::string& token,
                                         const std::string& state_dir,
                                         std::vector<v1::Slot> slots) {
  worker::DaemonOptions wo;
  wo.coordinator = coordinator;
  wo.token = token;
  wo.work_dir = state_dir + "/worker";
  wo.slots = std::move(slots);
  wo.hostname = "localhost";
  wo.address = "127.0.0.1";
  wo.rank_binary = flags.rank_binary.empty() ? FindRankBinary(ctx.env) : flags.rank_binary;
  // The user's own program, on the user's own machine.
  wo.allow_commands = true;
  wo.python_dir = worker::DefaultPythonDir();
  // The user's own files, read as the user: data anywhere (a worker daemon
  // without --data-root reads only its work dir and /usr/share/datasets).
  wo.data_roots = {"/"};
  return wo;
}

// The name of this process's Unix user (its uid when it has none).
std::string LocalUserName() {
  std::vector<char> buf(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_name != nullptr && *found->pw_name != 0) {
    return found->pw_name;
  }
  return absl::StrCat("uid-", geteuid());
}

// Wait (bounded) for the local worker, so the job is placed at once.
void WaitForLocalWorker(Client& client) {
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<v1::Worker>> w = client.Workers(false);
    if (w.ok() && !w->empty()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// After Ctrl-C: an engine job with a checkpoint keeps its state (the
// coordinator's checkpoint records) and says how to continue. True when the
// state directory must be kept.
bool ReportInterrupted(CliContext& ctx, Client& client, const RunFlags& flags,
                       const v1::JobSpec& spec, const std::string& job_id,
                       const std::string& state_dir) {
  if (spec.has_command()) {
    // The program's own files (TRAINCTL_CHECKPOINT_DIR) are what it resumes from.
    ctx.err << "interrupted; every rank was stopped\n";
    return false;
  }
  absl::StatusOr<v1::Job> last = client.Get(job_id);
  if (!last.ok() || last->checkpoints_size() == 0) {
    ctx.err << "interrupted before the first checkpoint; nothing to resume\n";
    return false;
  }
  std::string cmd = absl::StrCat("trainctl run ", Quote(flags.file));
  for (const std::string& set : flags.sets) absl::StrAppend(&cmd, " --set ", Quote(set));
  absl::StrAppend(&cmd, " --state-dir ", Quote(state_dir), " --resume ", job_id);
  ctx.err << "interrupted; continue from the last checkpoint with:\n  " << cmd << "\n";
  return true;
}

struct LocalOutcome {
  int code = kExitOk;
  bool keep_state = false;  // interrupted with a checkpoint to resume from
};

// Follows the submitted job to its end. Ctrl-C / SIGTERM (taken from
// `stop_signals` by a thread of its own) cancel it; following then ends.
LocalOutcome FollowLocalJob(CliContext& ctx, Client& client, const RunFlags& flags,
                            const v1::JobSpec& spec, const v1::Job& job,
                            const std::string& state_dir, const sigset_t& stop_signals) {
  if (!ctx.json()) ctx.out << "submitted job " << job.id() << "\n" << std::flush;
  std::atomic<bool> followed{false};
  // The first SIGINT or SIGTERM taken (0: none): the run exits 128 + it,
  // as a shell expects of a program a signal stopped (130 for Ctrl-C, as
  // `submit --follow` does).
  std::atomic<int> interrupted{0};
  std::thread on_signal([&] {
    int sig = 0;
    while (sigwait(&stop_signals, &sig) == 0 && !followed) {
      if (sig == SIGINT || sig == SIGTERM) {
        int none = 0;
        interrupted.compare_exchange_strong(none, sig);
        absl::StatusOr<v1::Job> c =
            client.Cancel(job.id(), absl::StrCat("trainctl run got signal ", sig));
        if (!c.ok())
          ctx.err << "trainctl run: could not cancel " << job.id() << ": " << c.status().message()
                  << "\n";
      }
    }
  });
  LocalOutcome out;
  // Checked before anything started (RunLocal).
  const RankOutput rank_output = RankOutputOf(flags.script).value_or(RankOutput{});
  out.code = spec.has_command() && !ctx.json()
                 ? FollowJobWithRankOutput(ctx, client, job.id(), rank_output)
                 : FollowJob(ctx, client, job.id());
  followed = true;
  pthread_kill(on_signal.native_handle(), SIGUSR1);
  on_signal.join();
  std::string model =
      absl::StrCat(job.spec().checkpoint().dir(), "/", FinalModelFileName(job.id()));
  // FollowJob printed it already when rank 0 reported it (Job.final_model).
  absl::StatusOr<v1::Job> ended = client.Get(job.id());
  const bool said = ended.ok() && !ended->final_model().empty();
  if (out.code == kExitOk && !ctx.json() && !said && !spec.has_command() && fs::exists(model)) {
    ctx.out << "final model: " << model << " (" << LoadHint(IsTorchScriptFile(model)) << ")\n";
  }
  if (const int sig = interrupted.load(); sig != 0) {
    out.keep_state = ReportInterrupted(ctx, client, flags, spec, job.id(), state_dir);
    out.code = 128 + sig;
  }
  return out;
}

// --- live runs: live.txt (run_records.h) ---------------------------------------

// How long --run waits for a live run's own coordinator to answer.
constexpr absl::Duration kLiveConnectTimeout = absl::Seconds(3);

// Writes live.txt on construction, removes it on destruction. A record that
// cannot be written is only a warning: --run then answers once the run ends.
class LiveRecord {
 public:
  LiveRecord(CliContext& ctx, const std::string& dir, const std::string& address,
             const std::string& token)
      : path_(dir + "/" + kLiveRecord) {
    RunRecord r{{"address", address}, {"token", token}, {"pid", absl::StrCat(getpid())}};
    if (absl::Status w = WriteRecordFile(path_, r); !w.ok()) {
      ctx.err << "trainctl run: " << w.message()
              << " (--run answers for this run once it is over)\n";
      path_.clear();
    }
  }
  ~LiveRecord() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  LiveRecord(const LiveRecord&) = delete;
  LiveRecord& operator=(const LiveRecord&) = delete;

 private:
  std::string path_;
};

// A client of a live run's own coordinator, checked to be that run's (it
// knows the run's job under that token) within kLiveConnectTimeout: a port
// since taken by another process, or a run stopped but not yet gone, is an
// error here, and the caller reads the database instead.
absl::StatusOr<std::unique_ptr<Client>> ConnectToLiveRun(const CliContext& ctx,
                                                         const RunRecord& live,
                                                         const std::string& job) {
  ClientOptions copts;
  copts.address = live.at("address");
  copts.token = live.at("token");
  copts.timeout = std::min(kLiveConnectTimeout, absl::Seconds(ctx.timeout_s));
  {
    TRAINCTL_ASSIGN_OR_RETURN(std::unique_ptr<Client> probe, Client::Connect(copts));
    absl::Status answered = job.empty() ? probe->Workers(false).status() : probe->Get(job).status();
    if (!answered.ok()) return answered;
  }
  copts.timeout = absl::Seconds(ctx.timeout_s);
  return Client::Connect(copts);
}

// While it lives, what this process and the rank processes it starts
// create is the user's alone (umask 077 added to the one we were started
// with: files 0600, directories 0700), as on a cluster, where the
// coordinator sets umask 077 and the worker daemon --umask 0077, which its
// ranks inherit. A local run makes the same things: state.db and its
// -wal/-shm, the worker's job directories and logs, checkpoints, models and
// TensorBoard files, whether the engine or a script's trainctl.save_* or
// torch.save writes them. The previous mask comes back at the end (the
// CLI also runs in-process, in tests).
class PrivateFiles {
 public:
  PrivateFiles() : old_(::umask(077)) { ::umask(old_ | 077); }
  ~PrivateFiles() { ::umask(old_); }
  PrivateFiles(const PrivateFiles&) = delete;
  PrivateFiles& operator=(const PrivateFiles&) = delete;

 private:
  const mode_t old_;
};

// --run's embedded coordinator, and the mask under which it writes the
// run's database (-wal, -shm): destroyed in that order.
struct RunServer {
  PrivateFiles private_files;
  std::unique_ptr<coordinator::CoordinatorServer> server;
};

int RunLocal(CliContext& ctx, const RunFlags& flags) {
  // Before the first directory is made (the runs directory, --state-dir).
  PrivateFiles private_files;
  int code = kExitOk;
  std::optional<v1::JobSpec> spec = LocalJobSpec(ctx, flags, &code);
  if (!spec) return code;
  if (absl::Status s = RankOutputOf(flags.script).status(); !s.ok()) return ctx.Fail(s);

  std::string state_dir = flags.state_dir;
  if (state_dir.empty()) {
    absl::StatusOr<std::string> dir = NewRunDir(ctx.env, spec->name());
    if (!dir.ok()) return ctx.Fail(dir.status());
    state_dir = *dir;
  }
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) {
    return ctx.Fail(absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", state_dir, ": cannot create it: ", ec.message())));
  }

  // Signals are taken by a thread (FollowLocalJob), not delivered to
  // whichever thread runs; the mask is inherited by every thread started
  // from here on (rank processes reset theirs).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::vector<v1::Slot>> slots = LocalSlots(*spec, flags);
  if (!slots.ok()) return ctx.Fail(slots.status());
  // The embedded services' event lines (registrations, transitions) would
  // only interleave with the follow output that already says what matters.
  SetLogLevel(LogLevel::kError);
  // Declared before the server: removed after it stopped and let go of
  // the database, so that a client reading it meanwhile falls back to it.
  std::optional<LiveRecord> live_record;
  coordinator::CoordinatorServer server(LocalCoordinatorOptions(state_dir));
  absl::StatusOr<std::string> addr = server.Start();
  if (!addr.ok()) return ctx.Fail(addr.status());
  absl::StatusOr<std::string> worker_token = LocalWorkerToken(server, state_dir);
  if (!worker_token.ok()) return ctx.Fail(worker_token.status());
  worker::WorkerDaemon daemon(
      LocalDaemonOptions(ctx, flags, *addr, *worker_token, state_dir, *slots));
  if (absl::Status s = daemon.Start(); !s.ok()) return ctx.Fail(s);

  // Jobs are owned by the Unix user (Job.owner), who thereby claims its
  // checkpoint directories (docs/checkpoints.md "Whose directory").
  absl::StatusOr<std::string> user_token = server.IssueToken(v1::ROLE_ADMIN, LocalUserName());
  if (!user_token.ok()) return ctx.Fail(user_token.status());
  ClientOptions copts;
  copts.address = *addr;
  copts.token = *user_token;
  std::unique_ptr<Client> client = Client::FromChannel(server.InProcessChannel(copts.token), copts);
  WaitForLocalWorker(*client);
  if (!ctx.json()) {
    ctx.out << "local cluster: coordinator " << *addr << ", 1 worker with " << slots->size() << " "
            << ((*slots)[0].kind() == v1::Slot::KIND_GPU ? "GPU" : "CPU") << " slot(s); state in "
            << state_dir << "\n";
  }
  absl::StatusOr<v1::Job> job = client->Submit(*spec);
  LocalOutcome outcome;
  RunRecord record = ReadRunRecord(state_dir);
  if (!job.ok()) {
    outcome.code = ctx.Fail(job.status());
  } else {
    // Kept for `trainctl runs` and `--run` (a --state-dir used again keeps
    // the record of its latest job).
    record["job"] = job->id();
    record["name"] = spec->name();
    record["started"] = FormatTimestamp(job->submit_time());
    record["cwd"] = fs::current_path(ec).string();
    record["command"] = absl::StrCat("trainctl run ", flags.file);
    record.erase("state");
    if (absl::Status w = WriteRunRecord(state_dir, record); !w.ok()) {
      ctx.err << "trainctl run: " << w.message() << "\n";
    }
    // `--run` asks this run while it goes on (reads only: a viewer token).
    if (absl::StatusOr<std::string> viewer = server.IssueToken(v1::ROLE_VIEWER, "live-run");
        viewer.ok()) {
      live_record.emplace(ctx, state_dir, *addr, *viewer);
    } else {
      ctx.err << "trainctl run: " << viewer.status().message()
              << " (--run answers for this run once it is over)\n";
    }
    outcome = FollowLocalJob(ctx, *client, flags, *spec, *job, state_dir, stop_signals);
    if (absl::StatusOr<v1::Job> ended = client->Get(job->id()); ended.ok()) {
      record["state"] = JobStateName(ended->state());
      (void)WriteRunRecord(state_dir, record);
    }
  }
  ctx.out << std::flush;
  daemon.Shutdown(/*goodbye=*/true, absl::Seconds(5));
  server.Shutdown();
  if (job.ok() && !ctx.json()) {
    ctx.err << "run kept in " << state_dir << " (trainctl runs; trainctl metrics --run "
            << fs::path(state_dir).filename().string() << ")\n";
  }
  return outcome.code;
}

// `trainctl runs`: the kept local runs, newest first.
int RunRuns(CliContext& ctx) {
  const std::string runs = RunsDir(ctx.env);
  std::vector<std::string> kept = KeptRuns(runs);
  if (kept.empty()) {
    ctx.out << "no local runs in " << runs << "\n";
    return kExitOk;
  }
  Table t({"RUN", "JOB", "STATE", "STARTED", "COMMAND"});
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
    RunRecord r = ReadRunRecord(runs + "/" + *it);
    std::string state = r["state"];
    if (state.empty()) state = LiveRecordOf(runs + "/" + *it).has_value() ? "live" : "-";
    t.AddRow({*it, r["job"], state, r["started"], r["command"]});
  }
  t.Print(ctx.out);
  ctx.out << "(in " << runs << "; any verb takes --run RUN: trainctl metrics --run " << kept.back()
          << ")\n"
          << std::flush;
  return kExitOk;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> ConnectToRun(CliContext& ctx) {
  TRAINCTL_ASSIGN_OR_RETURN(std::string dir, FindRun(ctx.env, ctx.run_flag));
  ctx.run_job = ReadRunRecord(dir)["job"];
  // A run still going answers itself; else (or when it does not answer)
  // its database is opened.
  std::string live_failed;
  if (std::optional<RunRecord> live = LiveRecordOf(dir)) {
    absl::StatusOr<std::unique_ptr<Client>> client = ConnectToLiveRun(ctx, *live, ctx.run_job);
    if (client.ok()) {
      ctx.run_live = true;
      return client;
    }
    live_failed =
        absl::StrCat("; its live coordinator at ", (*live)["address"], " (pid ", (*live)["pid"],
                     ") did not answer either: ", client.status().message());
  }
  // Its lines (recovery, transitions) are not what the verb is asked for.
  SetLogLevel(LogLevel::kError);
  coordinator::CoordinatorOptions co = LocalCoordinatorOptions(dir);
  co.admin_token = auth::NewSecret("admin");
  auto run = std::make_shared<RunServer>();
  run->server = std::make_unique<coordinator::CoordinatorServer>(co);
  coordinator::CoordinatorServer* server = run->server.get();
  absl::StatusOr<std::string> addr = server->Start();
  if (!addr.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--run ", dir, ": ", addr.status().message(),
                     live_failed.empty() ? " (is that run still going?)" : live_failed));
  }
  ClientOptions copts;
  copts.address = *addr;
  copts.token = co.admin_token;
  copts.timeout = absl::Seconds(ctx.timeout_s);
  std::unique_ptr<Client> client =
      Client::FromChannel(server->InProcessChannel(copts.token), copts);
  ctx.run_server = std::move(run);
  return client;
}

VerbRunner AddRunsVerb(CLI::App& app, CliContext& ctx) {
  AddVerb(app, "runs", "List the kept local runs (trainctl run), newest first",
          "  trainctl runs\n"
          "  trainctl metrics --run latest        # the newest run's job\n"
          "  trainctl logs --run 20261202-091500-mlp-synthetic\n"
          "Runs are kept in $TRAINCTL_RUNS_DIR, else $XDG_STATE_HOME/trainctl/runs, else\n"
          "~/.local/state/trainctl/runs: the newest 50.\n");
  return [&ctx] { return RunRuns(ctx); };
}

VerbRunner AddRunVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* sub = AddVerb(
      app, "run",
      "Run a job locally: embedded coordinator + a worker for this host's GPUs or CPU slots",
      "  trainctl run examples/mlp-synthetic.yaml\n"
      "  trainctl run examples/fashion-mnist-cnn.yaml --set training.epochs=1\n"
      "  trainctl run job.yaml --state-dir DIR --resume JOB   # continue an interrupted run\n"
      "  trainctl run --nproc-per-node 2 train.py --epochs 3   # your own script, as torchrun runs "
      "it\n"
      "The final model goes to checkpoint.dir (default ./checkpoints/<name>/<job id>/<job "
      "id>.model.pt).\n");
  sub->add_option("FILE", flags->file, "The job.yaml, or a program to run as every rank (train.py)")
      ->required();
  sub->add_option("--set", flags->sets, "Override a field: key.path=value (repeatable)");
  sub->add_option("--state-dir", flags->state_dir,
                  "Keep the coordinator database and worker files here (default: a new directory "
                  "of this run's own under the runs directory, see trainctl runs)");
  sub->add_flag("--keep-state", flags->keep_state,
                "Accepted for older scripts: every run's state is kept");
  sub->add_option(
      "--resume", flags->resume,
      "Continue this job (of the --state-dir's coordinator) from its newest checkpoint; "
      "an interrupted run prints the command");
  sub->add_option("--gpus", flags->gpus,
                  "GPUs to use: all, none, or 0,1 (default: every visible GPU)");
  sub->add_option("--slots", flags->slots, "CPU slots (default: the job's world_size)");
  sub->add_option(
      "--rank-binary", flags->rank_binary,
      "The rank process (default: trainctl-rank beside trainctl, or $TRAINCTL_RANK_BINARY)");
  AddScriptOptions(sub, &flags->script);
  return [&ctx, flags] { return RunLocal(ctx, *flags); };
}

}  // namespace trainctl::cli

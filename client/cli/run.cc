// `trainctl run FILE`: local mode. Starts an embedded coordinator (state in
// a temporary or given directory) and one local worker daemon offering the
// host's GPUs, or as many CPU slots as the job has ranks, submits the job,
// follows it, and exits with its outcome — torchrun's convenience with the
// whole system (scheduling, rendezvous, supervision, restarts) underneath.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "client/cli/context.h"
#include "client/cli/script_job.h"
#include "common/auth/secret.h"
#include "common/jobspec/job_spec.h"
#include "coordinator/coordinator_server.h"
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
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,") ==
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
  for (const fs::path& p : {dir / "trainctl-rank", dir / ".." / "worker" / "trainer" / "trainctl-rank"}) {
    if (access(p.c_str(), X_OK) == 0) return fs::weakly_canonical(p).string();
  }
  return (dir / "trainctl-rank").string();
}

int RunLocal(CliContext& ctx, const RunFlags& flags) {
  const bool script = IsScriptForm(flags.file, flags.script);
  ParsedJobSpec parsed = script ? ScriptJobSpec(flags.file, flags.script, flags.sets)
                                : ParseJobSpecFile(flags.file, flags.sets);
  if (!parsed.ok()) {
    for (const SpecError& e : parsed.errors) ctx.err << e.ToString() << "\n";
    ctx.err << std::flush;
    return kExitUsage;
  }
  v1::JobSpec spec = parsed.spec;
  // The final model and checkpoints land where the user can find them, in a
  // directory of this job's own (the coordinator fills in the id).
  if (spec.checkpoint().dir().empty()) {
    spec.mutable_checkpoint()->set_dir(
        (fs::absolute(fs::path("checkpoints") / spec.name()) / "{job_id}").string());
  }
  if (!flags.resume.empty()) spec.mutable_resume_from()->set_job(flags.resume);
  // A CUDA job on a host without a usable GPU would wait for a slot forever:
  // say so before starting anything.
  if (spec.device() == v1::DEVICE_CUDA && (flags.gpus == "none" || worker::DiscoverGpus().empty())) {
    return ctx.Fail(absl::FailedPreconditionError(
        flags.gpus == "none"
            ? "device: cuda, but --gpus none leaves this run no GPU; use --set device=cpu (or device=auto)"
            : "device: cuda, but this host has no GPU visible (no NVIDIA driver or device found through "
              "NVML); use --set device=cpu, or device=auto to take a GPU only where there is one"));
  }

  std::string state_dir = flags.state_dir;
  bool temporary = state_dir.empty();
  if (temporary) {
    std::string tmpl = (fs::temp_directory_path() / "trainctl-run-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return ctx.Fail(absl::InternalError("cannot create a state directory"));
    state_dir = tmpl;
  }
  std::error_code ec;
  fs::create_directories(state_dir, ec);

  // Signals are taken by a thread (below), not delivered to whichever thread
  // runs; the mask is inherited by every thread started from here on (rank
  // processes reset theirs).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Slots: every GPU for a job that may use them, else one CPU slot per rank.
  std::vector<worker::GpuInfo> gpus = worker::DiscoverGpus();
  std::string gpu_flag = flags.gpus;
  int cpu_slots = flags.slots;
  if (spec.device() == v1::DEVICE_CPU || (gpus.empty() && gpu_flag.empty())) {
    gpu_flag = "none";
    if (cpu_slots == 0) cpu_slots = spec.world_size();
  }
  absl::StatusOr<std::vector<v1::Slot>> slots = worker::ChooseSlots(gpu_flag, cpu_slots, gpus);
  if (!slots.ok()) return ctx.Fail(slots.status());

  coordinator::CoordinatorOptions co;
  co.listen = "127.0.0.1:0";
  co.db_path = state_dir + "/state.db";
  co.registry.heartbeat_interval = absl::Milliseconds(500);
  co.registry.lease_timeout = absl::Seconds(5);
  // A missing file or program is named before any rank starts.
  co.jobs.preflight = true;
  // The embedded services' event lines (registrations, transitions) would
  // only interleave with the follow output that already says what matters.
  SetLogLevel(LogLevel::kError);
  coordinator::CoordinatorServer server(co);
  absl::StatusOr<std::string> addr = server.Start();
  if (!addr.ok()) return ctx.Fail(addr.status());

  // Zero-config auth on loopback: the coordinator made a random admin secret
  // for this run; the local worker gets a worker token, kept in the state
  // dir so that a reused --state-dir keeps the worker's id (ids are bound to
  // the token that first registered them).
  const std::string worker_token_file = state_dir + "/worker.token";
  absl::StatusOr<std::string> worker_token = auth::ReadTokenFile(worker_token_file);
  if (!worker_token.ok()) {
    worker_token = server.IssueToken(v1::ROLE_WORKER, "local-worker");
    if (!worker_token.ok()) return ctx.Fail(worker_token.status());
    if (absl::Status w = auth::WritePrivateFile(worker_token_file, *worker_token + "\n"); !w.ok()) {
      return ctx.Fail(w);
    }
  }
  worker::DaemonOptions wo;
  wo.coordinator = *addr;
  wo.token = *worker_token;
  wo.work_dir = state_dir + "/worker";
  wo.slots = *slots;
  wo.hostname = "localhost";
  wo.address = "127.0.0.1";
  wo.rank_binary = flags.rank_binary.empty() ? FindRankBinary(ctx.env) : flags.rank_binary;
  // The user's own program, on the user's own machine.
  wo.allow_commands = true;
  wo.python_dir = worker::DefaultPythonDir();
  worker::WorkerDaemon daemon(wo);
  if (absl::Status s = daemon.Start(); !s.ok()) return ctx.Fail(s);

  ClientOptions copts;
  copts.address = *addr;
  copts.token = server.admin_token();
  std::unique_ptr<Client> client = Client::FromChannel(server.InProcessChannel(copts.token), copts);
  // Wait (bounded) for the local worker, so the job is placed at once.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<v1::Worker>> w = client->Workers(false);
    if (w.ok() && !w->empty()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!ctx.json()) {
    ctx.out << "local cluster: coordinator " << *addr << ", 1 worker with " << slots->size() << " "
            << ((*slots)[0].kind() == v1::Slot::KIND_GPU ? "GPU" : "CPU") << " slot(s); state in "
            << state_dir << "\n";
  }
  absl::StatusOr<v1::Job> job = client->Submit(spec);
  int code;
  bool keep_for_resume = false;
  if (!job.ok()) {
    code = ctx.Fail(job.status());
  } else {
    if (!ctx.json()) ctx.out << "submitted job " << job->id() << "\n" << std::flush;
    // Ctrl-C / SIGTERM cancel the job; following then ends and everything
    // below still runs (ranks stopped, state directory removed).
    std::atomic<bool> followed{false};
    std::atomic<bool> interrupted{false};
    std::thread on_signal([&] {
      int sig = 0;
      while (sigwait(&stop_signals, &sig) == 0 && !followed) {
        if (sig == SIGINT || sig == SIGTERM) {
          interrupted = true;
          absl::StatusOr<v1::Job> c = client->Cancel(job->id(), absl::StrCat("trainctl run got signal ", sig));
          if (!c.ok()) ctx.err << "trainctl run: could not cancel " << job->id() << ": " << c.status().message() << "\n";
        }
      }
    });
    code = spec.has_command() && !ctx.json() ? FollowJobWithRankOutput(ctx, *client, job->id())
                                             : FollowJob(ctx, *client, job->id());
    followed = true;
    pthread_kill(on_signal.native_handle(), SIGUSR1);
    on_signal.join();
    std::string model = job->spec().checkpoint().dir() + "/model.pt";
    // FollowJob printed it already when rank 0 reported it (Job.final_model).
    absl::StatusOr<v1::Job> ended = client->Get(job->id());
    const bool said = ended.ok() && !ended->final_model().empty();
    if (code == kExitOk && !ctx.json() && !said && !spec.has_command() && fs::exists(model)) {
      ctx.out << "final model: " << model << " (torch.jit.load it in Python)\n";
    }
    if (interrupted && spec.has_command()) {
      // The program's own files (TRAINCTL_CHECKPOINT_DIR) are what it resumes from.
      ctx.err << "interrupted; every rank was stopped\n";
    } else if (interrupted) {
      // Keep the state (the coordinator's checkpoint records) so the job can
      // be continued where it stopped.
      absl::StatusOr<v1::Job> last = client->Get(job->id());
      if (last.ok() && last->checkpoints_size() > 0) {
        keep_for_resume = true;
        std::string cmd = absl::StrCat("trainctl run ", Quote(flags.file));
        for (const std::string& set : flags.sets) absl::StrAppend(&cmd, " --set ", Quote(set));
        absl::StrAppend(&cmd, " --state-dir ", Quote(state_dir), " --resume ", job->id());
        ctx.err << "interrupted; continue from the last checkpoint with:\n  " << cmd << "\n";
      } else {
        ctx.err << "interrupted before the first checkpoint; nothing to resume\n";
      }
    }
  }
  ctx.out << std::flush;
  daemon.Shutdown(/*goodbye=*/true, absl::Seconds(5));
  server.Shutdown();
  if (temporary && !flags.keep_state && !keep_for_resume) fs::remove_all(state_dir, ec);
  return code;
}

}  // namespace

VerbRunner AddRunVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* sub = app.add_subcommand(
      "run", "Run a job locally: embedded coordinator + a worker for this host's GPUs or CPU slots");
  sub->footer(
      "Example:\n"
      "  trainctl run examples/mlp-synthetic.yaml\n"
      "  trainctl run examples/fashion-mnist-cnn.yaml --set training.epochs=1\n"
      "  trainctl run job.yaml --state-dir DIR --resume JOB   # continue an interrupted run\n"
      "  trainctl run --nproc-per-node 2 train.py --epochs 3   # your own script, as torchrun runs it\n"
      "The final model goes to checkpoint.dir (default ./checkpoints/<name>/<job id>/model.pt).\n");
  sub->add_option("FILE", flags->file, "The job.yaml, or a program to run as every rank (train.py)")->required();
  sub->add_option("--set", flags->sets, "Override a field: key.path=value (repeatable)");
  sub->add_option("--state-dir", flags->state_dir,
                  "Keep the coordinator database and worker files here (default: a temporary "
                  "directory, removed at the end)");
  sub->add_flag("--keep-state", flags->keep_state, "Keep the temporary state directory");
  sub->add_option("--resume", flags->resume,
                  "Continue this job (of the --state-dir's coordinator) from its newest checkpoint; "
                  "an interrupted run prints the command");
  sub->add_option("--gpus", flags->gpus, "GPUs to use: all, none, or 0,1 (default: every visible GPU)");
  sub->add_option("--slots", flags->slots, "CPU slots (default: the job's world_size)");
  sub->add_option("--rank-binary", flags->rank_binary,
                  "The rank process (default: trainctl-rank beside trainctl, or $TRAINCTL_RANK_BINARY)");
  AddScriptOptions(sub, &flags->script);
  return [&ctx, flags] { return RunLocal(ctx, *flags); };
}

}  // namespace trainctl::cli

// The trainctl verbs. Each Add*Verb declares its subcommand (flags, help,
// example) and returns the runner that does the work after parsing.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cli/code_upload.h"
#include "client/cli/context.h"
#include "client/cli/follow.h"
#include "client/cli/format.h"
#include "client/cli/script_job.h"
#include "common/format_bytes.h"
#include "common/jobspec/job_spec.h"
#include "common/status_macros.h"

namespace trainctl::cli {

namespace {

// SIGINT while following: say that the job goes on, and how to see it again.
// The message is made before the handler is installed (the handler only
// write()s and exits, both async-signal-safe).
char follow_interrupt_message[512];
size_t follow_interrupt_length = 0;

extern "C" void OnFollowInterrupted(int) {
  ssize_t ignored = write(STDERR_FILENO, follow_interrupt_message, follow_interrupt_length);
  (void)ignored;
  _exit(130);
}

// Installs the SIGINT message for `job_id` while alive (only where SIGINT
// is unblocked and at its default: not under `trainctl run`, which blocks it
// and takes it on its own thread).
class FollowInterruptNotice {
 public:
  explicit FollowInterruptNotice(const std::string& job_id) {
    std::string msg = absl::StrCat(
        "\ninterrupted: job ", job_id,
        " keeps running on the cluster; follow it again with `trainctl logs -f ", job_id,
        "` or `trainctl status ", job_id, "` (`trainctl cancel ", job_id, "` stops it)\n");
    follow_interrupt_length = std::min(msg.size(), sizeof(follow_interrupt_message));
    std::memcpy(follow_interrupt_message, msg.data(), follow_interrupt_length);
    struct sigaction sa {};
    sa.sa_handler = OnFollowInterrupted;
    sigemptyset(&sa.sa_mask);
    // `trainctl run` blocks SIGINT and takes it on a thread of its own.
    sigset_t blocked;
    const bool taken_elsewhere =
        pthread_sigmask(SIG_BLOCK, nullptr, &blocked) == 0 && sigismember(&blocked, SIGINT);
    struct sigaction old {};
    if (!taken_elsewhere && sigaction(SIGINT, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      installed_ = sigaction(SIGINT, &sa, &old_) == 0;
    }
  }
  ~FollowInterruptNotice() {
    if (installed_) sigaction(SIGINT, &old_, nullptr);
  }
  FollowInterruptNotice(const FollowInterruptNotice&) = delete;
  FollowInterruptNotice& operator=(const FollowInterruptNotice&) = delete;

 private:
  bool installed_ = false;
  struct sigaction old_ {};
};

}  // namespace

absl::StatusOr<v1::Job> ResolveJob(const CliContext& ctx, Client& client,
                                   const std::string& given) {
  const std::string& ref = given.empty() ? ctx.run_job : given;
  if (ref.empty()) {
    return absl::InvalidArgumentError(ctx.run_flag.empty()
                                          ? "JOB: required (a job id, a name or the start of an id)"
                                          : "JOB: required (that run has no job on record)");
  }
  absl::StatusOr<v1::Job> job = client.Get(ref);
  if (job.ok() || job.status().code() != absl::StatusCode::kNotFound) return job;
  absl::StatusOr<std::vector<v1::Job>> all = client.List();  // newest first
  if (!all.ok()) return job.status();
  std::vector<const v1::Job*> named, prefixed;
  for (const v1::Job& j : *all) {
    if (j.spec().name() == ref) named.push_back(&j);
    if (absl::StartsWith(j.id(), ref)) prefixed.push_back(&j);
  }
  const std::vector<const v1::Job*>& found = named.empty() ? prefixed : named;
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no job '", ref, "' (not an id, a job name or the start of an id)"));
  }
  if (found.size() > 1 && !ctx.latest) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < found.size() && i < 10; ++i) ids.push_back(found[i]->id());
    return absl::InvalidArgumentError(absl::StrCat(
        "JOB: '", ref, "' matches ", found.size(), " jobs by ",
        named.empty() ? "id prefix" : "name", ", newest first: ", absl::StrJoin(ids, ", "),
        found.size() > ids.size() ? ", ..." : "", "; give an id, or --latest for the newest"));
  }
  return client.Get(found.front()->id());
}

// Follows a job until it ends; the exit code is 0 only when it SUCCEEDED.
int FollowJob(CliContext& ctx, Client& client, const std::string& job_id) {
  FollowPrinter::Options options;
  options.json = ctx.json();
  options.terminal = ctx.env.out_is_terminal && !options.json;
  options.progress_interval = ctx.env.progress_interval;
  FollowPrinter printer(ctx.out, options);
  FollowInterruptNotice notice(job_id);
  absl::StatusOr<v1::Job> final_job =
      client.Watch(job_id, /*include_history=*/true, [&](const v1::JobUpdate& u) {
        printer.OnUpdate(u);
        return true;
      });
  if (!final_job.ok()) {
    printer.Abort();
    return ctx.Fail(final_job.status());
  }
  return printer.Finish(*final_job);
}

namespace {

// --- submit --------------------------------------------------------------------

struct SubmitFlags {
  std::string file;
  bool follow = false;
  bool dry_run = false;
  bool wait_for_capacity = false;
  // --max-runtime: scheduling.max_runtime_s, as seconds or a duration (2h30m).
  std::string max_runtime;
  std::vector<std::string> sets;
  // --queue: the job's queue, over the file's queue:.
  std::string queue;
  ScriptJobFlags script;
  CodeFlags code;
};

void PrintPlacement(std::ostream& out, const std::vector<v1::RankAssignment>& planned) {
  Table t({"RANK", "NODE", "LOCAL", "HOST", "WORKER", "SLOT"});
  for (const v1::RankAssignment& r : planned) {
    t.AddRow({absl::StrCat(r.rank()), absl::StrCat(r.node_rank()), absl::StrCat(r.local_rank()),
              r.host().empty() ? "-" : r.host(), r.worker_id(), SlotText(r.slot())});
  }
  t.Print(out, "  ");
}

int RunDryRun(CliContext& ctx, const SubmitFlags& flags, const v1::JobSpec& spec) {
  v1::SubmitJobResponse result;
  *result.mutable_job()->mutable_spec() = spec;
  result.mutable_job()->set_state(v1::JOB_STATE_PENDING);
  if (!ctx.json()) {
    ctx.out << flags.file << ": valid\n\nSpec:\n";
    PrintSpecSummary(ctx.out, spec, "  ");
  }
  absl::StatusOr<std::unique_ptr<Client>> client = ctx.Connect(ctx.env.dry_run_connect_timeout);
  if (!client.ok()) {
    // Validation needs no coordinator; the placement does.
    if (ctx.json()) {
      ctx.PrintJson(result);
    } else {
      ctx.out << "\nPlacement: not checked (" << client.status().message() << ")\n";
    }
    return kExitOk;
  }
  absl::StatusOr<DryRunResult> dry = (*client)->DryRun(spec);
  if (!dry.ok()) return ctx.Fail(dry.status());
  *result.mutable_job() = dry->job;
  for (const v1::RankAssignment& r : dry->planned) *result.add_planned() = r;
  result.set_pending_reason(dry->pending_reason);
  if (ctx.json()) {
    ctx.PrintJson(result);
    return kExitOk;
  }
  ctx.out << "\nPlacement now (coordinator " << (*client)->active_address() << "):\n";
  if (dry->planned.empty()) {
    ctx.out << "  the job would wait: "
            << (dry->pending_reason.empty() ? "no free slots" : dry->pending_reason) << "\n";
  } else {
    PrintPlacement(ctx.out, dry->planned);
  }
  return kExitOk;
}

// --max-runtime's value: plain seconds (7200) or a duration (90m, 2h30m).
absl::StatusOr<double> ParseRuntimeSeconds(const std::string& text) {
  double seconds = 0;
  absl::Duration d;
  if (absl::SimpleAtod(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-runtime: must be seconds or a duration such as 90m or 2h30m, got '", text, "'"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--max-runtime: must be > 0, got '", text, "'"));
  }
  return absl::ToDoubleSeconds(d);
}

int RunSubmit(CliContext& ctx, const SubmitFlags& flags) {
  std::vector<std::string> sets = flags.sets;
  if (flags.wait_for_capacity) sets.push_back("scheduling.wait_for_capacity=true");
  if (!flags.max_runtime.empty()) {
    absl::StatusOr<double> seconds = ParseRuntimeSeconds(flags.max_runtime);
    if (!seconds.ok()) return ctx.Fail(seconds.status());
    sets.push_back(absl::StrFormat("scheduling.max_runtime_s=%.15g", *seconds));
  }
  if (!flags.queue.empty()) sets.push_back(absl::StrCat("queue=", flags.queue));
  ParsedJobSpec parsed = IsScriptForm(flags.file, flags.script)
                             ? ScriptJobSpec(flags.file, flags.script, sets)
                             : ParseJobSpecFile(flags.file, sets);
  if (!parsed.ok()) {
    // One line per problem, each starting with the file (or --set) and position.
    for (const SpecError& e : parsed.errors) ctx.err << e.ToString() << "\n";
    ctx.err << std::flush;
    return kExitUsage;
  }
  absl::StatusOr<RankOutput> rank_output = RankOutputOf(flags.script);
  if (!rank_output.ok()) return ctx.Fail(rank_output.status());
  // A dry run packs nothing: it shows the spec as --no-upload sends it.
  CodeFlags code_flags = flags.code;
  code_flags.no_upload = code_flags.no_upload || flags.dry_run;
  absl::StatusOr<std::string> code_dir =
      PlanCodeUpload(IsScriptForm(flags.file, flags.script), code_flags, &parsed.spec);
  if (!code_dir.ok()) return ctx.Fail(code_dir.status());
  if (flags.dry_run) return RunDryRun(ctx, flags, parsed.spec);

  // Packed before connecting: a directory that cannot go is refused
  // without a coordinator.
  std::unique_ptr<PackedCodeArchive> archive;
  if (!code_dir->empty()) {
    absl::StatusOr<std::unique_ptr<PackedCodeArchive>> packed = PackedCodeArchive::Pack(*code_dir);
    if (!packed.ok()) return ctx.Fail(packed.status());
    archive = std::move(*packed);
  }
  return ConnectCallPrint(
      ctx,
      [&](Client& client) -> absl::StatusOr<v1::Job> {
        if (archive != nullptr) {
          TRAINCTL_ASSIGN_OR_RETURN(UploadedCode uploaded,
                                    client.UploadCode(archive->path(), archive->code()));
          *parsed.spec.mutable_command()->mutable_code() = uploaded.code;
          // Beside the JSON document, not in it.
          (ctx.json() ? ctx.err : ctx.out) << CodeLine(uploaded) << "\n";
          archive.reset();
        }
        return client.Submit(parsed.spec);
      },
      [&](Client& client, v1::Job& job) -> int {
        if (ctx.json()) {
          ctx.PrintJson(job);
        } else {
          ctx.out << "submitted job " << job.id() << " (" << JobStateName(job.state());
          if (!job.state_reason().empty()) ctx.out << ": " << FirstLine(job.state_reason(), 200);
          ctx.out << ")\n";
        }
        ctx.out << std::flush;
        if (!flags.follow) return kExitOk;
        if (parsed.spec.has_command() && !ctx.json()) {
          return FollowJobWithRankOutput(ctx, client, job.id(), *rank_output);
        }
        return FollowJob(ctx, client, job.id());
      });
}

// --- job queries ---------------------------------------------------------------

int RunStatus(CliContext& ctx, const std::string& job_ref) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, job_ref); },
      [&](v1::Job& job) -> int {
        if (ctx.json()) {
          ctx.PrintJson(job);
        } else {
          PrintJobStatus(ctx.out, job, absl::Now());
        }
        return kExitOk;
      });
}

int RunDescribe(CliContext& ctx, const std::string& job_ref) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, job_ref); },
      [&](Client& client, v1::Job& resolved) -> int {
        const std::string& job_id = resolved.id();
        // The job's events come from the watch history; the first job snapshot
        // follows the history, so stop there.
        std::vector<v1::Event> events;
        absl::StatusOr<v1::Job> job =
            client.Watch(job_id, /*include_history=*/true, [&](const v1::JobUpdate& u) {
              if (u.has_event()) events.push_back(u.event());
              return !u.has_job();
            });
        if (!job.ok()) return ctx.Fail(job.status());
        if (ctx.json()) {
          // One document: {"job": Job, "events": [Event, ...]}.
          std::vector<std::string> docs;
          for (const v1::Event& e : events) docs.push_back(ToJson(e));
          ctx.out << "{\"job\":" << ToJson(*job) << ",\"events\":[" << absl::StrJoin(docs, ",")
                  << "]}\n";
        } else {
          // Lineage: the jobs that continue this one (resume_from).
          std::vector<std::string> continued_by;
          if (absl::StatusOr<std::vector<v1::Job>> all = client.List(); all.ok()) {
            for (auto it = all->rbegin(); it != all->rend(); ++it) {
              if (it->spec().resume_from().job() == job_id) continued_by.push_back(it->id());
            }
          }
          PrintJobDescription(ctx.out, *job, events, absl::Now(), continued_by);
        }
        return kExitOk;
      });
}

int RunList(CliContext& ctx, const std::vector<std::string>& state_names, int limit, bool tree) {
  std::vector<v1::JobState> states;
  for (const std::string& name : state_names) {
    v1::JobState s;
    if (!ParseJobState(name, &s)) {
      return ctx.Fail(absl::InvalidArgumentError(
          absl::StrCat("--state: unknown state '", name,
                       "'; one of pending, scheduled, running, restarting, succeeded, failed, "
                       "cancelled, timeout")));
    }
    states.push_back(s);
  }
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.List(states, limit); },
      [&](std::vector<v1::Job>& jobs) -> int {
        if (ctx.json()) return PrintJsonList(ctx, jobs, &v1::ListJobsResponse::mutable_jobs);
        if (jobs.empty()) {
          ctx.out << "no jobs\n";
          return kExitOk;
        }
        absl::Time now = absl::Now();
        Table t({"ID", "NAME", "QUEUE", "STATE", "RANKS", "PROGRESS", "RESTARTS", "SUBMITTED",
                 "REASON"});
        std::vector<std::pair<const v1::Job*, int>> order;
        if (tree) {
          order = LineageOrder(jobs);
        } else {
          for (const v1::Job& j : jobs) order.emplace_back(&j, 0);
        }
        for (const auto& [job, depth] : order) {
          const v1::Job& j = *job;
          std::string progress = "-";
          double f = ProgressFraction(j.progress());
          if (f >= 0) {
            progress =
                absl::StrCat("epoch ", std::min(j.progress().epoch() + 1, j.progress().epochs()),
                             "/", j.progress().epochs(), " ", static_cast<int>(f * 100), "%");
          }
          std::string id = j.id();
          if (depth > 0) id = absl::StrCat(std::string(2 * (depth - 1), ' '), "`- ", id);
          t.AddRow({id, j.spec().name(), j.spec().queue().empty() ? "default" : j.spec().queue(),
                    JobStateName(j.state()), absl::StrCat(j.spec().world_size()), progress,
                    absl::StrCat(j.restarts()), Age(j.submit_time(), now),
                    j.state_reason().empty() ? "-" : FirstLine(j.state_reason())});
        }
        t.Print(ctx.out);
        return kExitOk;
      });
}

// --- logs, cancel, workers -------------------------------------------------------

struct LogsFlags {
  std::string job_id;
  bool follow = false;
  int rank = -1;
  int attempt = 0;
  int tail = 0;
};

int RunLogs(CliContext& ctx, const LogsFlags& flags, bool rank_given) {
  if (rank_given && flags.rank < 0)
    return ctx.Fail(absl::InvalidArgumentError("--rank: must be >= 0"));
  if (flags.attempt < 0)
    return ctx.Fail(absl::InvalidArgumentError("--attempt: must be >= 1 (0 = latest)"));
  if (flags.tail < 0) return ctx.Fail(absl::InvalidArgumentError("--tail: must be >= 0"));
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, flags.job_id); },
      [&](Client& client, v1::Job& job) -> int {
        const std::string job_id = job.id();
        // Say what is wrong with --attempt and --rank before any line.
        if (flags.attempt > job.attempts_size()) {
          return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
              "--attempt: ", flags.attempt, " is out of range: job ", job_id, " has ",
              job.attempts_size(), " attempt(s)",
              job.attempts_size() > 0 ? absl::StrCat(" (1..", job.attempts_size(), ")") : " yet")));
        }
        if (rank_given && job.spec().world_size() > 0 && flags.rank >= job.spec().world_size()) {
          return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
              "--rank: ", flags.rank, " is outside job ", job_id, "'s world: world_size ",
              job.spec().world_size(), " (ranks 0..", job.spec().world_size() - 1, ")")));
        }
        if (flags.follow && flags.attempt == 0) {
          // A pending job has no attempt to follow yet: wait until it is placed,
          // so `submit` then `logs -f` shows the first attempt's lines.
          if (job.attempts_size() == 0 && job.state() == v1::JOB_STATE_PENDING) {
            absl::StatusOr<v1::Job> placed =
                client.Watch(job_id, /*include_history=*/false, [](const v1::JobUpdate& u) {
                  return !(u.has_job() && u.job().state() != v1::JOB_STATE_PENDING);
                });
            if (!placed.ok()) return ctx.Fail(placed.status());
          }
        }
        LogsOptions options;
        if (rank_given) options.rank = flags.rank;
        options.attempt = flags.attempt;
        options.tail = flags.tail;
        options.follow = flags.follow;
        absl::Status s = client.Logs(job_id, options, [&](const v1::LogChunk& chunk) {
          if (ctx.json()) {
            ctx.PrintJson(chunk);
          } else {
            // One rank asked for: its lines as they are; all ranks: each line
            // tagged as torchrun's --tee tags it, and as `run` prints it live.
            std::string prefix = rank_given ? "" : absl::StrCat("[rank", chunk.rank(), "]: ");
            if (chunk.dropped_lines() > 0) {
              ctx.err << prefix << "(" << chunk.dropped_lines()
                      << " lines dropped by the worker)\n";
            }
            for (const v1::LogLine& l : chunk.lines()) ctx.out << prefix << l.text() << "\n";
          }
          ctx.out << std::flush;
          return true;
        });
        if (!s.ok()) return ctx.Fail(s);
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddSubmitVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<SubmitFlags>();
  CLI::App* sub = AddVerb(
      app, "submit", "Validate a job.yaml and submit it",
      "  trainctl submit examples/mlp-synthetic.yaml --follow\n"
      "  trainctl submit job.yaml --set world_size=4 --set training.epochs=10\n"
      "  trainctl submit job.yaml --dry-run\n"
      "  trainctl submit --nproc-per-node 4 train.py --epochs 3   # a command job; the current\n"
      "                                     # directory is packed and travels with it\n"
      "  trainctl submit --working-dir ~/proj job.yaml   # a command job.yaml with ~/proj's "
      "code\n");
  sub->add_option("FILE", flags->file, "The job.yaml, or a program to run as every rank (train.py)")
      ->required();
  sub->add_flag("-f,--follow", flags->follow,
                "Watch the job until it ends; exit 0 only when it SUCCEEDED");
  sub->add_flag("--dry-run", flags->dry_run,
                "Validate only; with a coordinator reachable, show where the ranks would run");
  sub->add_option("--set", flags->sets, "Override a field of the file (repeatable)")
      ->type_name("KEY.PATH=VALUE")
      ->allow_extra_args(false);
  sub->add_flag(
      "--wait-for-capacity", flags->wait_for_capacity,
      "Take the job even if the cluster as it is can never run it: it waits for workers to join "
      "(scheduling.wait_for_capacity)");
  sub->add_option("--max-runtime", flags->max_runtime,
                  "Stop the job (checkpoint first) and end it TIMEOUT once it has run this long: "
                  "seconds or 90m, 2h30m (scheduling.max_runtime_s; Slurm's --time)")
      ->type_name("DURATION");
  sub->add_option(
         "--queue", flags->queue,
         "The queue to submit to (overrides the file's queue:; default: the token's first queue, "
         "else default; docs/queues.md)")
      ->type_name("QUEUE");
  sub->add_option("--working-dir", flags->code.working_dir,
                  "The directory packed and uploaded as a command job's code, where its ranks "
                  "start (default: "
                  "the current directory for a program; a job.yaml packs nothing without it)")
      ->type_name("DIR");
  sub->add_flag(
      "--no-upload", flags->code.no_upload,
      "Pack nothing: the current directory (or --working-dir) is a path every worker has (a shared "
      "mount), as command.working_dir");
  AddScriptOptions(sub, &flags->script);
  return [&ctx, flags] { return RunSubmit(ctx, *flags); };
}

VerbRunner AddStatusVerb(CLI::App& app, CliContext& ctx) {
  auto job = std::make_shared<std::string>();
  CLI::App* sub = AddVerb(app, "status", "Show a job's state, progress and times",
                          "  trainctl status mlp-synthetic-7f3a2c\n");
  sub->add_option("JOB", *job, kJobRefOrRunHelp);
  return [&ctx, job] { return RunStatus(ctx, *job); };
}

VerbRunner AddDescribeVerb(CLI::App& app, CliContext& ctx) {
  auto job = std::make_shared<std::string>();
  CLI::App* sub =
      AddVerb(app, "describe", "Show a job in full: spec, attempts, placement, rank exits, events",
              "  trainctl describe mlp-synthetic-7f3a2c\n");
  sub->add_option("JOB", *job, kJobRefOrRunHelp);
  return [&ctx, job] { return RunDescribe(ctx, *job); };
}

VerbRunner AddListVerb(CLI::App& app, CliContext& ctx) {
  auto states = std::make_shared<std::vector<std::string>>();
  auto limit = std::make_shared<int>(0);
  CLI::App* sub =
      AddVerb(app, "list", "List jobs, newest first", "  trainctl list --state running,pending\n");
  sub->add_option("--state", *states,
                  "Only jobs in these states (repeatable or comma separated): pending, scheduled, "
                  "running, restarting, succeeded, failed, cancelled")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name("STATE");
  sub->add_option("--limit", *limit, "At most this many jobs (0 = all)")
      ->check(CLI::NonNegativeNumber);
  auto tree = std::make_shared<bool>(false);
  sub->add_flag(
      "--tree", *tree,
      "Show each continuation (trainctl resume, resume_from) indented under the job it continues");
  return [&ctx, states, limit, tree] { return RunList(ctx, *states, *limit, *tree); };
}

VerbRunner AddLogsVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<LogsFlags>();
  CLI::App* sub = AddVerb(app, "logs", "Print a job's log lines (every rank, latest attempt)",
                          "  trainctl logs mlp-synthetic-7f3a2c -f --rank 0 --tail 100\n");
  sub->add_option("JOB", flags->job_id, kJobRefOrRunHelp);
  sub->add_flag("-f,--follow", flags->follow, "Keep printing new lines until the job ends");
  CLI::Option* rank = sub->add_option("--rank", flags->rank, "Only this rank");
  sub->add_option("--attempt", flags->attempt, "Attempt number (default: the latest)");
  sub->add_option("--tail", flags->tail, "Only the last N lines per rank first");
  return [&ctx, flags, rank] { return RunLogs(ctx, *flags, rank->count() > 0); };
}

}  // namespace trainctl::cli

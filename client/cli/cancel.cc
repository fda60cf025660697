// `trainctl cancel JOB` and the bulk form (--queue, --owner, --state).
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"

namespace trainctl::cli {
namespace {

int RunCancel(CliContext& ctx, const std::string& job_ref, const std::string& reason) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, job_ref); },
      [&](Client& client, v1::Job& target) -> int {
        absl::StatusOr<v1::Job> job = client.Cancel(target.id(), reason);
        if (!job.ok()) return ctx.Fail(job.status());
        if (ctx.json()) {
          ctx.PrintJson(*job);
        } else {
          ctx.out << "job " << job->id() << " " << JobStateName(job->state());
          if (!job->state_reason().empty()) ctx.out << ": " << FirstLine(job->state_reason(), 200);
          ctx.out << "\n";
        }
        return kExitOk;
      });
}

struct BulkCancelFlags {
  std::string queue;
  std::string owner;
  std::vector<std::string> states;
  bool dry_run = false;
  bool yes = false;
};

bool Cancellable(v1::JobState s) {
  return s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_SCHEDULED || s == v1::JOB_STATE_RUNNING ||
         s == v1::JOB_STATE_RESTARTING;
}

void PrintJobIds(std::ostream& out, const v1::CancelJobsResponse& r) {
  for (const std::string& id : r.job_ids()) out << "  " << id << "\n";
}

// `trainctl cancel --queue Q | --owner O | --state S,...`: one CancelJobs
// call. Without --yes the matching jobs are listed first (a dry run) and
// the user confirms on a terminal; a script must say --yes.
int RunBulkCancel(CliContext& ctx, const BulkCancelFlags& f, const std::string& reason) {
  Client::CancelFilter filter{f.queue, f.owner, {}};
  for (const std::string& name : f.states) {
    v1::JobState s;
    if (!ParseJobState(name, &s)) {
      return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
          "--state: unknown state '", name, "'; one of pending, scheduled, running, restarting")));
    }
    if (!Cancellable(s)) {
      return ctx.Fail(absl::InvalidArgumentError(
          absl::StrCat("--state: ", absl::AsciiStrToLower(name),
                       " jobs have ended and cannot be cancelled; one of pending, "
                       "scheduled, running, restarting")));
    }
    filter.states.push_back(s);
  }
  // With --yes (and no --dry-run) the cancel itself is the first call;
  // else a dry run shows what would go first.
  const bool plan_first = f.dry_run || !f.yes;
  auto print_cancelled = [&](const v1::CancelJobsResponse& done) {
    if (ctx.json()) {
      ctx.PrintJson(done);
    } else {
      ctx.out << "cancelled " << done.count() << " job" << (done.count() == 1 ? "" : "s") << "\n";
      PrintJobIds(ctx.out, done);
    }
    return kExitOk;
  };
  return ConnectCallPrint(
      ctx,
      [&](Client& client) { return client.CancelJobs(filter, reason, /*dry_run=*/plan_first); },
      [&](Client& client, v1::CancelJobsResponse& plan) -> int {
        if (!plan_first) return print_cancelled(plan);
        if (f.dry_run) {
          if (ctx.json()) {
            ctx.PrintJson(plan);
          } else {
            ctx.out << plan.count() << " job" << (plan.count() == 1 ? "" : "s")
                    << " would be cancelled (dry run, nothing cancelled)\n";
            PrintJobIds(ctx.out, plan);
          }
          return kExitOk;
        }
        if (plan.count() == 0) {
          if (ctx.json()) {
            ctx.PrintJson(plan);
          } else {
            ctx.out << "no jobs match; nothing cancelled\n";
          }
          return kExitOk;
        }
        ctx.out << plan.count() << " job" << (plan.count() == 1 ? "" : "s") << " match:\n";
        PrintJobIds(ctx.out, plan);
        if (!ctx.env.read_answer) {
          return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
              "stdin is not a terminal, so nothing was cancelled; pass --yes to cancel these ",
              plan.count(), " jobs without a question")));
        }
        ctx.out << "Cancel " << plan.count() << " jobs? [y/N] " << std::flush;
        std::optional<std::string> answer = ctx.env.read_answer();
        const std::string a =
            answer.has_value() ? absl::AsciiStrToLower(absl::StripAsciiWhitespace(*answer)) : "";
        if (a != "y" && a != "yes") {
          ctx.out << "nothing cancelled\n";
          return kExitFailed;
        }
        absl::StatusOr<v1::CancelJobsResponse> done =
            client.CancelJobs(filter, reason, /*dry_run=*/false);
        if (!done.ok()) return ctx.Fail(done.status());
        return print_cancelled(*done);
      });
}

}  // namespace

VerbRunner AddCancelVerb(CLI::App& app, CliContext& ctx) {
  auto job = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto bulk = std::make_shared<BulkCancelFlags>();
  CLI::App* sub =
      AddVerb(app, "cancel",
              "Stop every rank of a job (or of every job a filter matches) and mark it CANCELLED",
              "  trainctl cancel mlp-synthetic-7f3a2c --reason \"wrong learning rate\"\n"
              "  trainctl cancel --queue team-a --state pending --dry-run\n"
              "  trainctl cancel --owner alice --yes\n");
  CLI::Option* job_opt = sub->add_option("JOB", *job, kJobRefHelp);
  sub->add_option("--reason", *reason, "Recorded in the job's events");
  CLI::Option* queue = sub->add_option("--queue", bulk->queue,
                                       "Every job of this queue not yet ended (instead of JOB)");
  CLI::Option* owner =
      sub->add_option("--owner", bulk->owner,
                      "Every job of this owner (token name) not yet ended (instead of JOB)");
  CLI::Option* state =
      sub->add_option("--state", bulk->states,
                      "Only jobs in these states (repeatable or comma separated, instead of JOB): "
                      "pending, scheduled, running, restarting")
          ->delimiter(',')
          ->allow_extra_args(false)
          ->type_name("STATE");
  CLI::Option* dry = sub->add_flag(
      "--dry-run", bulk->dry_run,
      "With --queue/--owner/--state: list the jobs that would be cancelled, cancel none");
  sub->add_flag(
      "-y,--yes", bulk->yes,
      "With --queue/--owner/--state: cancel without asking (needed when stdin is not a terminal)");
  return [&ctx, job, reason, bulk, job_opt, queue, owner, state, dry] {
    const bool filtered = queue->count() > 0 || owner->count() > 0 || state->count() > 0;
    if (job_opt->count() > 0 && filtered) {
      return ctx.Fail(absl::InvalidArgumentError(
          "JOB and --queue/--owner/--state exclude each other: name one job, or filter for many"));
    }
    if (!filtered) {
      if (job_opt->count() == 0) {
        return ctx.Fail(absl::InvalidArgumentError(
            "JOB: name a job, or cancel many with --queue, --owner or --state"));
      }
      if (dry->count() > 0) {
        return ctx.Fail(
            absl::InvalidArgumentError("--dry-run: only with --queue, --owner or --state"));
      }
      return RunCancel(ctx, *job, *reason);
    }
    return RunBulkCancel(ctx, *bulk, *reason);
  };
}

}  // namespace trainctl::cli

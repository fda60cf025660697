// `trainctl checkpoints JOB` (what a job can resume from) and `trainctl
// resume JOB` (a new job that continues from JOB's newest checkpoint).
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "common/jobspec/job_spec.h"

namespace trainctl::cli {
namespace {

std::string SizeText(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  if (bytes >= 1024) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrCat(bytes, " B");
}

int RunCheckpoints(CliContext& ctx, const std::string& job_ref) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, job_ref); },
      [&](v1::Job& job) -> int {
        if (ctx.json()) {
          v1::Job only;
          only.set_id(job.id());
          *only.mutable_checkpoints() = job.checkpoints();
          ctx.PrintJson(only);
          return kExitOk;
        }
        if (job.checkpoints_size() == 0) {
          ctx.out << "job " << job.id() << " has recorded no checkpoint\n";
          return kExitOk;
        }
        std::vector<v1::CheckpointRecord> records(job.checkpoints().begin(),
                                                  job.checkpoints().end());
        std::stable_sort(records.begin(), records.end(),
                         [](const v1::CheckpointRecord& a, const v1::CheckpointRecord& b) {
                           return a.global_step() > b.global_step();
                         });
        Table t({"EPOCHS", "STEP", "JOB", "ATTEMPT", "HOLDER", "SIZE", "CHECKSUM", "PATH"});
        for (const v1::CheckpointRecord& r : records) {
          t.AddRow({absl::StrCat(r.epochs_done()), absl::StrCat(r.global_step()), r.job_id(),
                    absl::StrCat(r.attempt()), r.shared() ? "shared" : r.worker_id(),
                    SizeText(r.size_bytes()), r.checksum(), r.path()});
        }
        t.Print(ctx.out);
        return kExitOk;
      });
}

struct ResumeFlags {
  std::string job_id;
  std::vector<std::string> sets;
  bool follow = false;
};

int RunResume(CliContext& ctx, const ResumeFlags& flags) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, flags.job_id); },
      [&](Client& client, v1::Job& source) -> int {
        const std::string& source_id = source.id();
        // The source's spec as job.yaml, with the user's --set on top: the same
        // checks and messages as a submitted file.
        v1::JobSpec base = source.spec();
        base.clear_resume_from();
        // The resolved dir had "{job_id}" replaced; the new job keeps the source's
        // directory unless --set changes it (files are named by job, so they never mix).
        ParsedJobSpec parsed =
            ParseJobSpecYaml(JobSpecToYaml(base), absl::StrCat("job ", source_id), flags.sets);
        if (!parsed.ok()) {
          for (const SpecError& e : parsed.errors) ctx.err << e.ToString() << "\n";
          ctx.err << std::flush;
          return kExitUsage;
        }
        v1::JobSpec spec = parsed.spec;
        spec.mutable_resume_from()->set_job(source_id);
        absl::StatusOr<v1::Job> job = client.Submit(spec);
        if (!job.ok()) return ctx.Fail(job.status());
        if (ctx.json()) {
          ctx.PrintJson(*job);
        } else {
          ctx.out << "submitted job " << job->id() << ", continuing " << source_id;
          if (job->checkpoints_size() > 0) {
            const v1::CheckpointRecord& r = job->checkpoints(0);
            ctx.out << " from epoch " << r.epochs_done() << " (step " << r.global_step() << ")";
          }
          // A command job's epochs are its program's (trainctl.load_checkpoint()).
          if (!job->spec().has_command())
            ctx.out << " to epoch " << job->spec().training().epochs();
          ctx.out << "\n";
        }
        ctx.out << std::flush;
        if (!flags.follow) return kExitOk;
        return FollowJob(ctx, client, job->id());
      });
}

}  // namespace

VerbRunner AddCheckpointsVerb(CLI::App& app, CliContext& ctx) {
  auto job = std::make_shared<std::string>();
  CLI::App* sub =
      AddVerb(app, "checkpoints", "List the checkpoints a job can resume from, newest first",
              "  trainctl checkpoints mlp-synthetic-7f3a2c\n");
  sub->add_option("JOB", *job, kJobRefOrRunHelp);
  return [&ctx, job] { return RunCheckpoints(ctx, *job); };
}

VerbRunner AddResumeVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<ResumeFlags>();
  CLI::App* sub = AddVerb(
      app, "resume",
      "Submit a new job that continues JOB (cancelled, failed or finished) from its newest "
      "checkpoint",
      "  trainctl resume mlp-synthetic-7f3a2c --follow\n"
      "  trainctl resume mlp-synthetic-7f3a2c --set training.epochs=10   # train 10 epochs in all\n"
      "Changes that keep the checkpoint loadable are allowed (epochs, learning rate, data, "
      "world_size);\n"
      "a different model or optimizer is refused naming the field.\n");
  sub->add_option("JOB", flags->job_id, absl::StrCat("The job to continue: ", kJobRefHelp))
      ->required();
  sub->add_option("--set", flags->sets, "Override a field of JOB's spec (repeatable)")
      ->type_name("KEY.PATH=VALUE")
      ->allow_extra_args(false);
  sub->add_flag("-f,--follow", flags->follow,
                "Watch the new job until it ends; exit 0 only when it SUCCEEDED");
  return [&ctx, flags] { return RunResume(ctx, *flags); };
}

}  // namespace trainctl::cli

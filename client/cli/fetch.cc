// `trainctl fetch JOB [--checkpoint STEP] [-O FILE] [--force]`: a job's final
// model or one of its checkpoints, from the worker that holds it, through the
// coordinator. Written to a new temporary file beside FILE (mode 0600,
// created without following links) and renamed to FILE only once the bytes
// match the file's checksum, so FILE is never a partial or damaged copy.
//
// FILE is what the user said, or a name made of the job id and the step: never
// a name the job chose (a job reporting "/x/.bashrc" must not overwrite the
// caller's ~/.bashrc). An existing FILE is kept unless --force.
#include <sys/stat.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "common/safe_file.h"

namespace trainctl::cli {
namespace {

struct FetchFlags {
  std::string job_id;
  int64_t checkpoint_step = 0;
  std::string out;
  bool force = false;
};

// "<job>-model.pt", "<job>-step-<N>.pt"; a job id holds no '/' (the
// coordinator makes it), but one from the command line might: keep the name
// in the current directory whatever it holds.
std::string DefaultOutName(const std::string& job_id, int64_t step) {
  std::string job = job_id;
  for (char& c : job) {
    if (c == '/') c = '_';
  }
  if (job.empty() || job[0] == '.') job = "job" + job;
  return step > 0 ? absl::StrCat(job, "-step-", step, ".pt") : absl::StrCat(job, "-model.pt");
}

int RunFetch(CliContext& ctx, const FetchFlags& f) {
  if (f.checkpoint_step < 0) {
    return ctx.Fail(
        absl::InvalidArgumentError("--checkpoint: a global step > 0 (trainctl checkpoints JOB)"));
  }
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, f.job_id); },
      [&](Client& client, v1::Job& job) -> int {
        const std::string out = f.out.empty() ? DefaultOutName(job.id(), f.checkpoint_step) : f.out;
        // Refused before anything is downloaded; the rename checks again (no
        // replace), so a file appearing meanwhile is not overwritten either.
        struct stat st {};
        if (!f.force && ::lstat(out.c_str(), &st) == 0) {
          return ctx.Fail(absl::AlreadyExistsError(
              absl::StrCat(out, " exists; not overwritten (--force to replace it)")));
        }
        absl::StatusOr<std::unique_ptr<SafeFileWriter>> file =
            SafeFileWriter::Create(out, PrivateFile(/*replace=*/f.force));
        if (!file.ok())
          return ctx.Fail(
              absl::Status(file.status().code(), absl::StrCat("-O: ", file.status().message())));
        absl::StatusOr<v1::ArtifactChunk> head =
            client.Fetch(job.id(), f.checkpoint_step, (*file)->stream());
        // A failed fetch drops the temporary file with the writer.
        if (!head.ok()) return ctx.Fail(head.status());
        if (absl::Status s = (*file)->Commit(); !s.ok()) {
          if (absl::IsAlreadyExists(s)) {
            return ctx.Fail(absl::AlreadyExistsError(
                absl::StrCat(out, " exists; not overwritten (--force to replace it)")));
          }
          return ctx.Fail(absl::Status(s.code(), absl::StrCat("-O: ", s.message())));
        }
        if (ctx.json()) {
          ctx.PrintJson(*head);
        } else {
          ctx.out << "wrote " << out << " (" << head->size() << " bytes, " << head->checksum()
                  << ") from " << head->path() << " on " << head->worker_id() << "\n"
                  << "load it: " << LoadHint(IsTorchScriptFile(out)) << "\n";
        }
        ctx.out << std::flush;
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddFetchVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<FetchFlags>();
  CLI::App* sub =
      AddVerb(app, "fetch",
              "Download a job's final model or a checkpoint from the worker that holds it "
              "(checksum verified)",
              "  trainctl fetch mlp-synthetic-7f3a2c                     # the final model: "
              "mlp-synthetic-7f3a2c-model.pt\n"
              "  trainctl fetch mlp-synthetic-7f3a2c --checkpoint 400    # "
              "mlp-synthetic-7f3a2c-step-400.pt\n"
              "  trainctl fetch mlp-synthetic-7f3a2c --checkpoint 400 -O ckpt.pt --force\n",
              "Examples:");
  sub->add_option("JOB", flags->job_id, kJobRefHelp)->required();
  sub->add_option(
      "--checkpoint", flags->checkpoint_step,
      "The checkpoint at this global step (trainctl checkpoints JOB) instead of the final model");
  sub->add_option("-O,--out-file", flags->out,
                  "Where to write it, mode 0600 (default: JOB-model.pt, or JOB-step-STEP.pt with "
                  "--checkpoint, in "
                  "the current directory)");
  sub->add_flag("--force", flags->force,
                "Replace FILE when it exists (default: refuse, keeping it)");
  return [&ctx, flags] { return RunFetch(ctx, *flags); };
}

}  // namespace trainctl::cli

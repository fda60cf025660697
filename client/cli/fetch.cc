// `trainctl fetch JOB [--checkpoint STEP] [-O FILE]`: a job's final model or
// one of its checkpoints, from the worker that holds it, through the
// coordinator. Written to FILE.part and renamed to FILE only once the bytes
// match the file's checksum, so FILE is never a partial or damaged copy.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/cli/context.h"

namespace trainctl::cli {
namespace {

struct FetchFlags {
  std::string job_id;
  int64_t checkpoint_step = 0;
  std::string out;
};

int RunFetch(CliContext& ctx, const FetchFlags& f) {
  if (f.checkpoint_step < 0) {
    return ctx.Fail(absl::InvalidArgumentError("--checkpoint: a global step > 0 (trainctl checkpoints JOB)"));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = ctx.Connect();
  if (!client.ok()) return ctx.Fail(client.status());
  std::string out = f.out;
  if (out.empty()) {
    // The holder's file name, in the current directory.
    absl::StatusOr<v1::Job> job = (*client)->Get(f.job_id);
    if (!job.ok()) return ctx.Fail(job.status());
    std::string path = job->final_model();
    for (const v1::CheckpointRecord& r : job->checkpoints()) {
      if (f.checkpoint_step > 0 && r.global_step() == f.checkpoint_step) path = r.path();
    }
    out = std::filesystem::path(path).filename().string();
    if (out.empty()) out = absl::StrCat(f.job_id, f.checkpoint_step > 0 ? absl::StrCat(".step-", f.checkpoint_step) : ".model");
  }
  const std::string part = out + ".part";
  std::ofstream file(part, std::ios::binary | std::ios::trunc);
  if (!file) return ctx.Fail(absl::InvalidArgumentError(absl::StrCat("-O: cannot write ", part)));
  absl::StatusOr<v1::ArtifactChunk> head = (*client)->Fetch(f.job_id, f.checkpoint_step, file);
  file.close();
  if (head.ok() && !file) head = absl::InternalError(absl::StrCat("-O: writing ", part, " failed"));
  if (!head.ok()) {
    std::remove(part.c_str());
    return ctx.Fail(head.status());
  }
  if (std::rename(part.c_str(), out.c_str()) != 0) {
    std::remove(part.c_str());
    return ctx.Fail(absl::InternalError(absl::StrCat("-O: cannot rename ", part, " to ", out)));
  }
  if (ctx.json()) {
    ctx.PrintJson(*head);
  } else {
    ctx.out << "wrote " << out << " (" << head->size() << " bytes, " << head->checksum() << ") from "
            << head->path() << " on " << head->worker_id() << "\n";
  }
  ctx.out << std::flush;
  return kExitOk;
}

}  // namespace

VerbRunner AddFetchVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<FetchFlags>();
  CLI::App* sub = AddVerb(
      app, "fetch", "Download a job's final model or a checkpoint from the worker that holds it (checksum verified)",
      "  trainctl fetch mlp-synthetic-7f3a2c                     # the final model, named as on the worker\n"
      "  trainctl fetch mlp-synthetic-7f3a2c --checkpoint 400 -O ckpt.pt\n",
      "Examples:");
  sub->add_option("JOB", flags->job_id, "Job id")->required();
  sub->add_option("--checkpoint", flags->checkpoint_step,
                  "The checkpoint at this global step (trainctl checkpoints JOB) instead of the final model");
  sub->add_option("-O,--out-file", flags->out,
                  "Where to write it (default: the file's name on the worker, in the current directory)");
  return [&ctx, flags] { return RunFetch(ctx, *flags); };
}

}  // namespace trainctl::cli

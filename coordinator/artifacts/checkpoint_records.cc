#include "coordinator/artifacts/checkpoint_records.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/jobspec/artifact_names.h"

namespace trainctl::coordinator {
namespace {

bool SameHolder(const v1::CheckpointRecord& a, const v1::CheckpointRecord& b) {
  return a.job_id() == b.job_id() && a.worker_id() == b.worker_id() && a.shared() == b.shared();
}

}  // namespace

bool SameCopy(const v1::CheckpointRecord& a, const v1::CheckpointRecord& b) {
  return SameHolder(a, b) && a.path() == b.path();
}

std::vector<const v1::CheckpointRecord*> NewestRecords(const v1::Job& job) {
  std::vector<const v1::CheckpointRecord*> out;
  for (const v1::CheckpointRecord& r : job.checkpoints()) {
    if (!out.empty() && r.global_step() < out.front()->global_step()) continue;
    if (!out.empty() && r.global_step() > out.front()->global_step()) out.clear();
    out.push_back(&r);
  }
  return out;
}

std::string Holder(const v1::CheckpointRecord& r) {
  return r.shared() ? "the shared checkpoint dir" : absl::StrCat("worker ", r.worker_id());
}

std::string DescribeRecord(const v1::CheckpointRecord& r) {
  return absl::StrCat("the checkpoint of job ", r.job_id(), " at epoch ", r.epochs_done(),
                      " (step ", r.global_step(), ") on ", Holder(r));
}

absl::Status ValidateReportedCheckpoint(const v1::CheckpointRecord& in) {
  if (in.path().empty() || in.path()[0] != '/' || in.path().size() > 4096 ||
      in.path().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        "checkpoint.record.path: must be an absolute path of at most 4096 bytes");
  }
  if (in.checksum().size() > 64)
    return absl::InvalidArgumentError("checkpoint.record.checksum: at most 64 bytes");
  // epochs_done is 0 for a checkpoint inside the first epoch (checkpoint.every_steps).
  if (in.epochs_done() < 0 || in.global_step() < 1 || in.size_bytes() < 0) {
    return absl::InvalidArgumentError(
        "checkpoint.record: epochs_done must be >= 0, global_step >= 1 and size_bytes >= 0");
  }
  return absl::OkStatus();
}

absl::Status CheckArtifactPath(const v1::Job& job, const std::string& path, bool final_model,
                               const std::string& field) {
  const std::string name_rule = final_model
                                    ? FinalModelFileName(job.id())
                                    : absl::StrCat(job.id(), ".ckpt-epoch-NNNNNN[-CCCCCCCCCC].pt");
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const bool named =
      final_model ? IsFinalModelFileName(job.id(), name) : IsCheckpointFileName(job.id(), name);
  const std::string& spec_dir = job.spec().checkpoint().dir();
  bool inside = false;
  std::string where;
  if (spec_dir.empty()) {
    inside = absl::EndsWith(dir, absl::StrCat("/jobs/", job.id(), "/checkpoints")) ||
             absl::EndsWith(dir, absl::StrCat("/", OwnerPathComponent(job.owner()), "/", job.id()));
    where = absl::StrCat("<work dir>/jobs/", job.id(), "/checkpoints or <checkpoint root>/",
                         OwnerPathComponent(job.owner()), "/", job.id());
  } else if (spec_dir[0] == '/') {
    where = NormalDirPath(spec_dir);
    inside = dir == where;
  } else {
    // Relative: resolved against the worker's working directory, which the
    // coordinator does not know; the directory must end in it.
    const std::string normal = NormalDirPath(spec_dir);
    absl::string_view tail = normal;
    while (absl::ConsumePrefix(&tail, "../")) {
    }
    inside =
        tail.empty() || tail == "." || tail == ".." || absl::EndsWith(dir, absl::StrCat("/", tail));
    where = absl::StrCat("<worker dir>/", tail);
  }
  if (named && inside && dir.find("/../") == std::string::npos && !absl::EndsWith(dir, "/..")) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": '", path, "' is not ", final_model ? "the final model" : "a checkpoint", " of job ",
      job.id(), " in its checkpoint.dir (expected ", where, "/", name_rule, "); not recorded"));
}

std::optional<std::pair<std::string, std::string>> DirOwnerFromRecords(
    const std::vector<const v1::Job*>& jobs, const std::string& dir) {
  const v1::Job* first = nullptr;
  for (const v1::Job* j : jobs) {
    const std::string& d = j->spec().checkpoint().dir();
    if (d.empty() || d[0] != '/' || NormalDirPath(d) != dir) continue;
    auto earlier = [](const v1::Job& a, const v1::Job& b) {
      return std::make_pair(a.submit_time().seconds(), a.submit_time().nanos()) <
             std::make_pair(b.submit_time().seconds(), b.submit_time().nanos());
    };
    if (first == nullptr || earlier(*j, *first)) first = j;
  }
  if (first == nullptr) return std::nullopt;
  return std::make_pair(first->owner(), first->id());
}

std::string AddCheckpointRecord(v1::Job& next, const v1::CheckpointRecord& r,
                                std::vector<v1::CheckpointRecord>* dropped) {
  const v1::Attempt* current =
      next.attempts().empty() ? nullptr : &next.attempts(next.attempts_size() - 1);
  auto resumed_now = [&](const v1::CheckpointRecord& x) {
    return current != nullptr && current->has_resume() && SameCopy(current->resume(), x);
  };
  std::vector<int64_t> steps;
  for (const v1::CheckpointRecord& x : next.checkpoints()) {
    if (SameHolder(x, r) && x.global_step() != r.global_step()) steps.push_back(x.global_step());
  }
  steps.push_back(r.global_step());
  std::sort(steps.rbegin(), steps.rend());
  const int64_t keep = std::max<int64_t>(1, next.spec().checkpoint().keep());
  const int64_t oldest_kept = steps[static_cast<size_t>(std::min<int64_t>(keep, steps.size()) - 1)];
  google::protobuf::RepeatedPtrField<v1::CheckpointRecord> kept;
  for (const v1::CheckpointRecord& x : next.checkpoints()) {
    const bool replaced = SameHolder(x, r) && x.global_step() == r.global_step();
    const bool too_old = SameHolder(x, r) && x.global_step() < oldest_kept && !resumed_now(x);
    if (!replaced && !too_old) {
      *kept.Add() = x;
      continue;
    }
    if (dropped != nullptr && x.job_id() == next.id() && x.path() != r.path())
      dropped->push_back(x);
  }
  *kept.Add() = r;
  *next.mutable_checkpoints() = std::move(kept);
  const std::string where = absl::StrCat(" (step ", r.global_step(), ") on ", Holder(r), ": ",
                                         r.path(), " (", r.size_bytes(), " bytes)");
  if (r.epoch_consumed() > 0) {
    return absl::StrCat("checkpoint inside epoch ", r.epochs_done() + 1, " after ",
                        r.epoch_consumed(), " samples", where);
  }
  return absl::StrCat("checkpoint at epoch ", r.epochs_done(), where);
}

std::pair<std::optional<v1::CheckpointRecord>, std::string> ChooseResume(
    const v1::Job& job, scheduler::Placement& p, const WorkerRegistry& registry) {
  if (job.checkpoints_size() == 0) return {std::nullopt, ""};
  std::vector<const v1::CheckpointRecord*> newest = NewestRecords(job);
  auto holds = [](const v1::CheckpointRecord& r, const std::string& worker) {
    return r.shared() || r.worker_id() == worker;
  };
  scheduler::PreferNodeZero(p, [&](const std::string& w) {
    return std::any_of(newest.begin(), newest.end(),
                       [&](const v1::CheckpointRecord* r) { return holds(*r, w); });
  });
  const std::string rank0 = p.ranks.empty() ? "" : p.ranks.front().worker_id;
  // Newest first; the first record rank 0's host can read wins.
  std::vector<const v1::CheckpointRecord*> all;
  for (const v1::CheckpointRecord& r : job.checkpoints()) all.push_back(&r);
  std::stable_sort(all.begin(), all.end(),
                   [](const v1::CheckpointRecord* a, const v1::CheckpointRecord* b) {
                     return a->global_step() > b->global_step();
                   });
  auto unreachable = [&](const v1::CheckpointRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
    const v1::Worker* w = registry.Find(r.worker_id());
    std::string why = w == nullptr || w->state() != v1::WORKER_STATE_ALIVE
                          ? absl::StrCat("worker ", r.worker_id(), " is not alive")
                          : absl::StrCat("worker ", r.worker_id(), " is not in this placement");
    return absl::StrCat(DescribeRecord(r), " is unreachable (", why, ")");
  };
  for (const v1::CheckpointRecord* r : all) {
    if (!holds(*r, rank0)) continue;
    std::string words = absl::StrCat("resuming from ", DescribeRecord(*r));
    if (r->global_step() < newest.front()->global_step()) {
      absl::StrAppend(&words, "; the newer ", unreachable(*newest.front()));
    }
    return {*r, words};
  }
  return {std::nullopt, absl::StrCat("starting from scratch: ", unreachable(*newest.front()))};
}

}  // namespace trainctl::coordinator

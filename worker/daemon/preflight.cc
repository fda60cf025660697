#include "worker/daemon/preflight.h"

#include <dlfcn.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/job_spec.h"
#include "common/safe_file.h"
#include "worker/daemon/job_dir.h"
#include "worker/daemon/path_policy.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;

// The first `n` bytes of a file, or an error text.
bool ReadHead(const std::string& path, size_t n, std::string* head, std::string* why) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    *why = "no such file";
    return false;
  }
  if (fs::is_directory(path, ec)) {
    *why = "is a directory, not a file";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *why = absl::StrCat("cannot be read (", std::strerror(errno), ")");
    return false;
  }
  head->assign(n, '\0');
  in.read(head->data(), static_cast<std::streamsize>(n));
  head->resize(static_cast<size_t>(in.gcount()));
  return true;
}

// IDX: two zero bytes, type 0x08 (unsigned byte), then the dimension count.
// A gzip file (MNIST ships them so) is checked by the rank when it inflates it.
std::string CheckIdx(const std::string& head, int dims) {
  if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
      static_cast<unsigned char>(head[1]) == 0x8b) {
    return "";
  }
  if (head.size() < 4) return "is shorter than an IDX header (4 bytes)";
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08)
    return "has no IDX header (expected 00 00 08 ..)";
  if (head[3] != dims)
    return absl::StrCat("is an IDX file of ", static_cast<int>(head[3]), " dimensions, expected ",
                        dims);
  return "";
}

void CheckFile(const std::string& field, const std::string& path, const std::string& kind,
               std::vector<std::string>* problems) {
  std::string head, why;
  if (!ReadHead(path, 8, &head, &why)) {
    problems->push_back(absl::StrCat(field, " ", path, ": ", why));
    return;
  }
  if (kind == "idx3") why = CheckIdx(head, 3);
  if (kind == "idx1") why = CheckIdx(head, 1);
  if (kind == "csv" && head.empty()) why = "is empty";
  if (kind == "zip" && head.rfind("PK\x03\x04", 0) != 0)
    why = "is not a torch.save/TorchScript zip archive";
  if (!why.empty()) problems->push_back(absl::StrCat(field, " ", path, ": ", why));
}

void CheckEngineFiles(const v1::JobSpec& spec, const PreflightContext& ctx,
                      std::vector<std::string>* problems) {
  rankproto::FlatConfig flat = JobSpecToFlat(spec);
  if (absl::Status s = ResolveDataPaths(flat, ctx.base_dir, ctx.data_roots, ctx.data_roots_name);
      !s.ok()) {
    problems->push_back(std::string(s.message()));
    return;
  }
  auto get = [&](const std::string& k) {
    auto it = flat.find(k);
    return it == flat.end() ? std::string() : it->second;
  };
  for (const std::string split : {"data.train", "data.eval"}) {
    const std::string format = get(split + ".format");
    if (format == "idx") {
      CheckFile(split + ".images", get(split + ".images"), "idx3", problems);
      CheckFile(split + ".labels", get(split + ".labels"), "idx1", problems);
    } else if (format == "csv") {
      CheckFile(split + ".path", get(split + ".path"), "csv", problems);
    } else if (format == "tensors") {
      CheckFile(split + ".path", get(split + ".path"), "zip", problems);
    }
  }
  if (!get("model.path").empty()) CheckFile("model.path", get("model.path"), "zip", problems);
}

bool IsNoSpace(int err) { return err == ENOSPC || err == EDQUOT; }

void CheckCheckpointDir(const v1::JobSpec& spec, const PreflightContext& ctx,
                        std::vector<std::string>* problems, int* space_problems) {
  absl::StatusOr<CheckpointDir> d = ResolveCheckpointDir(spec, ctx.job_id, ctx.owner, ctx.work_dir,
                                                         ctx.base_dir, ctx.checkpoint_roots);
  if (!d.ok()) {
    problems->push_back(std::string(d.status().message()));
    return;
  }
  const std::string dir = d->path;
  // The launch's own path (job_dir.h): made and opened by a walk that
  // follows no link, probed, its claim checked, as the ranks' user.
  int err = 0;
  absl::StatusOr<int> opened = OpenCheckpointDir(dir, ctx.owner, ctx.resume_owner,
                                                 ctx.manifest_writers, ctx.as_rank_user, &err);
  if (!opened.ok()) {
    if (IsNoSpace(err)) ++*space_problems;
    problems->push_back(std::string(opened.status().message()));
    return;
  }
  struct statvfs st {};
  const bool stat_ok = ::fstatvfs(*opened, &st) == 0;
  ::close(*opened);
  if (ctx.checkpoint_bytes > 0 && stat_ok) {
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    if (free_bytes < static_cast<uint64_t>(ctx.checkpoint_bytes)) {
      ++*space_problems;
      problems->push_back(absl::StrCat("checkpoint.dir ", dir, ": ", free_bytes,
                                       " bytes free, one checkpoint needs ", ctx.checkpoint_bytes));
    }
  }
}

void CheckCommand(const v1::JobSpec& spec, const PreflightContext& ctx,
                  std::vector<std::string>* problems) {
  if (!ctx.allow_commands) {
    problems->push_back(
        "this worker does not run commands (start trainctl-worker with --allow-commands)");
    return;
  }
  const v1::CommandSpec& cmd = spec.command();
  std::error_code ec;
  std::string dir = ctx.base_dir;
  const bool code =
      cmd.has_code();  // working_dir and a relative program: inside the code, not here yet
  if (!code && !cmd.working_dir().empty()) {
    absl::StatusOr<std::string> d =
        ResolveJobPath("command.working_dir", cmd.working_dir(), ctx.base_dir,
                       ctx.command_dir_roots, "--data-root");
    if (!d.ok()) {
      problems->push_back(std::string(d.status().message()));
      return;
    }
    if (!fs::is_directory(*d, ec)) {
      problems->push_back(
          absl::StrCat("command.working_dir ", *d, ": not a directory on this worker"));
      return;
    }
    dir = *d;
  }
  if (cmd.argv().empty()) return;  // refused at submission
  const std::string& program = cmd.argv(0);
  // A script submitted as `trainctl run/submit train.py` runs under its
  // --python (default python3): say where that came from.
  const std::string base = fs::path(program).filename().string();
  const std::string interpreter = absl::StartsWith(base, "python")
                                      ? " (the Python interpreter: `trainctl run/submit --python`)"
                                      : "";
  if (program.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    const std::string search = path != nullptr ? path : "/usr/bin:/bin";
    for (absl::string_view d : absl::StrSplit(search, ':')) {
      std::string candidate = absl::StrCat(d.empty() ? "." : d, "/", program);
      if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) return;
    }
    problems->push_back(absl::StrCat(
        "command.argv[0] ", program, ": not found on this worker's PATH (",
        search.size() > 512 ? search.substr(0, 512) + "..." : search, ")", interpreter));
    return;
  }
  // A relative program resolves against the working directory (the rank's
  // scratch directory when none is set: that one the daemon makes, so only
  // an absolute path or a working_dir can be checked).
  if (program[0] != '/' && (code || cmd.working_dir().empty())) return;
  const std::string resolved =
      program[0] == '/' ? program : (fs::path(dir) / program).lexically_normal().string();
  if (::access(resolved.c_str(), X_OK) != 0) {
    problems->push_back(absl::StrCat("command.argv[0] ", resolved, ": ",
                                     fs::exists(resolved, ec) ? "not executable" : "no such file",
                                     interpreter));
  }
}

void CheckGpus(const v1::JobSpec& spec, const PreflightContext& ctx,
               std::vector<std::string>* problems) {
  if (ctx.gpu_indices.empty()) return;
  std::error_code ec;
  for (int i : ctx.gpu_indices) {
    const std::string node = absl::StrCat(ctx.dev_dir, "/nvidia", i);
    if (!fs::exists(node, ec)) {
      problems->push_back(absl::StrCat("GPU ", i, ": ", node,
                                       " is missing (the device is not visible to this worker)"));
    }
  }
  if (spec.has_command()) return;  // the user's program brings its own NCCL
  void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    problems->push_back(absl::StrCat("NCCL: libnccl.so.2 does not load on this worker (",
                                     why != nullptr ? why : "unknown", ")"));
    return;
  }
  ::dlclose(lib);
}

}  // namespace

std::vector<std::string> PreflightProblems(const v1::JobSpec& spec, const PreflightContext& ctx,
                                           int* space_problems) {
  int space = 0;
  if (space_problems == nullptr) space_problems = &space;
  *space_problems = 0;
  std::vector<std::string> problems;
  if (spec.has_command()) {
    CheckCommand(spec, ctx, &problems);
  } else {
    CheckEngineFiles(spec, ctx, &problems);
  }
  CheckCheckpointDir(spec, ctx, &problems, space_problems);
  CheckGpus(spec, ctx, &problems);
  return problems;
}

}  // namespace trainctl::worker

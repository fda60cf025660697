#include "worker/trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/jobspec/artifact_names.h"
#include "common/safe_file.h"
#include "common/status_macros.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "ckpt-epoch-";
constexpr char kSuffix[] = ".pt";
// 2: the manifest (job_id, attempt, spec_hash) and job-named files.
constexpr int64_t kFormatVersion = 2;

std::string FilePrefix(const std::string& job_id) {
  return job_id.empty() ? std::string(kPrefix) : absl::StrCat(job_id, ".", kPrefix);
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  // Two literal formats: absl checks a format at compile time (clang
  // refuses one chosen at run time).
  return u == 0 ? absl::StrFormat("%.0f %s", b, units[u]) : absl::StrFormat("%.1f %s", b, units[u]);
}

// Free bytes for an unprivileged writer on the filesystem holding `dir`, or -1.
int64_t FreeBytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

absl::Status FsyncFd(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open '", path, "' for fsync failed"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat("fsync '", path, "' failed"));
  return absl::OkStatus();
}

// Parameters or buffers as a nested archive: t0..tN plus their names.
void WriteNamed(torch::serialize::OutputArchive& archive, const std::string& key,
                const engine::NamedTensors& tensors) {
  torch::serialize::OutputArchive sub;
  std::vector<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back(tensors[i].first);
    sub.write(absl::StrCat("t", i), tensors[i].second.detach().cpu());
  }
  sub.write("names", c10::IValue(absl::StrJoin(names, "\n")));
  archive.write(key, sub);
}

absl::Status ReadNamed(torch::serialize::InputArchive& archive, const std::string& key,
                       const engine::NamedTensors& into, const std::string& path) {
  torch::serialize::InputArchive sub;
  archive.read(key, sub);
  c10::IValue names_value;
  sub.read("names", names_value);
  std::vector<std::string> names;
  if (!names_value.toStringRef().empty()) names = absl::StrSplit(names_value.toStringRef(), '\n');
  std::vector<std::string> expected;
  for (const auto& [name, t] : into) expected.push_back(name);
  if (names != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' was written for another model: its ", key, " are [",
        absl::StrJoin(names, ", "), "], this model has [", absl::StrJoin(expected, ", "), "]"));
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < into.size(); ++i) {
    at::Tensor saved;
    sub.read(absl::StrCat("t", i), saved);
    at::Tensor dst = into[i].second;
    if (!saved.sizes().equals(dst.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint '", path, "': ", into[i].first, " has shape ",
                       c10::str(saved.sizes()), ", the model expects ", c10::str(dst.sizes())));
    }
    dst.copy_(saved);
  }
  return absl::OkStatus();
}

std::string ReadString(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toStringRef();
}

int64_t ReadInt(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

double ReadDouble(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toDouble();
}

}  // namespace

std::string CheckpointPath(const std::string& dir, const std::string& job_id, int64_t epochs_done,
                           int64_t epoch_consumed, const std::string& writer) {
  const std::string tag = writer.empty() ? "" : absl::StrCat(".", writer);
  if (epoch_consumed > 0) {
    return absl::StrFormat("%s/%s%06d-%010d%s%s", dir, FilePrefix(job_id), epochs_done,
                           epoch_consumed, tag, kSuffix);
  }
  return absl::StrFormat("%s/%s%06d%s%s", dir, FilePrefix(job_id), epochs_done, tag, kSuffix);
}

namespace {

// (epochs done, positions consumed, writer, path) of `job_id`'s checkpoints
// in `dir`, oldest first.
std::vector<std::tuple<int64_t, int64_t, std::string, std::string>> FindCheckpoints(
    const std::string& dir, const std::string& job_id) {
  const std::string prefix = FilePrefix(job_id);
  std::vector<std::tuple<int64_t, int64_t, std::string, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t plen = prefix.size(), slen = sizeof(kSuffix) - 1;
    if (name.size() <= plen + slen || name.compare(0, plen, prefix) != 0 ||
        name.compare(name.size() - slen, slen, kSuffix) != 0) {
      continue;
    }
    std::optional<CheckpointNameParts> parts =
        ParseCheckpointStem(name.substr(plen, name.size() - plen - slen));
    if (!parts.has_value()) continue;
    found.emplace_back(parts->epochs_done, parts->epoch_consumed, parts->writer,
                       it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::vector<std::string> ListCheckpoints(const std::string& dir, const std::string& job_id) {
  std::vector<std::string> out;
  for (auto& f : FindCheckpoints(dir, job_id)) out.push_back(std::move(std::get<3>(f)));
  return out;
}

std::string LatestCheckpoint(const std::string& dir, const std::string& job_id) {
  std::vector<std::string> all = ListCheckpoints(dir, job_id);
  return all.empty() ? "" : all.back();
}

std::string ChecksumOf(std::string_view bytes) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size());
  return absl::StrFormat("crc32:%08x", static_cast<uint32_t>(crc));
}

absl::Status CheckCheckpointDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint dir '", dir, "' cannot be created: ", ec.message()));
  }
  // Created with O_EXCL|O_NOFOLLOW and removed: a link planted at the
  // probe's name (the directory is the job's) is never written through.
  absl::Status probe = ProbeWritableDir(dir, absl::StrCat(".trainctl-write-probe.", ::getpid()));
  if (!probe.ok()) {
    const int err = SafeFileErrno(probe);
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint dir '", dir,
                     "' is not writable: ", err != 0 ? std::strerror(err) : probe.message()));
  }
  return absl::OkStatus();
}

absl::Status SyncFileAndDir(const std::string& path) {
  TRAINCTL_RETURN_IF_ERROR(FsyncFd(path, O_RDONLY));
  std::string dir = fs::path(path).parent_path().string();
  return FsyncFd(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(const std::string& dir, int64_t keep,
                                                  const CheckpointManifest& manifest,
                                                  const TrainingPosition& position,
                                                  engine::Model& model,
                                                  torch::optim::Optimizer& optimizer, FileEnv* env,
                                                  const dist::PowerSgdState* powersgd) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint dir '", dir, "': ", ec.message()));
  }
  WrittenCheckpoint out;
  out.path = CheckpointPath(dir, manifest.job_id, position.epochs_done, position.epoch_consumed,
                            manifest.writer);
  std::string bytes;
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", c10::IValue(kFormatVersion));
    archive.write("job_id", c10::IValue(manifest.job_id));
    archive.write("attempt", c10::IValue(manifest.attempt));
    archive.write("spec_hash", c10::IValue(manifest.spec_hash));
    archive.write("epochs_done", c10::IValue(position.epochs_done));
    archive.write("global_step", c10::IValue(position.global_step));
    archive.write("skipped_steps", c10::IValue(position.skipped_steps));
    archive.write("loss_scale", c10::IValue(position.loss_scale));
    archive.write("scaler_growth_tracker", c10::IValue(position.scaler_growth_tracker));
    archive.write("data_seed", c10::IValue(static_cast<int64_t>(position.data_seed)));
    archive.write("world_size", c10::IValue(position.world_size));
    archive.write("epoch_consumed", c10::IValue(position.epoch_consumed));
    WriteNamed(archive, "params", model.NamedParameters());
    WriteNamed(archive, "buffers", model.NamedBuffers());
    torch::serialize::OutputArchive opt;
    optimizer.save(opt);
    archive.write("optimizer", opt);
    {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      archive.write("rng_cpu", gen.get_state());
    }
    if (powersgd != nullptr) WritePowerSgdState(archive, *powersgd);
    std::ostringstream buf;
    archive.save_to(buf);
    bytes = std::move(buf).str();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("serialising checkpoint '", out.path, "' failed: ", FirstLine(e.what())));
  }
  out.size_bytes = static_cast<int64_t>(bytes.size());
  out.checksum = ChecksumOf(bytes);

  // A new file under a random name, created without following links
  // (common/safe_file.h: two writers sharing a directory never share a
  // temporary file, and a link a job planted is never written through),
  // fsync'ed, renamed over the final name, the directory fsync'ed.
  SafeWriteOptions write_options;
  write_options.env = env;
  absl::Status written = WriteFileSafely(out.path, bytes, write_options);
  if (!written.ok()) {
    const int err = SafeFileErrno(written);
    if (absl::IsResourceExhausted(written)) {
      int64_t free_bytes = FreeBytes(dir);
      return absl::ResourceExhaustedError(absl::StrCat(
          "disk full: writing checkpoint '", out.path, "' failed: ", std::strerror(err),
          "; it needs ", HumanBytes(static_cast<double>(out.size_bytes)), ", the filesystem has ",
          free_bytes < 0 ? std::string("an unknown amount")
                         : HumanBytes(static_cast<double>(free_bytes)),
          " free"));
    }
    if (absl::IsPermissionDenied(written)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint dir '", dir, "' is not writable: ", written.message()));
    }
    return absl::InternalError(
        absl::StrCat("writing checkpoint '", out.path, "' failed: ", written.message()));
  }
  if (keep > 0) {
    std::vector<std::string> mine;
    for (auto& f : FindCheckpoints(dir, manifest.job_id)) {
      if (std::get<2>(f) == manifest.writer) mine.push_back(std::move(std::get<3>(f)));
    }
    for (size_t i = 0; i + static_cast<size_t>(keep) < mine.size(); ++i) {
      if (!fs::remove(mine[i], ec) && ec)
        out.not_pruned.push_back(absl::StrCat(mine[i], ": ", ec.message()));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReadCheckpointBytes(const std::string& path,
                                                const std::string& expected_checksum) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int e = errno;
    return absl::NotFoundError(
        absl::StrCat("cannot open checkpoint '", path, "': ", std::strerror(e)));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading checkpoint '", path, "' failed"));
  std::string bytes = std::move(buf).str();
  if (!expected_checksum.empty()) {
    std::string got = ChecksumOf(bytes);
    if (got != expected_checksum) {
      return absl::DataLossError(absl::StrCat("checkpoint '", path, "' is corrupt: checksum ", got,
                                              ", recorded ", expected_checksum, " (", bytes.size(),
                                              " bytes)"));
    }
  }
  return bytes;
}

absl::StatusOr<TrainingPosition> LoadCheckpoint(const std::string& bytes, const std::string& path,
                                                const CheckpointManifest& expect,
                                                engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device,
                                                PowerSgdCheckpointRead* powersgd) {
  TrainingPosition p;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size(), device);
    const int64_t version = ReadInt(archive, "format_version");
    if (version != kFormatVersion) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "' has format version ",
                                                     version, "; expected ", kFormatVersion));
    }
    const std::string job_id = ReadString(archive, "job_id");
    if (!expect.job_id.empty() && job_id != expect.job_id) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "' was written by job '",
                                                     job_id, "', not by '", expect.job_id, "'"));
    }
    const std::string spec_hash = ReadString(archive, "spec_hash");
    if (!expect.spec_hash.empty() && !spec_hash.empty() && spec_hash != expect.spec_hash) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", path, "' was written for another model or optimizer (spec hash ",
          spec_hash, ", this job's ", expect.spec_hash, ")"));
    }
    p.epochs_done = ReadInt(archive, "epochs_done");
    p.global_step = ReadInt(archive, "global_step");
    p.skipped_steps = ReadInt(archive, "skipped_steps");
    p.loss_scale = ReadDouble(archive, "loss_scale");
    p.scaler_growth_tracker = ReadInt(archive, "scaler_growth_tracker");
    p.data_seed = static_cast<uint64_t>(ReadInt(archive, "data_seed"));
    p.world_size = ReadInt(archive, "world_size");
    {
      c10::IValue v;  // absent in checkpoints written before mid-epoch positions
      if (archive.try_read("epoch_consumed", v)) p.epoch_consumed = v.toInt();
      if (p.epoch_consumed < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint '", path, "' has a negative epoch position"));
      }
    }
    TRAINCTL_RETURN_IF_ERROR(ReadNamed(archive, "params", model.NamedParameters(), path));
    TRAINCTL_RETURN_IF_ERROR(ReadNamed(archive, "buffers", model.NamedBuffers(), path));
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    optimizer.load(opt);
    at::Tensor rng;
    archive.read("rng_cpu", rng);
    if (powersgd != nullptr) ReadPowerSgdState(archive, powersgd);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.cpu());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read checkpoint '", path, "': ", FirstLine(e.what())));
  }
  return p;
}

absl::StatusOr<TrainingPosition> ReadCheckpoint(const std::string& path, engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device) {
  TRAINCTL_ASSIGN_OR_RETURN(std::string bytes, ReadCheckpointBytes(path, ""));
  return LoadCheckpoint(bytes, path, {}, model, optimizer, device);
}

}  // namespace trainctl::trainer

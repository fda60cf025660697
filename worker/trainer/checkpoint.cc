#include "worker/trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "ckpt-epoch-";
constexpr char kSuffix[] = ".pt";
constexpr int64_t kFormatVersion = 1;

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
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "': ", into[i].first,
                                                     " has shape ", c10::str(saved.sizes()),
                                                     ", the model expects ", c10::str(dst.sizes())));
    }
    dst.copy_(saved);
  }
  return absl::OkStatus();
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

std::string CheckpointPath(const std::string& dir, int64_t epochs_done) {
  return absl::StrFormat("%s/%s%06d%s", dir, kPrefix, epochs_done, kSuffix);
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t plen = sizeof(kPrefix) - 1, slen = sizeof(kSuffix) - 1;
    if (name.size() <= plen + slen || name.compare(0, plen, kPrefix) != 0 ||
        name.compare(name.size() - slen, slen, kSuffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(plen, name.size() - plen - slen);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(digits), it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string LatestCheckpoint(const std::string& dir) {
  std::vector<std::string> all = ListCheckpoints(dir);
  return all.empty() ? "" : all.back();
}

absl::Status SyncFileAndDir(const std::string& path) {
  TRAINCTL_RETURN_IF_ERROR(FsyncFd(path, O_RDONLY));
  std::string dir = fs::path(path).parent_path().string();
  return FsyncFd(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
}

absl::Status WriteCheckpoint(const std::string& dir, int64_t keep, const TrainingPosition& position,
                             engine::Model& model, torch::optim::Optimizer& optimizer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint dir '", dir, "': ", ec.message()));
  const std::string path = CheckpointPath(dir, position.epochs_done);
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format_version", c10::IValue(kFormatVersion));
    archive.write("epochs_done", c10::IValue(position.epochs_done));
    archive.write("global_step", c10::IValue(position.global_step));
    archive.write("skipped_steps", c10::IValue(position.skipped_steps));
    archive.write("loss_scale", c10::IValue(position.loss_scale));
    archive.write("scaler_growth_tracker", c10::IValue(position.scaler_growth_tracker));
    archive.write("data_seed", c10::IValue(static_cast<int64_t>(position.data_seed)));
    archive.write("world_size", c10::IValue(position.world_size));
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
    archive.save_to(tmp);
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("writing checkpoint '", path, "' failed: ", FirstLine(e.what())));
  }
  absl::Status synced = FsyncFd(tmp, O_RDONLY);
  if (!synced.ok()) {
    std::remove(tmp.c_str());
    return synced;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("renaming '", tmp, "' to '", path, "' failed"));
  }
  TRAINCTL_RETURN_IF_ERROR(FsyncFd(dir, O_RDONLY | O_DIRECTORY));

  std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    fs::remove(all[i], ec);
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainingPosition> ReadCheckpoint(const std::string& path, engine::Model& model,
                                                torch::optim::Optimizer& optimizer,
                                                const c10::Device& device) {
  TrainingPosition p;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    const int64_t version = ReadInt(archive, "format_version");
    if (version != kFormatVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint '", path, "' has format version ", version, "; expected ", kFormatVersion));
    }
    p.epochs_done = ReadInt(archive, "epochs_done");
    p.global_step = ReadInt(archive, "global_step");
    p.skipped_steps = ReadInt(archive, "skipped_steps");
    p.loss_scale = ReadDouble(archive, "loss_scale");
    p.scaler_growth_tracker = ReadInt(archive, "scaler_growth_tracker");
    p.data_seed = static_cast<uint64_t>(ReadInt(archive, "data_seed"));
    p.world_size = ReadInt(archive, "world_size");
    TRAINCTL_RETURN_IF_ERROR(ReadNamed(archive, "params", model.NamedParameters(), path));
    TRAINCTL_RETURN_IF_ERROR(ReadNamed(archive, "buffers", model.NamedBuffers(), path));
    torch::serialize::InputArchive opt;
    archive.read("optimizer", opt);
    optimizer.load(opt);
    at::Tensor rng;
    archive.read("rng_cpu", rng);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.cpu());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read checkpoint '", path, "': ", FirstLine(e.what())));
  }
  return p;
}

}  // namespace trainctl::trainer

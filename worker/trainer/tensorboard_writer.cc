#include "worker/trainer/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/safe_file.h"

namespace trainctl::trainer {
namespace {

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
template <typename T>
void PutLittleEndian(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  out->append(b, sizeof(T));
}
void PutTag(std::string* out, int field, int wire_type) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
void PutBytes(std::string* out, int field, absl::string_view bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3
// (string), summary = 5 (Summary). Summary: value = 1 (repeated Value).
// Summary.Value: tag = 1 (string), simple_value = 2 (float).
std::string EncodeFileVersionEvent(double wall_time) {
  std::string e;
  PutTag(&e, 1, 1);
  PutLittleEndian(&e, wall_time);
  PutBytes(&e, 3, "brain.Event:2");
  return e;
}

std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(&v, 1, tag);
    PutTag(&v, 2, 5);
    PutLittleEndian(&v, value);
    PutBytes(&summary, 1, v);
  }
  std::string e;
  PutTag(&e, 1, 1);
  PutLittleEndian(&e, wall_time);
  PutTag(&e, 2, 0);
  PutVarint(&e, static_cast<uint64_t>(step));
  PutBytes(&e, 5, summary);
  return e;
}

std::string FrameRecord(absl::string_view data) {
  std::string out;
  std::string len;
  PutLittleEndian(&len, static_cast<uint64_t>(data.size()));
  out += len;
  PutLittleEndian(&out, MaskedCrc32c(len));
  out.append(data.data(), data.size());
  PutLittleEndian(&out, MaskedCrc32c(data));
  return out;
}

std::vector<std::pair<std::string, float>> MetricScalars(const rankproto::RankMetric& m) {
  std::vector<std::pair<std::string, float>> scalars;
  auto add = [&](const char* key, const char* tag, double v) {
    if (m.Reports(key)) scalars.emplace_back(tag, static_cast<float>(v));
  };
  if (m.kind == "epoch_end") {
    add("loss", "epoch/loss", m.loss);
    add("samples_per_sec", "epoch/samples_per_sec", m.samples_per_sec);
  } else if (m.kind != "eval") {
    add("loss", "train/loss", m.loss);
    add("lr", "train/lr", m.lr);
    add("samples_per_sec", "train/samples_per_sec", m.samples_per_sec);
    add("data_ms", "train/step_ms/data", m.data_ms);
    add("compute_ms", "train/step_ms/compute", m.compute_ms);
    add("comm_ms", "train/step_ms/comm", m.comm_ms);
    if (m.loss_scale > 0) add("loss_scale", "train/loss_scale", m.loss_scale);
  }
  add("eval_loss", "eval/loss", m.eval_loss);
  add("eval_accuracy", "eval/accuracy", m.eval_accuracy);
  for (const auto& [name, value] : m.scalars) scalars.emplace_back(name, static_cast<float>(value));
  return scalars;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir) {
  // Made and opened by a walk that follows no link (common/safe_file.h),
  // the file created O_EXCL|O_NOFOLLOW relative to it: a link the job
  // planted redirects nothing, whoever writes.
  absl::StatusOr<int> dirfd = OpenOrMakeDirNoFollow(dir);
  if (!dirfd.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensorboard.dir '", dir, "': cannot create: ", dirfd.status().message()));
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const absl::Time now = absl::Now();
  // A restart of the job writes a new file beside the old one; TensorBoard
  // reads them all in name order.
  std::string path;
  FILE* f = nullptr;
  int err = 0;
  for (int n = 0; n < 1000 && f == nullptr; ++n) {
    const std::string name = absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(now), ".",
                                          host, ".", getpid(), ".", n);
    path = absl::StrCat(dir, "/", name);
    // O_EXCL: never truncate another writer's file.
    const int fd =
        ::openat(*dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    err = errno;
    if (fd >= 0) {
      f = ::fdopen(fd, "wb");
      err = errno;
      if (f == nullptr) ::close(fd);
    }
    if (f == nullptr && err != EEXIST) break;
  }
  ::close(*dirfd);
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensorboard.dir '", dir, "': cannot create ",
                                                   path, ": ", std::strerror(err)));
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path, f));
  if (absl::Status s =
          w->Append(EncodeFileVersionEvent(absl::ToDoubleSeconds(now - absl::UnixEpoch())));
      !s.ok()) {
    return s;
  }
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status TensorBoardWriter::Write(int64_t step,
                                      const std::vector<std::pair<std::string, float>>& scalars) {
  return Append(
      EncodeScalarsEvent(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), step, scalars));
}

absl::Status TensorBoardWriter::Append(const std::string& event) {
  const std::string record = FrameRecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    const int err = errno;
    if (err == ENOSPC) return absl::ResourceExhaustedError(absl::StrCat(path_, ": disk full"));
    return absl::UnavailableError(absl::StrCat(path_, ": write failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace trainctl::trainer

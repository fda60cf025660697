// TensorBoard event files: scalars as `tensorboard --logdir` reads them.
//
// The format is TensorFlow's: a file named events.out.tfevents.<unix
// time>.<host>.<pid>.<n> holding TFRecords (uint64 length, masked CRC-32C of
// the length, the bytes, masked CRC-32C of the bytes; little-endian), each
// an `Event` message of TensorBoard's public schema (tensorboard/compat/
// proto/event.proto, summary.proto): the first carries file_version
// "brain.Event:2", the others wall_time, step and a Summary of simple_value
// scalars. The few fields needed are encoded here by hand, so the rank
// process needs no protobuf library (see worker/protocol/rank_protocol.h).
//
// Each Write appends one record and flushes it, so TensorBoard shows a
// running job. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::trainer {

// CRC-32C (Castagnoli) of `data`, and TFRecord's masking of it.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

// The encoded Event messages (exposed for tests).
std::string EncodeFileVersionEvent(double wall_time);
std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars);
// One TFRecord around `data`.
std::string FrameRecord(absl::string_view data);

// A metric's TensorBoard scalars, under the tags docs/observability.md
// lists: at an epoch's end epoch/loss, epoch/samples_per_sec and eval/*;
// for a train window train/loss, train/lr, train/samples_per_sec,
// train/step_ms/{data,compute,comm} and train/loss_scale (AMP only); for a
// command job's eval report eval/loss and eval/accuracy; every custom
// scalar under its own name. Only fields the metric reports
// (RankMetric::Reports): a command job's trainctl.report() gets the tags
// of what it named, an engine rank every one. Engine ranks (rank_main.cc)
// and the worker daemon (command jobs) both tag with this.
std::vector<std::pair<std::string, float>> MetricScalars(const rankproto::RankMetric& m);

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new event file in it. InvalidArgument
  // naming the directory when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends the scalars of one global step (wall time: now).
  absl::Status Write(int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status Append(const std::string& event);

  std::string path_;
  FILE* file_;
};

}  // namespace trainctl::trainer

// The worker's side of at-least-once telemetry: every WorkerMessage the
// coordinator must not lose (rank status, rendezvous, metrics, logs,
// progress, and any later kind of report) is appended here, numbered with a
// per-worker sequence number (WorkerMessage.seq), and kept until the
// coordinator acknowledges it (TelemetryAck: everything up to a seq is
// applied and committed). The session sends held messages in seq order and,
// after a reconnect, resends everything not yet acknowledged, so the
// coordinator applies the data in the order the worker produced it (a rank's
// SUCCEEDED comes after its last metrics and logs).
//
// Bounded by bytes. When an append would exceed the bound, log lines go
// first: the oldest log chunks are cut down to one marker line
// "[trainctl-worker] N log lines dropped (telemetry buffer full)" (the chunk
// keeps its seq, so the coordinator still sees the count). If that is not
// enough, the oldest metric batches, progress reports and markers are
// dropped whole (counted in dropped_messages()). Anything else (rank status,
// rendezvous, kinds this file does not know) is never dropped: it may exceed
// the bound by its own size, and it is small and rare.
//
// Not thread-safe: the DaemonSession (its outbox) guards it with its mutex.
#pragma once

#include <cstdint>
#include <deque>

#include "trainctl/v1/worker_service.pb.h"

namespace trainctl::worker {

class TelemetryBuffer {
 public:
  // `max_bytes`: the bound on the serialized size of what is held (plus a
  // small per-message overhead), > 0.
  explicit TelemetryBuffer(int64_t max_bytes);

  // Numbers `msg` with the next seq, keeps it, and returns the seq. May make
  // room first (see above); the appended message itself is a log chunk cut
  // to a marker when nothing older is left to cut.
  int64_t Append(v1::WorkerMessage msg);

  // The coordinator applied everything up to `seq`: drop it.
  void Ack(int64_t seq);

  // A session registered and the coordinator has applied this worker id's
  // telemetry up to `acked_seq`. The first time in this buffer's life, the
  // held messages (none were sent under this numbering yet) are renumbered
  // to follow `acked_seq`, so a worker process that starts afresh continues
  // the id's sequence; afterwards this is Ack(acked_seq).
  void OnRegistered(int64_t acked_seq);

  // Copies the oldest held message with seq > `after` to `*out`; false when
  // there is none (`out` may be null: only asks). A session sends with NextAfter(last sent seq),
  // starting from acked() after each (re)connect.
  bool NextAfter(int64_t after, v1::WorkerMessage* out) const;

  // Visits every held message, oldest first.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const Entry& e : entries_) fn(e.msg);
  }

  // Highest seq acknowledged (or known applied at registration).
  int64_t acked() const { return acked_; }
  // Seq the last Append returned (0 before any).
  int64_t last_seq() const { return next_seq_ - 1; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  int64_t bytes() const { return bytes_; }
  int64_t max_bytes() const { return max_bytes_; }
  // Log lines replaced by markers, and whole messages dropped, so far.
  int64_t dropped_log_lines() const { return dropped_log_lines_; }
  int64_t dropped_messages() const { return dropped_messages_; }

 private:
  struct Entry {
    v1::WorkerMessage msg;
    int64_t bytes = 0;
    // A log chunk already cut down to its marker line.
    bool marker = false;
  };
  static int64_t Cost(const v1::WorkerMessage& m);
  // Cuts `e` (a log chunk) to its marker line; returns the bytes freed.
  int64_t CutToMarker(Entry& e);
  // Frees room (oldest first) until `need` more bytes fit or nothing
  // droppable is left.
  void MakeRoom(int64_t need);

  const int64_t max_bytes_;
  // Held messages, ascending seq (gaps where messages were dropped).
  std::deque<Entry> entries_;
  // Invariant: entries_[0, cut_prefix_) hold no log chunk that is not a
  // marker yet (where cutting resumes).
  size_t cut_prefix_ = 0;
  int64_t bytes_ = 0;
  int64_t next_seq_ = 1;
  int64_t acked_ = 0;
  bool registered_ = false;
  int64_t dropped_log_lines_ = 0;
  int64_t dropped_messages_ = 0;
};

}  // namespace trainctl::worker

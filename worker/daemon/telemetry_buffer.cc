#include "worker/daemon/telemetry_buffer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainctl::worker {
namespace {

// Per-message bookkeeping (deque slot, seq, flags) counted against the bound.
constexpr int64_t kEntryOverhead = 64;

// Kinds that may be cut or dropped when the buffer is full. Everything else
// (rank status, rendezvous, kinds added later) is kept whatever the size.
bool Droppable(const v1::WorkerMessage& m) {
  return m.has_logs() || m.has_metrics() || m.has_progress();
}

}  // namespace

TelemetryBuffer::TelemetryBuffer(int64_t max_bytes) : max_bytes_(std::max<int64_t>(max_bytes, 1)) {}

int64_t TelemetryBuffer::Cost(const v1::WorkerMessage& m) {
  return static_cast<int64_t>(m.ByteSizeLong()) + kEntryOverhead;
}

int64_t TelemetryBuffer::Append(v1::WorkerMessage msg) {
  Entry e;
  e.msg = std::move(msg);
  e.msg.set_seq(next_seq_++);
  e.bytes = Cost(e.msg);
  MakeRoom(e.bytes);
  if (bytes_ + e.bytes > max_bytes_ && e.msg.has_logs()) CutToMarker(e);
  if (bytes_ + e.bytes > max_bytes_ && Droppable(e.msg)) {
    // Nothing older is left to drop and this one does not fit either.
    ++dropped_messages_;
    return e.msg.seq();
  }
  bytes_ += e.bytes;
  int64_t seq = e.msg.seq();
  entries_.push_back(std::move(e));
  return seq;
}

int64_t TelemetryBuffer::CutToMarker(Entry& e) {
  if (e.marker || !e.msg.has_logs()) return 0;
  v1::LogChunk* c = e.msg.mutable_logs();
  int64_t lines = c->lines_size();
  v1::LogLine marker;
  marker.set_rank(c->rank());
  marker.set_stream(v1::LogLine::STREAM_STDERR);
  if (lines > 0) {
    *marker.mutable_time() = c->lines(lines - 1).time();
    // The last cut line's number: a resumed log stream that saw the marker
    // does not ask for the lines it stands for.
    marker.set_seq(c->lines(lines - 1).seq());
  }
  marker.set_text(
      absl::StrCat("[trainctl-worker] ", lines, " log lines dropped (telemetry buffer full)"));
  c->clear_lines();
  *c->add_lines() = std::move(marker);
  c->set_dropped_lines(c->dropped_lines() + lines);
  dropped_log_lines_ += lines;
  e.marker = true;
  int64_t before = e.bytes;
  e.bytes = Cost(e.msg);
  return before - e.bytes;
}

void TelemetryBuffer::MakeRoom(int64_t need) {
  // 1. Log lines first, oldest first. Entries before cut_prefix_ hold no
  // uncut log chunk, so a full buffer does not rescan them on every append.
  while (cut_prefix_ < entries_.size() && bytes_ + need > max_bytes_) {
    bytes_ -= CutToMarker(entries_[cut_prefix_]);
    ++cut_prefix_;
  }
  if (bytes_ + need <= max_bytes_) return;
  // 2. Then whole metric batches, progress reports and markers, oldest first.
  size_t i = 0;
  for (auto it = entries_.begin(); it != entries_.end() && bytes_ + need > max_bytes_;) {
    if (!Droppable(it->msg)) {
      ++it;
      ++i;
      continue;
    }
    bytes_ -= it->bytes;
    ++dropped_messages_;
    it = entries_.erase(it);
    if (i < cut_prefix_) --cut_prefix_;
  }
}

void TelemetryBuffer::Ack(int64_t seq) {
  acked_ = std::max(acked_, seq);
  while (!entries_.empty() && entries_.front().msg.seq() <= seq) {
    bytes_ -= entries_.front().bytes;
    entries_.pop_front();
    if (cut_prefix_ > 0) --cut_prefix_;
  }
  // The coordinator knows more than this process issued (it applied an
  // earlier process's messages under the same id): continue after them.
  next_seq_ = std::max(next_seq_, acked_ + 1);
}

void TelemetryBuffer::OnRegistered(int64_t acked_seq) {
  if (!registered_) {
    registered_ = true;
    int64_t seq = std::max<int64_t>(acked_seq, 0);
    for (Entry& e : entries_) e.msg.set_seq(++seq);
    next_seq_ = seq + 1;
    acked_ = std::max<int64_t>(acked_seq, 0);
    return;
  }
  Ack(acked_seq);
}

bool TelemetryBuffer::NextAfter(int64_t after, v1::WorkerMessage* out) const {
  // Held seqs ascend: binary search for the first one past `after`.
  auto it = std::upper_bound(entries_.begin(), entries_.end(), after,
                             [](int64_t s, const Entry& e) { return s < e.msg.seq(); });
  if (it == entries_.end()) return false;
  if (out != nullptr) *out = it->msg;
  return true;
}

}  // namespace trainctl::worker

// Group commit of the sequenced metrics and logs that worker sessions
// receive (see TelemetryBatcher below). WorkerServiceImpl owns one; every
// WorkerSession queues into it.
//
// Threading: loop only (Queue, Settle, Drain, and the TelemetrySession
// callbacks); the store transaction runs on the batcher's TelemetryWriter
// thread, which touches nothing but the messages of the group it writes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "coordinator/api/services.h"
#include "coordinator/core/on_loop.h"
#include "coordinator/telemetry/telemetry_writer.h"

namespace trainctl::coordinator {

// What a session must hear once its queued telemetry is applied or not.
class TelemetrySession {
 public:
  virtual ~TelemetrySession() = default;
  // Committed: acknowledge the worker's applied seq.
  virtual void TelemetryApplied() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
  // Not applied (a store failure): `msgs` are the session's messages of the
  // failed group and those it queued after them, in the order it sent
  // them; the session holds them and retries (WorkerSession::Hold), the
  // worker keeps them unacknowledged.
  virtual void TelemetryNotApplied(std::vector<v1::WorkerMessage> msgs, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) = 0;
};

// Group commit of sequenced metric, log and progress messages, committed
// off the loop. Applying each in its own transaction cost one fsync per message on
// the loop thread; one group per loop turn still kept the loop waiting on
// the disk (SQLite) or the server (PostgreSQL) for every commit, with every
// heartbeat queued behind it (bench/RESULTS.md). So:
//
//   1. A session queues a message here (Queue). Once per loop turn, when
//      the writer is free, everything queued becomes one group: each
//      message is checked on the loop (a resend of an applied or earlier
//      seq is a duplicate; a refusal -- a stale attempt, a rank that is not
//      the worker's -- counts as applied, as in TelemetryLedger) and what
//      is accepted goes to the writer thread, which appends the rows and
//      each worker's highest seq in one transaction and commits
//      (TelemetryTables::AppendGroup).
//   2. After the commit, on the loop and in the order the messages came,
//      each one's effects run (TelemetryIngest::MetricsStored/LogsStored:
//      progress, watchers), the ledger's applied seqs advance, and each
//      session is acknowledged once. Memory and acknowledgements follow
//      the store: nothing is acknowledged or published before its commit.
//   3. A failed commit applies nothing: no seq advances (so a resend is not
//      taken for a duplicate), and each session gets back its messages of
//      the group together with those it queued after them (a later message
//      of a worker never commits before an earlier one), to hold and retry.
//
// One group is written at a time; what arrives meanwhile waits for the
// next, so a worker's messages commit in the order it sent them. Whatever
// else a session handles that must follow its telemetry (any other
// sequenced report, a registration, its end) first Settles the worker: the
// loop waits for that worker's queued and written messages to be applied
// (or handed back), so that the ledger's applied seq is exact before the
// next message counts on it. Messages whose handler also writes the job
// (MakesEvents) never come here: the session applies them itself, in a
// group of the ledger's, after settling.
//
// Loop only.
class TelemetryBatcher {
 public:
  explicit TelemetryBatcher(ServiceContext ctx);
  // Joins the writer (the loop must be stopped: see TelemetryWriter).
  ~TelemetryBatcher();

  // Whether `msg` goes through the batcher: sequenced metrics (that make no
  // event), logs, or progress (memory only, applied in its place after the
  // group's commit).
  static bool Batches(const v1::WorkerMessage& msg);
  // Queues `msg` (Batches(msg)) of `session`, worker `worker_id`.
  void Queue(TelemetrySession* session, const std::string& worker_id, v1::WorkerMessage msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Returns once nothing of `worker_id` is queued or being written: each of
  // its messages applied and acknowledged, or handed back. Waits for the
  // writer when it must (at most the rest of a commit, then the next group).
  // From inside a group's completion it returns at once.
  void Settle(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // The same for every worker.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Runs `read` with no group being written and every committed group
  // published. A group is committed on the writer's thread and published
  // (TelemetryIngest's effects: the hub's subscribers) on the loop after,
  // so a read of the store in between sees rows that are still to be
  // published: a stream that reads its history and then subscribes, in
  // one loop turn, would get those rows twice. Inside `read` each
  // committed row is either in the store and published already, or not
  // in the store yet and published later. Waits for the group being
  // written (at most the rest of one commit, as Settle); the next group
  // goes to the writer after `read` returns.
  void ReadPublished(absl::FunctionRef<void()> read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // What is queued, as one group to the writer, when the writer is free
  // (else its done sends it). Once per loop turn after a Queue (posted);
  // tests call it to hold a group in the writer while more is queued.
  void SendQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

 private:
  struct Queued {
    TelemetrySession* session;
    std::string worker_id;
    v1::WorkerMessage msg;
  };
  // What becomes of a message of the group being written: its rows written
  // (metrics, logs), nothing written (progress: memory only), nothing at
  // all (a resend, a refusal).
  enum class Fate { kWrite, kApply, kDuplicate, kRefused };
  // The group the writer is writing. Its messages do not change until the
  // writer is done with them (the writer thread reads `writes`).
  struct Group {
    std::vector<Queued> items;
    std::vector<Fate> fates;  // per item
    // Each worker of the group with the highest seq it applies, first-seen order.
    std::vector<std::pair<std::string, int64_t>> seqs;
    std::vector<const v1::WorkerMessage*> writes;  // the kWrite items' messages, in order
  };

  // The writer's answer for `group_` (step 2 or 3 above).
  void Written(const absl::Status& committed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // One message fewer of `worker_id` queued or being written.
  void Release(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
  // Runs the writer (Wait) or the queue (Send) until `settled()`.
  template <typename Settled>
  void WaitUntil(Settled settled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);

  ServiceContext ctx_;
  std::vector<Queued> queue_ ABSL_GUARDED_BY(kLoop);
  std::unique_ptr<Group> group_ ABSL_GUARDED_BY(kLoop);  // set while the writer has it
  // Per worker: its messages queued or in group_ (no entry: none).
  absl::flat_hash_map<std::string, int64_t> pending_ ABSL_GUARDED_BY(kLoop);
  bool send_posted_ ABSL_GUARDED_BY(kLoop) = false;
  // Inside Written: a Settle from an effect or a session callback cannot
  // wait for the group it is part of.
  bool completing_ ABSL_GUARDED_BY(kLoop) = false;
  // Inside ReadPublished: a group that completes sends no next group.
  bool holding_ ABSL_GUARDED_BY(kLoop) = false;
  // Last: destroyed (joined) first, while the queue and group still exist.
  TelemetryWriter writer_;
};

}  // namespace trainctl::coordinator

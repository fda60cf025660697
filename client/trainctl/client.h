// trainctl C++ client: submit, query, watch and cancel training jobs on a
// trainctl-coordinator.
//
//   #include "trainctl/client.h"
//
//   trainctl::ClientOptions options;
//   options.address = "coord:7070";
//   auto client = trainctl::Client::Connect(options);
//   if (!client.ok()) { /* client.status() names the address */ }
//   absl::StatusOr<trainctl::v1::Job> job = (*client)->SubmitFile("job.yaml");
//   absl::StatusOr<trainctl::v1::Job> done = (*client)->Watch(
//       job->id(), /*include_history=*/true, [](const trainctl::v1::JobUpdate& u) {
//         if (u.has_event()) std::cout << u.event().message() << "\n";
//         return true;  // false stops watching
//       });
//
// The messages (Job, JobSpec, JobUpdate, LogChunk, Worker) are the public
// protobuf API in proto/trainctl/v1/; this header adds only the calls.
//
// Authentication: set options.token (and options.ca_file for a TLS
// coordinator); a missing or bad token is kUnauthenticated, a role that may
// not make the call kPermissionDenied.
//
// Errors are absl::Status values whose code is the gRPC code, one to one
// (NOT_FOUND → kNotFound, FAILED_PRECONDITION → kFailedPrecondition, ...), and
// whose message is the coordinator's reason. Unary calls are bounded by
// ClientOptions::timeout; Watch and Logs streams are not (they last as long as
// the job, or until the callback returns false).
//
// Several coordinators (active and standby on one store): set
// options.address to a comma-separated list, "a:7070,b:7070". A standby
// answers UNAVAILABLE naming the active coordinator; the call then goes
// there (also when it is not in the list; over TLS its certificate is
// verified for that host name). An address that cannot be reached leads to
// the next one, round robin with a short backoff, within options.timeout.
// A call is sent again only when it certainly did not run (a standby
// answered, or the connection was never made, so nothing was sent) or when
// it is idempotent: reads, and Submit (its request_id). Cancel, the token,
// queue and revoke calls are never sent twice: an UNAVAILABLE after they
// may have been sent is returned. Watch and Logs streams open on the
// active coordinator the same way; Watch also resumes on it after a break.
// The address that last answered as active is kept for the Client's life
// and for other Clients of the same list in this process.
//
// Thread-safety: a Client may be used from several threads at once; callbacks
// run on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainctl/v1/auth.pb.h"
#include "trainctl/v1/job.pb.h"
#include "trainctl/v1/job_service.pb.h"
#include "trainctl/v1/metrics.pb.h"
#include "trainctl/v1/queue.pb.h"
#include "trainctl/v1/worker_service.pb.h"

namespace grpc {
class Channel;
}

namespace trainctl {

struct ClientOptions {
  // The coordinator, "host:port" (or a gRPC target with a scheme, e.g.
  // "unix:/path"), or a comma-separated list of them (see above).
  std::string address = "localhost:7070";
  // Bounds Connect() and every unary call.
  absl::Duration timeout = absl::Seconds(10);
  // Bearer token sent on every call (`authorization: Bearer <token>`).
  // Every coordinator call needs one; see docs/security.md for the roles.
  std::string token;
  // PEM file of the cluster CA: connect over TLS and verify the coordinator
  // against it. Empty: plaintext, which with a token only a loopback
  // address gets (127.0.0.0/8, ::1, localhost, unix:): Connect is
  // FailedPrecondition naming any other address, before anything is sent.
  std::string ca_file;
  // The name the coordinator's certificate must carry, when it differs
  // from the address's host (tests).
  std::string tls_server_name;
  // Watch (and Fetch, and Logs with follow) resumes a stream that broke
  // (the coordinator restarted or the network dropped) for this long after
  // the break: it reconnects within 1 s of the coordinator answering again
  // and continues after the last event (byte, log line) it delivered, with
  // none repeated or lost. Zero: a broken stream is an error at once.
  absl::Duration watch_reconnect_for = absl::Minutes(2);
  // Called once per break that Watch, Fetch or Logs is resuming from, with
  // the reason.
  std::function<void(const absl::Status&)> on_watch_broken;
};

// What GetLogs sends back.
struct LogsOptions {
  // Only this rank; unset = every rank.
  std::optional<int> rank;
  // Attempt number, from 1; 0 = the latest.
  int attempt = 0;
  // First only the last N kept lines per rank; 0 = every kept line.
  int tail = 0;
  // Keep the stream open and deliver new lines until the job ends.
  bool follow = false;
};

// Which stored metric points Metrics returns.
struct MetricsOptions {
  // Only this rank; unset = every rank.
  std::optional<int> rank;
  // KIND_TRAIN, KIND_EPOCH_END (with the eval results) or KIND_EVAL (a
  // command job's eval reports); unset = every kind.
  v1::MetricPoint::Kind kind = v1::MetricPoint::KIND_UNSPECIFIED;
};

// What a dry run says about a spec.
struct DryRunResult {
  // The job as it would be stored: the resolved spec, state PENDING, no id.
  v1::Job job;
  // The ranks as they would be placed now; empty when the job would wait.
  std::vector<v1::RankAssignment> planned;
  // Why the job would wait, when it would.
  std::string pending_reason;
};

// A job's code as the coordinator now holds it (UploadCode,
// PackAndUploadCode; docs/command-jobs.md, "Code travels with the job").
struct UploadedCode {
  // For CommandSpec.code: digest, size_bytes, files, source.
  v1::CodePackage code;
  // The coordinator had the archive already, so no bytes were sent.
  bool already_stored = false;
};

// A directory packed into a temporary archive for UploadCode: a
// deterministic tar (the same files give the same digest) with
// .gitignore and .trainctlignore honoured, .git/, __pycache__/ and *.pyc
// left out, and links inside the directory followed. The file is removed
// with the object. Not thread-safe (one owner).
class PackedCodeArchive {
 public:
  // Packs `dir` into a file under $TMPDIR; code().source is `dir` made
  // absolute. A directory that cannot be packed (InvalidArgument: a link
  // out of it, a socket, a name too long) or whose archive would be over
  // `max_bytes` (ResourceExhausted naming the limit and the biggest files)
  // is refused; nothing is sent anywhere.
  static absl::StatusOr<std::unique_ptr<PackedCodeArchive>> Pack(const std::string& dir,
                                                                 int64_t max_bytes = int64_t{64}
                                                                                     << 20);
  ~PackedCodeArchive();
  PackedCodeArchive(const PackedCodeArchive&) = delete;
  PackedCodeArchive& operator=(const PackedCodeArchive&) = delete;

  // The archive file.
  const std::string& path() const { return path_; }
  // digest, size_bytes, files, source.
  const v1::CodePackage& code() const { return code_; }

 private:
  PackedCodeArchive() = default;
  std::string scratch_dir_;  // holds path_; removed by the destructor
  std::string path_;
  v1::CodePackage code_;
};

class Client {
 public:
  // Called with each watch update; return false to stop watching.
  using WatchCallback = std::function<bool(const v1::JobUpdate&)>;
  // Called with each chunk of log lines (one rank's, in order); return false to stop.
  using LogCallback = std::function<bool(const v1::LogChunk&)>;

  // Connects and waits until a coordinator of the list answers the
  // connection, at most options.timeout. Unavailable (naming the address,
  // or each of the list with its reason) when nothing listens;
  // InvalidArgument for a malformed address or list; FailedPrecondition for
  // a token without a CA to a non-loopback address (see ca_file).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // A client over an existing channel (an embedded coordinator's in-process
  // channel, or one with custom credentials). Does not wait for it.
  static std::unique_ptr<Client> FromChannel(std::shared_ptr<grpc::Channel> channel,
                                             const ClientOptions& options = {});

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Submits a job; it is PENDING (stored) when this returns. InvalidArgument
  // from the coordinator names every bad field, one per line.
  //
  // Safe to retry: each call sends a request_id of its own (`request_id`,
  // or a random one when empty). A call whose answer is lost to UNAVAILABLE
  // (the coordinator restarted or failed over, the network dropped) is sent
  // again with it, to the active coordinator, within options.timeout; one
  // lost to DEADLINE_EXCEEDED up to twice more. So one call makes at most
  // one job. Retrying a failed call with the same request_id yourself
  // returns the job it made, if it made one.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& request_id = "");
  // Parses and validates job.yaml locally (with `overrides`, "key.path=value"
  // like the CLI's --set), then submits. InvalidArgument holds every error,
  // one "file:line:col: field: reason" per line, and nothing is sent.
  absl::StatusOr<v1::Job> SubmitFile(const std::string& path,
                                     const std::vector<std::string>& overrides = {});
  // Validates on the coordinator and shows where the job would run now.
  // Stores nothing.
  absl::StatusOr<DryRunResult> DryRun(const v1::JobSpec& spec);

  // One job with its attempts. NotFound for an unknown id.
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  // Jobs newest first, without attempts; only those in `states` when not
  // empty; at most `limit` (0 = all), following the coordinator's pages.
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states = {},
                                            int limit = 0);
  // Stops every rank and marks the job CANCELLED. FailedPrecondition when
  // the job already ended.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason = "");
  // Cancels every job not yet ended that matches all the filters given
  // (JobService.CancelJobs: at least one of queue, owner, states; a
  // submitter's match only its own jobs); with dry_run only lists them.
  // The response has the ids cancelled (or that would be) and their count.
  struct CancelFilter {
    std::string queue;
    std::string owner;
    std::vector<v1::JobState> states;
  };
  absl::StatusOr<v1::CancelJobsResponse> CancelJobs(const CancelFilter& filter,
                                                    const std::string& reason = "",
                                                    bool dry_run = false);

  // Delivers the job's updates (with include_history: its stored events and
  // metrics first) until the job ends or `callback` returns false, then
  // returns the job as it is then, with its attempts. A broken stream is
  // resumed (options.watch_reconnect_for): the events missed meanwhile come
  // first, stored metrics are not sent again.
  absl::StatusOr<v1::Job> Watch(const std::string& job_id, bool include_history,
                                const WatchCallback& callback);
  // Delivers the job's log lines; with options.follow, until the job ends.
  // Returns OK also when `callback` stopped it. A followed stream that
  // breaks is resumed as Watch's is (options.watch_reconnect_for): after the
  // last line delivered of each rank (LogLine.seq), none twice; the lines a
  // new attempt logged meanwhile come from its start.
  absl::Status Logs(const std::string& job_id, const LogsOptions& options,
                    const LogCallback& callback);

  // A job's stored metric points (also after it ended), oldest first, one
  // batch per run of points of one attempt; follows the coordinator's pages
  // (each call bounded by options.timeout). Old train points of a long job
  // are downsampled by the coordinator (min/max/last loss per bucket).
  absl::StatusOr<std::vector<v1::MetricBatch>> Metrics(const std::string& job_id,
                                                       const MetricsOptions& options = {});

  // Writes a job's final model (checkpoint_step 0) or its checkpoint at that
  // global step to `out`, streamed through the coordinator from the worker
  // that holds it. Checks that the pieces are in order and that the bytes
  // match the file's checksum (DataLoss otherwise: discard what was
  // written). Returns the first chunk's description (path, worker, size,
  // checksum; no data). No deadline: large files take their time. A stream
  // that breaks after bytes arrived (the coordinator restarted or failed
  // over, the connection dropped, the holder reconnects) is resumed at the
  // next byte for options.watch_reconnect_for after the break, as Watch is
  // (on_watch_broken says so once per break); the file must still be the
  // same (size, checksum), else DataLoss.
  absl::StatusOr<v1::ArtifactChunk> Fetch(const std::string& job_id, int64_t checkpoint_step,
                                          std::ostream& out);

  // Uploads a code archive (a ustar tar, as PackedCodeArchive makes) with
  // JobService.UploadCode: the first message names code.digest and
  // code.size_bytes (the file's: InvalidArgument when its size differs,
  // before anything is sent), then the bytes follow in pieces of 1 MiB.
  // When the coordinator has that digest already it ends the call at once
  // and nothing more is sent (already_stored). Returns `code` as the
  // coordinator stored it. Sent again after UNAVAILABLE like a read (the
  // store is content-addressed); bounded by options.timeout plus 1 s per
  // MiB. UNIMPLEMENTED: a coordinator without code uploads (older).
  absl::StatusOr<UploadedCode> UploadCode(const std::string& archive_path,
                                          const v1::CodePackage& code);
  // Registered workers; with include_gone also LOST and LEFT ones.
  absl::StatusOr<std::vector<v1::Worker>> Workers(bool include_gone = false);
  // The same with the coordinator's store health (ListWorkersResponse.store).
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(bool include_gone = false);

  // Tokens (an admin token's calls). The secret is in the response only.
  absl::StatusOr<v1::CreateTokenResponse> CreateToken(const v1::CreateTokenRequest& req);
  absl::StatusOr<std::vector<v1::Token>> ListTokens(bool include_revoked = false);
  absl::StatusOr<v1::Token> RevokeToken(const std::string& id);
  // Revokes worker `worker_id`'s certificates (admin): its session ends, it
  // is LOST at once, and no certificate naming it is accepted again.
  absl::StatusOr<v1::RevokeWorkerResponse> RevokeWorker(const std::string& worker_id);
  // A one-time dashboard sign-in code for this client's token.
  absl::StatusOr<v1::CreateSignInCodeResponse> CreateSignInCode();

  // Queues (docs/queues.md). Create and delete need an admin token;
  // `update` replaces a queue of that name (else AlreadyExists).
  absl::StatusOr<v1::Queue> CreateQueue(const v1::Queue& queue, bool update = false);
  absl::StatusOr<v1::QueueStatus> GetQueue(const std::string& name);
  // Ascending by name, each with what its jobs use now.
  absl::StatusOr<std::vector<v1::QueueStatus>> ListQueues();
  // FailedPrecondition while the queue has pending or running jobs.
  absl::Status DeleteQueue(const std::string& name);
  // Slot-seconds per queue, owner and slot kind (viewer and up); the
  // request's empty fields filter nothing.
  absl::StatusOr<v1::GetUsageResponse> GetUsage(const v1::GetUsageRequest& req);

  const ClientOptions& options() const { return options_; }
  // The coordinator calls go to now: the one that last answered as active
  // (or the first reachable one of the list); options.address for a
  // client made by FromChannel.
  std::string active_address() const;

 private:
  struct Stubs;
  Client(std::shared_ptr<grpc::Channel> channel, const ClientOptions& options);

  ClientOptions options_;
  std::unique_ptr<Stubs> stubs_;
};

}  // namespace trainctl

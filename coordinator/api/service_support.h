// What every gRPC handler of the coordinator shares: who is calling (its
// bearer token and role), whether a submitter may act on a job, and the
// shape of a unary call answered on the loop (authenticate on the gRPC
// thread; a refused call does no work; else answer on the loop).
//
// Threading: Caller and UnaryOnLoop run on gRPC threads (TokenAuthority's
// Authenticate is thread-safe); what UnaryOnLoop posts runs on the loop.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/api/services.h"
#include "coordinator/auth/method_roles.h"
#include "coordinator/auth/token_authority.h"

namespace trainctl::coordinator {

// The caller of the RPC `call` (its method name, e.g. "SubmitJob"), when
// its token is valid and has one of the roles method_roles.h gives that
// method; else Unauthenticated / PermissionDenied to finish the call with
// (a name the table lacks: PermissionDenied for every caller).
absl::StatusOr<Principal> Caller(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                                 absl::string_view call);

// The client certificate of an mTLS call, which the handshake verified
// against the cluster CA: its CN (a worker id), its host-name and IP SANs
// (not the spiffe:// URI), its serial (lowercase hex; empty if unreadable).
struct CertPeer {
  std::string id;
  std::vector<std::string> sans;
  std::string serial;
};
// nullopt when the call presented no client certificate.
std::optional<CertPeer> CertPeerOf(const grpc::CallbackServerContext& ctx);

// A worker daemon calling `call` (a WorkerService method): a client
// certificate the cluster CA signed names it (no token needed; a revoked one
// is refused, PermissionDenied), or it holds a worker token (Caller), whose
// worker ids are the ones bound to it (TokenAuthority::BindWorker).
struct WorkerCaller {
  Principal who;
  std::string cert_id;  // the certificate's worker id; "" without one
  std::vector<std::string> cert_sans;
  std::string cert_serial;
};
absl::StatusOr<WorkerCaller> WorkerCallerOf(const ServiceContext& c,
                                            grpc::CallbackServerContext* ctx,
                                            absl::string_view call);

// A submitter acts only on its own jobs; admins on every job.
absl::Status MayActOnJob(const Principal& who, absl::string_view call, const v1::Job& job);

// The state store's write health as ListWorkers and the dashboard show it
// (`store` null: left empty).
void FillStoreHealth(const StateStore* store, v1::StoreHealth* out);

// Moves a result into the response it answers; returns its status.
template <typename T, typename Response>
absl::Status MoveInto(absl::StatusOr<T> result, Response* resp) {
  if (result.ok()) *resp = *std::move(result);
  return result.status();
}

// The order of a streaming reactor's reads, made visible. gRPC hands a
// StartRead to its core and runs the OnReadDone that completes it on
// another of its threads, through its own (uninstrumented) queues: the
// reads are ordered, but ThreadSanitizer does not see the order, and reports
// the message (or what the reactor gathered from it) as raced between two
// OnReadDone calls. A reactor calls Mark() at the top of OnReadDone and
// right before each StartRead: an uncontended lock whose release and
// acquire say what core guarantees.
class ReadOrder {
 public:
  void Mark() { absl::MutexLock lock(&mu_); }

 private:
  absl::Mutex mu_;
};

// One unary call: authenticates `call` (method_roles.h) here, on the gRPC thread
// (a refused call is finished at once and does no work), then runs
// `answer(const Principal& who) -> absl::Status` on the loop and finishes
// the call with the status it returns. `answer` is a lambda declared
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) (coordinator/core/on_loop.h): it runs on
// the loop, and the analysis checks what it calls.
template <typename Answer>
grpc::ServerUnaryReactor* UnaryOnLoop(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                                      absl::string_view call, Answer answer) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(c, ctx, call);
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    return reactor;
  }
  c.loop->Post([loop = c.loop, reactor, answer = std::move(answer), who = *std::move(who)] {
    AssertOnLoop(loop, "a unary call's answer");
    reactor->Finish(ToGrpcStatus(answer(who)));
  });
  return reactor;
}

}  // namespace trainctl::coordinator

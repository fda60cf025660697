// AuthService: tokens (create, list, revoke; admin only), Join (a join
// token, over TLS, buys a worker's client certificate from the
// WorkerEnroller) and RevokeWorker (admin: a worker's certificates).
//
// Threading: token writes and Join run on the loop (the store's telemetry
// groups assume one writing thread); ListTokens reads the TokenAuthority,
// which is thread-safe, on the gRPC thread.
#include <grpc/grpc_security_constants.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/api/service_support.h"
#include "coordinator/api/services.h"

namespace trainctl::coordinator {

namespace {

// Why Join cannot be served on this call, before any work: the certificate
// comes back in the reply, so never over plaintext; and only a coordinator
// with an enroller signs.
absl::Status JoinPrecondition(grpc::CallbackServerContext* ctx, const WorkerEnroller* enroller) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  std::vector<grpc::string_ref> transport =
      auth ? auth->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME)
           : std::vector<grpc::string_ref>();
  if (transport.empty() ||
      std::string(transport.front().data(), transport.front().size()) != "ssl") {
    return absl::FailedPreconditionError(
        "Join: needs TLS (start the coordinator with --tls-dir; the worker with --ca)");
  }
  if (enroller == nullptr) {
    return absl::FailedPreconditionError("Join: this coordinator does not sign certificates");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AuthServiceImpl::CreateToken(grpc::CallbackServerContext* ctx,
                                                       const v1::CreateTokenRequest* req,
                                                       v1::CreateTokenResponse* resp) {
  return UnaryOnLoop(ctx_, ctx, "CreateToken",
                     [this, req, resp](const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       return MoveInto(ctx_.auth->Create(*req, who), resp);
                     });
}

grpc::ServerUnaryReactor* AuthServiceImpl::ListTokens(grpc::CallbackServerContext* ctx,
                                                      const v1::ListTokensRequest* req,
                                                      v1::ListTokensResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<Principal> who = Caller(ctx_, ctx, "ListTokens");
  if (who.ok()) {
    for (v1::Token& t : ctx_.auth->List(req->include_revoked())) *resp->add_tokens() = std::move(t);
  }
  reactor->Finish(ToGrpcStatus(who.status()));
  return reactor;
}

grpc::ServerUnaryReactor* AuthServiceImpl::Join(grpc::CallbackServerContext* ctx,
                                                const v1::JoinRequest* req,
                                                v1::JoinResponse* resp) {
  // Checked here, on the gRPC thread, as the call's transport is; answered
  // after the token check, which comes first.
  absl::Status ready = JoinPrecondition(ctx, ctx_.enroller);
  // Renewal: a worker's own certificate and no token.
  std::optional<CertPeer> peer = CertPeerOf(*ctx);
  if (peer.has_value() &&
      ctx->client_metadata().find("authorization") == ctx->client_metadata().end()) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    ctx_.loop->Post([this, reactor, req, resp, ready, peer = *std::move(peer)] {
      AssertOnLoop(ctx_.loop, "a join");
      absl::Status s = ready;
      if (s.ok()) s = ctx_.auth->CheckCert(peer.id, peer.serial);
      if (s.ok()) s = MoveInto(ctx_.enroller->Renew(peer.id, peer.sans, *req), resp);
      if (!s.ok()) {
        LogEvent(LogLevel::kWarn, "coordinator", "worker_cert_renewal_refused",
                 {{"worker_id", peer.id}, {"reason", std::string(s.message())}});
      }
      reactor->Finish(ToGrpcStatus(s));
    });
    return reactor;
  }
  // A refusal is logged by the RPC interceptor (rpc_refused).
  return UnaryOnLoop(ctx_, ctx, "Join",
                     [this, req, resp, ready](const Principal& who)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
                           TRAINCTL_RETURN_IF_ERROR(ready);
                           return MoveInto(ctx_.enroller->Join(who, *req), resp);
                         });
}

grpc::ServerUnaryReactor* AuthServiceImpl::RevokeToken(grpc::CallbackServerContext* ctx,
                                                       const v1::RevokeTokenRequest* req,
                                                       v1::Token* resp) {
  return UnaryOnLoop(ctx_, ctx, "RevokeToken",
                     [this, req, resp](const Principal&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) {
                       return MoveInto(ctx_.auth->Revoke(req->id()), resp);
                     });
}

grpc::ServerUnaryReactor* AuthServiceImpl::RevokeWorker(grpc::CallbackServerContext* ctx,
                                                        const v1::RevokeWorkerRequest* req,
                                                        v1::RevokeWorkerResponse* resp) {
  return UnaryOnLoop(
      ctx_, ctx, "RevokeWorker",
      [this, req, resp](const Principal& who) ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop) -> absl::Status {
        if (req->worker_id().empty() || req->worker_id().size() > 64) {
          return absl::InvalidArgumentError("worker_id: required, at most 64 characters");
        }
        // Persisted first: from here on no session of that certificate is
        // accepted; then the live one ends and its ranks are rescheduled.
        TRAINCTL_RETURN_IF_ERROR(MoveInto(ctx_.auth->RevokeWorkerCert(req->worker_id()), resp));
        absl::Status why = ctx_.auth->CheckCert(req->worker_id(), "");
        ExpelWorker(ctx_, req->worker_id(), why);
        LogEvent(LogLevel::kWarn, "coordinator", "worker_revoked",
                 {{"worker_id", req->worker_id()},
                  {"by", who.token_id},
                  {"serials", absl::StrJoin(resp->serials(), ",")}});
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AuthServiceImpl::CreateSignInCode(grpc::CallbackServerContext* ctx,
                                                            const v1::CreateSignInCodeRequest*,
                                                            v1::CreateSignInCodeResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Every role the dashboard lets in; the code stands for the caller's own
  // token (its bearer secret), so it grants nothing the caller lacks.
  absl::Status s = Caller(ctx_, ctx, "CreateSignInCode").status();
  const SignInCodes::Endpoint dashboard =
      ctx_.sign_in != nullptr ? ctx_.sign_in->endpoint() : SignInCodes::Endpoint{};
  if (s.ok() && dashboard.port == 0) {
    s = absl::FailedPreconditionError(
        "CreateSignInCode: this coordinator serves no dashboard (start it with --http-listen "
        "HOST:PORT)");
  }
  if (s.ok()) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string header =
        it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(header, kBearer)) {
      s = absl::FailedPreconditionError(
          "CreateSignInCode: needs a bearer token (a certificate cannot sign in)");
    } else {
      resp->set_code(ctx_.sign_in->Create(
          std::string(absl::StripAsciiWhitespace(header.substr(kBearer.size())))));
      resp->set_expires_in_s(static_cast<int32_t>(absl::ToInt64Seconds(SignInCodes::kTtl)));
      resp->set_http_port(dashboard.port);
      resp->set_https(dashboard.https);
    }
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

}  // namespace trainctl::coordinator

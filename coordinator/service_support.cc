#include "coordinator/service_support.h"

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The caller of `call`, when its token is valid and has one of `roles`;
// else Unauthenticated / PermissionDenied to finish the call with.
absl::StatusOr<Principal> Caller(const ServiceContext& c, grpc::CallbackServerContext* ctx,
                                 absl::string_view call, std::initializer_list<v1::Role> roles) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  absl::string_view header;
  if (it != md.end()) header = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Principal> who = c.auth->Authenticate(header);
  if (!who.ok()) {
    return absl::Status(who.status().code(), absl::StrCat(call, ": ", who.status().message()));
  }
  absl::Status allowed = TokenAuthority::Authorize(*who, call, roles);
  if (!allowed.ok()) return allowed;
  return who;
}

// A submitter acts only on its own jobs; admins on every job.
absl::Status MayActOnJob(const Principal& who, absl::string_view call, const v1::Job& job) {
  if (who.role == v1::ROLE_ADMIN || job.owner_token_id() == who.token_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      call, ": job '", job.id(), "' belongs to '", job.owner().empty() ? "nobody" : job.owner(),
      "'; a submitter acts only on its own jobs (role admin acts on every job)"));
}

}  // namespace trainctl::coordinator

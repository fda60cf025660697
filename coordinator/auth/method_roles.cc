#include "coordinator/auth/method_roles.h"

namespace trainctl::coordinator {
namespace {

constexpr absl::string_view kJobs = "trainctl.v1.JobService";
constexpr absl::string_view kWorkers = "trainctl.v1.WorkerService";
constexpr absl::string_view kAuth = "trainctl.v1.AuthService";
constexpr absl::string_view kQueues = "trainctl.v1.QueueService";
constexpr v1::Role kAdmin = v1::ROLE_ADMIN;
constexpr v1::Role kSubmitter = v1::ROLE_SUBMITTER;
constexpr v1::Role kViewer = v1::ROLE_VIEWER;

}  // namespace

const std::vector<MethodRoles>& AllMethodRoles() {
  static const std::vector<MethodRoles>* const table = new std::vector<MethodRoles>{
      {kJobs, "SubmitJob", {kAdmin, kSubmitter}},
      {kJobs, "GetJob", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "ListJobs", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "CancelJob", {kAdmin, kSubmitter}},
      {kJobs, "CancelJobs", {kAdmin, kSubmitter}},
      {kJobs, "WatchJob", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "GetLogs", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "GetMetrics", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "FetchArtifact", {kAdmin, kSubmitter, kViewer}},
      {kJobs, "UploadCode", {kAdmin, kSubmitter}},
      {kWorkers, "Session", {v1::ROLE_WORKER}},
      {kWorkers, "ListWorkers", {kAdmin, kSubmitter, kViewer}},
      {kWorkers, "FetchCode", {v1::ROLE_WORKER}},
      {kAuth, "CreateToken", {kAdmin}},
      {kAuth, "ListTokens", {kAdmin}},
      {kAuth, "RevokeToken", {kAdmin}},
      {kAuth, "Join", {v1::ROLE_JOIN}},
      {kAuth, "RevokeWorker", {kAdmin}},
      {kAuth, "CreateSignInCode", {kAdmin, kSubmitter, kViewer}},
      {kQueues, "CreateQueue", {kAdmin}},
      {kQueues, "GetQueue", {kAdmin, kSubmitter, kViewer}},
      {kQueues, "ListQueues", {kAdmin, kSubmitter, kViewer}},
      {kQueues, "DeleteQueue", {kAdmin}},
      {kQueues, "GetUsage", {kAdmin, kSubmitter, kViewer}},
  };
  return *table;
}

absl::Span<const v1::Role> RolesOf(absl::string_view method) {
  for (const MethodRoles& m : AllMethodRoles()) {
    if (m.method == method) return m.roles;
  }
  return {};
}

}  // namespace trainctl::coordinator

// Every RPC of trainctl.v1 and the roles that may call it: the one table
// the handlers authorize by (Caller / UnaryOnLoop take a method's name and
// look its roles up here), and the table docs/security.md "Who may call
// what" prints. MethodRolesTest fails when a service gains a method without
// a row here, a row names no method, or the docs' table differs.
//
// Why not an interceptor that refuses: gRPC 1.51's server interceptors
// cannot finish a call before its handler runs, so each handler asks
// Caller() first thing; an unknown name there is refused (no roles).
//
// Beyond the role, a submitter acts only on its own jobs (MayActOnJob), and
// Join also takes a worker's own certificate for a renewal (auth_service.cc).
//
// Immutable after static initialisation; thread-safe.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainctl/v1/auth.pb.h"

namespace trainctl::coordinator {

struct MethodRoles {
  absl::string_view service;  // "trainctl.v1.JobService"
  absl::string_view method;   // "SubmitJob"
  std::vector<v1::Role> roles;
};

// The whole table, in the order docs/security.md lists it.
const std::vector<MethodRoles>& AllMethodRoles();

// The roles that may call `method` (a method's name, unique across the
// services); empty for a name the table does not hold.
absl::Span<const v1::Role> RolesOf(absl::string_view method);

}  // namespace trainctl::coordinator

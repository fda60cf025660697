// Small Status helpers. Debian 12's abseil (20220623) ships no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so trainctl keeps its own two.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define TRAINCTL_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status trainctl_status_ = (expr);            \
    if (!trainctl_status_.ok()) return trainctl_status_; \
  } while (0)

#define TRAINCTL_STATUS_CONCAT_INNER_(a, b) a##b
#define TRAINCTL_STATUS_CONCAT_(a, b) TRAINCTL_STATUS_CONCAT_INNER_(a, b)

// `lhs = value of expr`, or returns its Status when it holds none.
// lhs may declare a variable: TRAINCTL_ASSIGN_OR_RETURN(auto x, F());
#define TRAINCTL_ASSIGN_OR_RETURN(lhs, expr) \
  TRAINCTL_ASSIGN_OR_RETURN_IMPL_(TRAINCTL_STATUS_CONCAT_(trainctl_statusor_, __LINE__), lhs, expr)

#define TRAINCTL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

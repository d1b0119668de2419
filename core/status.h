// Status helpers shared by every module: absl::Status / absl::StatusOr plus
// the RETURN_IF_ERROR / ASSIGN_OR_RETURN macros (Debian's abseil predates
// its own).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// Returns from the enclosing function when `expr` (an absl::Status) fails.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status _dlrm_status = (expr);        \
    if (!_dlrm_status.ok()) return _dlrm_status; \
  } while (0)

#define DLRM_STATUS_CONCAT_INNER(a, b) a##b
#define DLRM_STATUS_CONCAT(a, b) DLRM_STATUS_CONCAT_INNER(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on failure returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, rexpr)                                       \
  DLRM_ASSIGN_OR_RETURN_IMPL(DLRM_STATUS_CONCAT(_dlrm_or_, __LINE__), lhs, \
                             rexpr)

#define DLRM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

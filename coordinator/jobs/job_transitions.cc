#include "coordinator/jobs/job_transitions.h"

#include "absl/strings/str_cat.h"

namespace trainctl::coordinator {

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED || s == v1::JOB_STATE_TIMEOUT;
}

bool IsTerminal(v1::RankState s) {
  return s == v1::RANK_STATE_SUCCEEDED || s == v1::RANK_STATE_FAILED || s == v1::RANK_STATE_STOPPED;
}

bool AttemptEnded(v1::AttemptState s) {
  return s == v1::ATTEMPT_STATE_SUCCEEDED || s == v1::ATTEMPT_STATE_FAILED ||
         s == v1::ATTEMPT_STATE_CANCELLED;
}

const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_PENDING:
      return "PENDING";
    case v1::JOB_STATE_SCHEDULED:
      return "SCHEDULED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_RESTARTING:
      return "RESTARTING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    case v1::JOB_STATE_TIMEOUT:
      return "TIMEOUT";
    default:
      return "UNSPECIFIED";
  }
}

bool JobTransitionAllowed(v1::JobState from, v1::JobState to) {
  if (from == to)
    return true;  // Updates without a state change (also rank ends after the job ended).
  switch (from) {
    case v1::JOB_STATE_UNSPECIFIED:
      return to == v1::JOB_STATE_PENDING;
    case v1::JOB_STATE_PENDING:
      return to == v1::JOB_STATE_SCHEDULED || to == v1::JOB_STATE_CANCELLED ||
             to == v1::JOB_STATE_FAILED;
    case v1::JOB_STATE_SCHEDULED:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_RESTARTING ||
             to == v1::JOB_STATE_SUCCEEDED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED || to == v1::JOB_STATE_TIMEOUT;
    case v1::JOB_STATE_RUNNING:
      return to == v1::JOB_STATE_SUCCEEDED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_RESTARTING || to == v1::JOB_STATE_CANCELLED ||
             to == v1::JOB_STATE_TIMEOUT;
    case v1::JOB_STATE_RESTARTING:
      // TIMEOUT: the running time its attempts already had is past its
      // scheduling.max_runtime_s.
      return to == v1::JOB_STATE_SCHEDULED || to == v1::JOB_STATE_FAILED ||
             to == v1::JOB_STATE_CANCELLED || to == v1::JOB_STATE_TIMEOUT;
    default:
      return false;  // Terminal states never change.
  }
}

bool AttemptTransitionAllowed(v1::AttemptState from, v1::AttemptState to) {
  if (from == to) return true;
  switch (from) {
    case v1::ATTEMPT_STATE_STARTING:
      return to == v1::ATTEMPT_STATE_RUNNING || AttemptEnded(to);
    case v1::ATTEMPT_STATE_RUNNING:
      return AttemptEnded(to);
    default:
      return false;  // Ended attempts never change; none starts UNSPECIFIED.
  }
}

bool RankTransitionAllowed(v1::RankState from, v1::RankState to) {
  if (from == to) return true;
  switch (from) {
    case v1::RANK_STATE_ASSIGNED:
      return to == v1::RANK_STATE_STARTING || to == v1::RANK_STATE_RUNNING || IsTerminal(to);
    case v1::RANK_STATE_STARTING:
      return to == v1::RANK_STATE_RUNNING || IsTerminal(to);
    case v1::RANK_STATE_RUNNING:
      return IsTerminal(to);
    default:
      return false;  // Ended ranks never change; none starts UNSPECIFIED.
  }
}

namespace {

absl::Status Refused(const v1::Job& job, const std::string& what) {
  return absl::InternalError(absl::StrCat("job ", job.id(), ": ", what, " is not allowed"));
}

absl::Status CheckAttemptChange(const v1::Job& job, const v1::Attempt& from,
                                const v1::Attempt& to) {
  if (!AttemptTransitionAllowed(from.state(), to.state())) {
    return Refused(
        job, absl::StrCat("attempt ", from.number(), ": ", v1::AttemptState_Name(from.state()),
                          " -> ", v1::AttemptState_Name(to.state())));
  }
  if (from.ranks_size() != to.ranks_size()) {
    return Refused(job, absl::StrCat("attempt ", from.number(), ": changing its ranks from ",
                                     from.ranks_size(), " to ", to.ranks_size()));
  }
  for (int i = 0; i < from.ranks_size(); ++i) {
    if (!RankTransitionAllowed(from.ranks(i).state(), to.ranks(i).state())) {
      return Refused(job, absl::StrCat("attempt ", from.number(), " rank ", i, ": ",
                                       v1::RankState_Name(from.ranks(i).state()), " -> ",
                                       v1::RankState_Name(to.ranks(i).state())));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNewAttempt(const v1::Job& job, const v1::Attempt& a) {
  if (a.state() != v1::ATTEMPT_STATE_STARTING) {
    return Refused(
        job, absl::StrCat("a new attempt ", a.number(), " in ", v1::AttemptState_Name(a.state())));
  }
  for (const v1::RankAssignment& r : a.ranks()) {
    if (r.state() != v1::RANK_STATE_ASSIGNED) {
      return Refused(job, absl::StrCat("a new attempt's rank ", r.rank(), " in ",
                                       v1::RankState_Name(r.state())));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobChange(const v1::Job& from, const v1::Job& to) {
  if (!JobTransitionAllowed(from.state(), to.state())) {
    return Refused(
        to, absl::StrCat("transition ", StateName(from.state()), " -> ", StateName(to.state())));
  }
  if (to.attempts_size() < from.attempts_size()) {
    return Refused(to, absl::StrCat("dropping attempts (", from.attempts_size(), " -> ",
                                    to.attempts_size(), ")"));
  }
  for (int i = 0; i < to.attempts_size(); ++i) {
    absl::Status s = i < from.attempts_size()
                         ? CheckAttemptChange(to, from.attempts(i), to.attempts(i))
                         : CheckNewAttempt(to, to.attempts(i));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace trainctl::coordinator

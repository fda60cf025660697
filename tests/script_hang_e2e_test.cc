// A command job's rank that stops mid-training (issue #44 item 1): two real
// worker daemons run tests/support/hang_script.py (Debian's python3-torch,
// Gloo on loopback) with no hang configuration at all; rank 1 sleeps
// forever at step 30 while rank 0 waits in the next all_reduce. The attempt
// fails as HANG within 60 s of the stop, the reason names rank 1, and both
// ranks' Python stacks (faulthandler, registered by the worker's start-up
// hook, not by the script) are in their logs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"
#include "tests/support/cluster.h"
#include "tests/support/source_dir.h"

namespace trainctl {
namespace {

using ::testing::HasSubstr;
using trainctl::testing::Cluster;
using trainctl::testing::SourceDir;

bool HaveTorch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

// The wall time hang_script.py wrote into `path` as rank 1 stopped; nullopt
// when the file is not there (yet).
std::optional<absl::Time> StopTime(const std::string& path) {
  std::ifstream in(path);
  double t = 0;
  if (!(in >> t) || t <= 0) return std::nullopt;
  return absl::FromUnixMicros(static_cast<int64_t>(t * 1e6));
}

TEST(ScriptHangE2ETest, AStoppedRankIsNamedWithinAMinuteWithBothStacksInTheLogs) {
  if (!HaveTorch()) GTEST_SKIP() << "Debian's python3-torch is not installed";
  Cluster cluster(trainctl::testing::BuildDirOfThisTest(), "/bin/false");
  ASSERT_TRUE(cluster.StartCoordinator());
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.StartWorker("w1", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(2));

  const std::string marker = cluster.dir() + "/rank1-stopped";
  // No restart.progress_timeout_s, no hang option: the defaults. No restart,
  // so that the first hang ends the job.
  const std::string yaml = absl::StrCat(
      "name: script-hang\nworld_size: 2\ndevice: cpu\ncommand:\n  argv: [/usr/bin/python3, ",
      SourceDir(), "/tests/support/hang_script.py, --marker, ", marker,
      "]\n  working_dir: ", cluster.dir(), "\nrestart: {max_restarts: 0}\n");
  ParsedJobSpec p = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
  const std::string id = cluster.Submit(p.spec);
  ASSERT_FALSE(id.empty());

  // Generous bounds for a loaded machine; the promise is checked on the
  // measured time below.
  v1::Job j = cluster.WaitFor(
      id,
      [](const v1::Job& j) {
        return j.state() == v1::JOB_STATE_FAILED || j.state() == v1::JOB_STATE_SUCCEEDED ||
               j.state() == v1::JOB_STATE_CANCELLED;
      },
      absl::Seconds(180));
  const absl::Time failed_seen = absl::Now();
  ASSERT_EQ(j.state(), v1::JOB_STATE_FAILED) << j.state_reason();
  std::optional<absl::Time> stopped = StopTime(marker);
  ASSERT_TRUE(stopped.has_value()) << "rank 1 never reached its stop; " << j.state_reason();
  // From rank 1's stop to the attempt's end as the coordinator recorded it
  // (the same machine's wall clock).
  ASSERT_EQ(j.attempts_size(), 1);
  const absl::Time failed_at = absl::FromUnixSeconds(j.attempts(0).end_time().seconds()) +
                               absl::Nanoseconds(j.attempts(0).end_time().nanos());
  EXPECT_LE(failed_at, failed_seen);
  const absl::Duration detection = failed_at - *stopped;
  std::cout << "[ measured ] rank 1 stopped at step 30; the job failed as hung "
            << absl::FormatDuration(detection) << " later: " << j.state_reason() << "\n";
  EXPECT_LE(detection, absl::Seconds(60)) << "the promise: within 60 s with no configuration";

  EXPECT_EQ(j.attempts(0).failure_kind(), v1::FAILURE_KIND_HANG);
  EXPECT_THAT(j.state_reason(), HasSubstr("hung: rank 1 (worker "));
  EXPECT_THAT(
      j.state_reason(),
      HasSubstr(
          "at step 30 stopped outside torch's collectives while rank 0 has waited in one for"));
  EXPECT_THAT(j.state_reason(), HasSubstr("every rank's Python stack follows in its log"));
  bool hang_event = false;
  for (const v1::Event& e : cluster.Events(id)) {
    if (e.type() == "hang") {
      hang_event = true;
      EXPECT_EQ(e.rank(), 1);
      EXPECT_THAT(e.message(), HasSubstr("rank 1 (worker "));
    }
  }
  EXPECT_TRUE(hang_event);

  // The stacks reach the logs as the ranks end (a second after the verdict,
  // then SIGTERM; a rank's lines go before its end): wait for both ends.
  j = cluster.WaitFor(
      id,
      [](const v1::Job& j) {
        for (const v1::RankAssignment& r : j.attempts(0).ranks()) {
          if (r.state() == v1::RANK_STATE_RUNNING || r.state() == v1::RANK_STATE_STARTING)
            return false;
        }
        return true;
      },
      absl::Seconds(60));
  const std::string log0 = cluster.RankLog(id, 1, 0), log1 = cluster.RankLog(id, 1, 1);
  // The same stacks as events beside the hang, one per rank.
  std::map<int, std::string> stacks;
  for (const v1::Event& e : cluster.Events(id)) {
    if (e.type() == "stacks") stacks[e.rank()] = e.message();
  }
  EXPECT_THAT(stacks[1], HasSubstr("rank 1's Python stacks when the hang was found:\n"));
  EXPECT_THAT(stacks[1], HasSubstr(" in wedged"));
  EXPECT_THAT(stacks[0], HasSubstr(" in all_reduce"));
  // Rank 1: where it stopped (faulthandler's frames, innermost first).
  EXPECT_THAT(log1, HasSubstr("most recent call first"));
  EXPECT_THAT(log1, HasSubstr("hang_script.py\", line"));
  EXPECT_THAT(log1, HasSubstr(" in wedged")) << log1;
  // Rank 0: waiting for it in the all-reduce.
  EXPECT_THAT(log0, HasSubstr("most recent call first"));
  EXPECT_THAT(log0, HasSubstr("distributed_c10d.py\", line"));
  EXPECT_THAT(log0, HasSubstr(" in all_reduce")) << log0;
}

}  // namespace
}  // namespace trainctl

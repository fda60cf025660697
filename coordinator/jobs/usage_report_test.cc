#include "coordinator/jobs/usage_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/time_util.h"

namespace trainctl::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// An attempt of `ranks` slots of `kind` from kT0 + start_s to kT0 + end_s
// (end_s < 0: still running).
void AddAttempt(v1::Job& job, int ranks, v1::Slot::Kind kind, int start_s, int end_s) {
  v1::Attempt* a = job.add_attempts();
  a->set_number(job.attempts_size());
  for (int r = 0; r < ranks; ++r) {
    v1::RankAssignment* ra = a->add_ranks();
    ra->set_rank(r);
    ra->mutable_slot()->set_kind(kind);
    if (end_s >= 0) ra->set_state(v1::RANK_STATE_SUCCEEDED);  // an ended attempt's ranks exited
  }
  SetTimestamp(kT0 + absl::Seconds(start_s), a->mutable_start_time());
  if (end_s >= 0) SetTimestamp(kT0 + absl::Seconds(end_s), a->mutable_end_time());
}

v1::Job Job(const std::string& id, const std::string& queue, const std::string& owner) {
  v1::Job j;
  j.set_id(id);
  j.set_owner(owner);
  j.mutable_spec()->set_queue(queue);
  return j;
}

TEST(UsageReportTest, SumsSlotSecondsPerQueueOwnerAndKindWithinTheWindow) {
  v1::Job a1 = Job("a1", "team-a", "alice");
  AddAttempt(a1, 2, v1::Slot::KIND_GPU, 0, 100);    // 200 gpu slot-s
  AddAttempt(a1, 4, v1::Slot::KIND_GPU, 100, 150);  // preempted and resumed: 200 more
  v1::Job a2 = Job("a2", "team-a", "alice");
  AddAttempt(a2, 1, v1::Slot::KIND_CPU, 50, -1);  // running: counts up to `until`
  v1::Job b1 = Job("b1", "", "bob");              // no queue: "default"
  AddAttempt(b1, 3, v1::Slot::KIND_GPU, 10, 20);
  v1::Job never = Job("p", "team-a", "alice");  // pending: no attempt
  UsageFilter f;
  f.until = kT0 + absl::Seconds(250);
  const std::vector<UsageRow> rows = SumUsage({&a1, &a2, &b1, &never}, f);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].queue, "default");
  EXPECT_EQ(rows[0].owner, "bob");
  EXPECT_DOUBLE_EQ(rows[0].slot_seconds, 30);
  EXPECT_EQ(rows[1].queue, "team-a");
  EXPECT_EQ(rows[1].kind, "cpu");
  EXPECT_DOUBLE_EQ(rows[1].slot_seconds, 200);
  EXPECT_EQ(rows[2].kind, "gpu");
  EXPECT_DOUBLE_EQ(rows[2].slot_seconds, 400);
  EXPECT_EQ(rows[2].attempts, 2);
  EXPECT_EQ(rows[2].jobs, 1);

  // A window clips the attempts; filters pick queue and owner.
  f.since = kT0 + absl::Seconds(90);
  f.until = kT0 + absl::Seconds(120);
  f.queue = "team-a";
  const std::vector<UsageRow> clipped = SumUsage({&a1, &a2, &b1}, f);
  ASSERT_EQ(clipped.size(), 2u);
  EXPECT_DOUBLE_EQ(clipped[0].slot_seconds, 30);               // cpu: 1 slot x 30 s
  EXPECT_DOUBLE_EQ(clipped[1].slot_seconds, 2 * 10 + 4 * 20);  // gpu
  f.queue = "";
  f.owner = "carol";
  EXPECT_TRUE(SumUsage({&a1, &a2, &b1}, f).empty());
}

// A stored record wins over the job's attempt times (it has the grace and
// the cgroup figures); an ended attempt whose ranks still stop counts up to
// until; GPU-seconds only for GPU slots; the groupings.
TEST(UsageReportTest, StoredRecordsWinStoppingAttemptsRunToUntilAndGroupingsSum) {
  v1::Job a1 = Job("a1", "team-a", "alice");
  AddAttempt(a1, 2, v1::Slot::KIND_GPU, 0, 100);  // ended at 100, stored ending at 104
  v1::Job a2 = Job("a2", "team-a", "bob");
  AddAttempt(a2, 1, v1::Slot::KIND_CPU, 50, 60);
  a2.mutable_attempts(0)->mutable_ranks(0)->set_state(v1::RANK_STATE_RUNNING);  // still stopping
  a2.mutable_attempts(0)->set_preempted_for("a1");
  v1::AttemptUsage stored = AttemptUsageOf(a1, a1.attempts(0), kT0 + absl::Seconds(104), true,
                                           {RankFigures{3.5, 100}, RankFigures{1.5, 300}});
  EXPECT_EQ(stored.wall_seconds(), 104);
  EXPECT_EQ(stored.gpu_seconds(), 208);
  EXPECT_EQ(stored.cpu_seconds(), 5);
  EXPECT_EQ(stored.peak_memory_bytes(), 300);
  EXPECT_EQ(stored.ranks_measured(), 2);
  UsageFilter f;
  f.until = kT0 + absl::Seconds(200);
  const std::vector<v1::AttemptUsage> all = CollectAttempts({&a1, &a2}, {stored}, f);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].job_id(), "a1");
  EXPECT_EQ(FromTimestamp(all[0].end_time()), kT0 + absl::Seconds(104))
      << "the stored record, not end_time";
  EXPECT_EQ(all[1].job_id(), "a2");
  EXPECT_FALSE(all[1].has_end_time());
  EXPECT_EQ(all[1].state(), "preempted");
  EXPECT_EQ(all[1].wall_seconds(), 150) << "its rank still runs: up to until";
  EXPECT_EQ(all[1].gpu_seconds(), 0);

  f.by = v1::USAGE_GROUPING_OWNER;
  std::vector<UsageRow> rows = SumAttempts(all, f);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].owner, "alice");
  EXPECT_EQ(rows[0].queue, "");
  EXPECT_DOUBLE_EQ(rows[0].gpu_seconds, 208);
  EXPECT_DOUBLE_EQ(rows[0].cpu_seconds, 5);
  EXPECT_EQ(rows[1].owner, "bob");
  f.by = v1::USAGE_GROUPING_QUEUE;
  rows = SumAttempts(all, f);
  ASSERT_EQ(rows.size(), 2u) << "cpu and gpu rows of team-a";
  EXPECT_EQ(rows[0].owner, "");
  f.by = v1::USAGE_GROUPING_JOB;
  f.since = kT0 + absl::Seconds(100);
  rows = SumAttempts(all, f);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].job_id, "a1");
  EXPECT_DOUBLE_EQ(rows[0].wall_seconds, 4) << "clipped to the window";
  EXPECT_DOUBLE_EQ(rows[0].slot_seconds, 8);
  EXPECT_DOUBLE_EQ(rows[0].cpu_seconds, 5) << "CPU time is the whole attempt's";
  EXPECT_EQ(rows[1].job_id, "a2");
  EXPECT_DOUBLE_EQ(rows[1].wall_seconds, 100);
}

}  // namespace
}  // namespace trainctl::coordinator

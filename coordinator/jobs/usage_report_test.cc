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
  AddAttempt(a1, 2, v1::Slot::KIND_GPU, 0, 100);   // 200 gpu slot-s
  AddAttempt(a1, 4, v1::Slot::KIND_GPU, 100, 150);  // preempted and resumed: 200 more
  v1::Job a2 = Job("a2", "team-a", "alice");
  AddAttempt(a2, 1, v1::Slot::KIND_CPU, 50, -1);  // running: counts up to `until`
  v1::Job b1 = Job("b1", "", "bob");               // no queue: "default"
  AddAttempt(b1, 3, v1::Slot::KIND_GPU, 10, 20);
  v1::Job never = Job("p", "team-a", "alice");     // pending: no attempt
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
  EXPECT_DOUBLE_EQ(clipped[0].slot_seconds, 30);       // cpu: 1 slot x 30 s
  EXPECT_DOUBLE_EQ(clipped[1].slot_seconds, 2 * 10 + 4 * 20);  // gpu
  f.queue = "";
  f.owner = "carol";
  EXPECT_TRUE(SumUsage({&a1, &a2, &b1}, f).empty());
}

}  // namespace
}  // namespace trainctl::coordinator

// The CLI's rendering without a coordinator: tables, names, durations,
// progress, follow mode on a terminal and off one (with a fake clock), and
// how `trainctl queue` words a queue's use.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/follow.h"
#include "client/cli/format.h"
#include "client/cli/queue_text.h"
#include "common/jobspec/job_spec.h"
#include "common/time_util.h"

namespace trainctl::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatTest, TableAlignsColumnsAndLeavesTheLastUnpadded) {
  Table t({"ID", "STATE", "REASON"});
  t.AddRow({"a-long-id", "RUNNING", "-"});
  t.AddRow({"b", "FAILED", "rank 1 exited 3"});
  std::ostringstream out;
  t.Print(out, "  ");
  EXPECT_EQ(out.str(),
            "  ID         STATE    REASON\n"
            "  a-long-id  RUNNING  -\n"
            "  b          FAILED   rank 1 exited 3\n");
}

TEST(FormatTest, NamesDurationsAndStates) {
  EXPECT_EQ(JobStateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(RankStateName(v1::RANK_STATE_STOPPED), "STOPPED");
  EXPECT_EQ(WorkerStateName(v1::WORKER_STATE_LOST), "LOST");
  EXPECT_EQ(FailureKindName(v1::FAILURE_KIND_WORKER_LOST), "worker_lost");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(850)), "850ms");
  EXPECT_EQ(HumanDuration(absl::Seconds(12)), "12s");
  EXPECT_EQ(HumanDuration(absl::Seconds(185)), "3m05s");
  EXPECT_EQ(HumanDuration(absl::Minutes(127)), "2h07m");
  EXPECT_EQ(HumanDuration(absl::Hours(76)), "3d04h");
  v1::JobState s;
  ASSERT_TRUE(ParseJobState("running", &s));
  EXPECT_EQ(s, v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(ParseJobState("JOB_STATE_FAILED", &s));
  EXPECT_EQ(s, v1::JOB_STATE_FAILED);
  EXPECT_FALSE(ParseJobState("unspecified", &s));
  EXPECT_FALSE(ParseJobState("runnning", &s));
}

TEST(FormatTest, SinceTakesADurationBackFromNowOrAnRfc3339Time) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  EXPECT_EQ(*ParseSince("7d", now), now - absl::Hours(7 * 24));
  EXPECT_EQ(*ParseSince("12h", now), now - absl::Hours(12));
  EXPECT_EQ(*ParseSince("30m", now), now - absl::Minutes(30));
  EXPECT_EQ(*ParseSince("45s", now), now - absl::Seconds(45));
  EXPECT_EQ(*ParseSince("2w", now), now - absl::Hours(14 * 24));
  EXPECT_EQ(*ParseSince("1.5h", now), now - absl::Minutes(90));
  EXPECT_EQ(*ParseSince("2026-05-01T00:00:00Z", now), absl::FromUnixSeconds(1777593600));
  EXPECT_EQ(*ParseSince("2026-05-01T02:00:00+02:00", now), absl::FromUnixSeconds(1777593600));
  for (const char* bad : {"", "d", "7", "-7d", "7y", "seven days", "2026-05-01", "nand", "infh"}) {
    absl::StatusOr<absl::Time> t = ParseSince(bad, now);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(t.status().message()), ::testing::StartsWith("--since: '")) << bad;
  }
  EXPECT_THAT(std::string(ParseSince("2027-05-01T00:00:00Z", now).status().message()),
              ::testing::HasSubstr("future"));
  EXPECT_THAT(std::string(ParseSince("99999999d", now).status().message()),
              ::testing::HasSubstr("too far"));
}

TEST(FormatTest, ProgressBarAndText) {
  EXPECT_EQ(ProgressBar(0, 10), "[>         ]   0%");
  EXPECT_EQ(ProgressBar(0.5, 10), "[=====>    ]  50%");
  EXPECT_EQ(ProgressBar(1, 10), "[==========] 100%");
  v1::Progress p;
  EXPECT_EQ(ProgressText(p), "");
  EXPECT_LT(ProgressFraction(p), 0);
  p.set_epoch(1);
  p.set_epochs(3);
  p.set_step(40);
  p.set_steps_per_epoch(100);
  p.set_last_loss(0.69314);
  p.set_samples_per_sec(1234.4);
  p.set_eta_seconds(75);
  EXPECT_EQ(ProgressText(p), "epoch 2/3  step 40/100  loss 0.6931  1234 samples/s  ETA 1m15s");
  // A job that is not running (cancelled, ended, waiting) has no rate and no ETA.
  EXPECT_EQ(ProgressText(p, /*running=*/false), "epoch 2/3  step 40/100  loss 0.6931");
  EXPECT_DOUBLE_EQ(ProgressFraction(p), 140.0 / 300.0);
}

// Issue #44 item 10: `trainctl status` of a CANCELLED job showed its last
// rate and an ETA ("6862 samples/s  ETA 3m13s"); an ended job has neither.
TEST(FormatTest, StatusOfAnEndedJobShowsNoRateAndNoEta) {
  v1::Job job;
  job.set_id("mlp-1");
  v1::Progress* p = job.mutable_progress();
  p->set_epoch(0);
  p->set_epochs(3);
  p->set_step(40);
  p->set_steps_per_epoch(100);
  p->set_last_loss(0.5);
  p->set_samples_per_sec(6862);
  p->set_eta_seconds(193);
  job.set_state(v1::JOB_STATE_RUNNING);
  std::ostringstream running;
  PrintJobStatus(running, job, absl::Now(), {});
  EXPECT_THAT(running.str(), HasSubstr("loss 0.5000  6862 samples/s  ETA 3m13s\n"));
  for (v1::JobState ended :
       {v1::JOB_STATE_CANCELLED, v1::JOB_STATE_FAILED, v1::JOB_STATE_SUCCEEDED}) {
    job.set_state(ended);
    std::ostringstream out;
    PrintJobStatus(out, job, absl::Now(), {});
    EXPECT_THAT(out.str(), HasSubstr("epoch 1/3  step 40/100  loss 0.5000\n"))
        << JobStateName(ended);
    EXPECT_THAT(out.str(), Not(HasSubstr("samples/s"))) << JobStateName(ended);
    EXPECT_THAT(out.str(), Not(HasSubstr("ETA"))) << JobStateName(ended);
  }
}

// What a script reported, and only that: a loss of 0 it reported is shown,
// a rate or an eval field it never reported is not.
TEST(CliFormatTest, SummaryAndEvalTextSayOnlyWhatWasReported) {
  v1::Progress p;
  p.set_step(7);
  EXPECT_EQ(ProgressText(p), "step 7");
  p.set_last_loss(0);
  EXPECT_EQ(ProgressText(p), "step 7  loss 0.0000");

  v1::EvalResult e;
  EXPECT_EQ(EvalResultText(e), "");
  e.set_accuracy(0.5);
  EXPECT_EQ(EvalResultText(e), "accuracy 50.00%");
  e.set_loss(0.25);
  EXPECT_EQ(EvalResultText(e), "loss 0.2500, accuracy 50.00%");

  v1::MetricSummary s;
  s.set_train_points(3);
  EXPECT_EQ(MetricSummaryText(s), "") << "train windows that reported neither a loss nor a rate";
  s.set_last_loss(0.75);
  EXPECT_EQ(MetricSummaryText(s), "last loss 0.7500");
  s.mutable_best_eval()->set_epoch(1);
  s.mutable_best_eval()->set_loss(0.5);
  EXPECT_EQ(MetricSummaryText(s), "best eval loss 0.5000 (epoch 2), last loss 0.7500");
  s.mutable_best_eval()->set_accuracy(0.9);
  s.set_mean_samples_per_sec(100);
  EXPECT_EQ(
      MetricSummaryText(s),
      "best eval accuracy 90.00% (epoch 2, loss 0.5000), last loss 0.7500, mean 100 samples/s");
  s.mutable_best_eval()->clear_loss();
  EXPECT_EQ(MetricSummaryText(s),
            "best eval accuracy 90.00% (epoch 2), last loss 0.7500, mean 100 samples/s");
}

v1::JobUpdate JobSnapshot(v1::JobState state, int epoch, int step) {
  v1::JobUpdate u;
  v1::Job* j = u.mutable_job();
  j->set_id("j-1");
  j->set_state(state);
  j->mutable_progress()->set_epoch(epoch);
  j->mutable_progress()->set_epochs(2);
  j->mutable_progress()->set_step(step);
  j->mutable_progress()->set_steps_per_epoch(10);
  j->mutable_progress()->set_last_loss(0.5);
  return u;
}

v1::JobUpdate EventUpdate(const std::string& type, const std::string& message, int rank = -1) {
  v1::JobUpdate u;
  u.mutable_event()->set_type(type);
  u.mutable_event()->set_message(message);
  u.mutable_event()->set_rank(rank);
  SetTimestamp(absl::FromUnixSeconds(0), u.mutable_event()->mutable_time());
  return u;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out = absl::StrSplit(s, '\n');
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

// Issue #27 item 9: a continuation names the job it continues and where
// from; `list --tree` puts continuations under their source.
TEST(FormatTest, LineageShowsWhatAJobContinuesAndTreesContinuations) {
  v1::Job cont;
  cont.set_id("mlp-b2");
  cont.mutable_spec()->mutable_resume_from()->set_job("mlp-a1");
  v1::CheckpointRecord* r = cont.add_checkpoints();
  r->set_job_id("mlp-a1");
  r->set_epochs_done(2);
  r->set_global_step(40);
  std::ostringstream out;
  PrintJobStatus(out, cont, absl::Now(), {"mlp-c3"});
  EXPECT_THAT(out.str(),
              HasSubstr("Continues:     mlp-a1 (from its checkpoint at epoch 2, step 40)\n"));
  EXPECT_THAT(out.str(), HasSubstr("Continued by:  mlp-c3\n"));

  // Newest first, as ListJobs answers: a2 continues a1, a3 continues a2,
  // x continues a job not listed (a root), b stands alone.
  std::vector<v1::Job> jobs(5);
  const char* ids[] = {"a3", "b", "a2", "x", "a1"};
  const char* from[] = {"a2", "", "a1", "gone", ""};
  for (int i = 0; i < 5; ++i) {
    jobs[i].set_id(ids[i]);
    jobs[i].mutable_spec()->mutable_resume_from()->set_job(from[i]);
  }
  std::vector<std::string> order;
  for (const auto& [job, depth] : LineageOrder(jobs))
    order.push_back(absl::StrCat(depth, ":", job->id()));
  EXPECT_THAT(order, ElementsAre("0:b", "0:x", "0:a1", "1:a2", "2:a3"));
}

TEST(FormatTest, CommandJobSummaryShowsTheProgramNotTheEngine) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: s\nworld_size: 2\ncommand:\n  argv: [python3, train.py, --note, 'a b']\n"
      "  working_dir: /srv/code\n  env: {WANDB_MODE: offline}\n  local_rank: arg\n",
      "job.yaml");
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  std::ostringstream out;
  PrintSpecSummary(out, p.spec, "");
  EXPECT_THAT(out.str(), HasSubstr("command:      python3 train.py --note 'a b'\n"));
  EXPECT_THAT(out.str(), HasSubstr("working dir:  /srv/code\n"));
  EXPECT_THAT(out.str(), HasSubstr("env:          WANDB_MODE=offline\n"));
  EXPECT_THAT(
      out.str(),
      HasSubstr("local rank:   LOCAL_RANK and --local_rank=N (torch.distributed.launch)\n"));
  EXPECT_THAT(out.str(), Not(HasSubstr("model:")));
  EXPECT_THAT(out.str(), Not(HasSubstr("optimizer:")));
}

TEST(FormatTest, SummarySaysHowManyWorkersAJobWithNodesSpans) {
  ParsedJobSpec p = ParseJobSpecYaml(
      "name: s\nworld_size: 4\nscheduling: {nodes: 2}\ncommand: {argv: [./t]}\n", "job.yaml");
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  std::ostringstream out;
  PrintSpecSummary(out, p.spec, "");
  EXPECT_THAT(out.str(),
              HasSubstr("nodes:        placed on 2 workers, 2 ranks each (scheduling.nodes)\n"));
  p.spec.mutable_scheduling()->clear_nodes();
  std::ostringstream plain;
  PrintSpecSummary(plain, p.spec, "");
  EXPECT_THAT(plain.str(), Not(HasSubstr("nodes:")));
}

TEST(FollowPrinterTest, PlainModePrintsEventsAndRateLimitsProgressLines) {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::ostringstream out;
  FollowPrinter::Options options;
  options.terminal = false;
  options.progress_interval = absl::Seconds(5);
  FollowPrinter p(out, options, [&] { return now; });
  p.OnUpdate(EventUpdate("submitted", "job submitted: 2 rank(s)"));
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 0, 1));
  now += absl::Seconds(1);
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 0, 2));  // Too soon: no line.
  now += absl::Seconds(5);
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 0, 5));
  p.OnUpdate(EventUpdate("epoch_end",
                         "epoch 1/2 done: loss 0.5000, eval loss 0.2500, accuracy 75.00%", 0));
  p.OnUpdate(EventUpdate("rank_failed", "exited 3", 1));
  v1::Job done = JobSnapshot(v1::JOB_STATE_SUCCEEDED, 1, 10).job();
  EXPECT_EQ(p.Finish(done), 0);
  std::string text = out.str();
  EXPECT_THAT(text, Not(HasSubstr("\r")));
  std::vector<std::string> lines = Lines(text);
  ASSERT_EQ(lines.size(), 6u) << text;
  EXPECT_THAT(lines[0], HasSubstr("  submitted  job submitted: 2 rank(s)"));
  EXPECT_THAT(lines[1], HasSubstr("  progress  epoch 1/2  step 1/10  loss 0.5000"));
  EXPECT_THAT(lines[2], HasSubstr("  progress  epoch 1/2  step 5/10  loss 0.5000"));
  EXPECT_THAT(
      lines[3],
      HasSubstr("  epoch_end  epoch 1/2 done: loss 0.5000, eval loss 0.2500, accuracy 75.00%"));
  EXPECT_THAT(lines[4], HasSubstr("  rank_failed  rank 1: exited 3"));
  EXPECT_EQ(lines[5], "job j-1 SUCCEEDED");
}

TEST(FollowPrinterTest, TerminalModeRedrawsOneStatusLineInPlace) {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::ostringstream out;
  FollowPrinter::Options options;
  options.terminal = true;
  FollowPrinter p(out, options, [&] { return now; });
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 0, 5));
  now += absl::Seconds(1);
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 1, 0));
  p.OnUpdate(EventUpdate("epoch_end", "epoch 1/2 done: loss 0.5000", 0));
  v1::Job failed = JobSnapshot(v1::JOB_STATE_FAILED, 1, 0).job();
  failed.set_state_reason("rank 1 exited 3\n(no restarts left)");
  EXPECT_EQ(p.Finish(failed), 1);
  std::string text = out.str();
  const std::string clear = "\r\033[K";
  EXPECT_THAT(text,
              HasSubstr(clear + "RUNNING  [=====>              ]  25%  epoch 1/2  step 5/10"));
  EXPECT_THAT(text,
              HasSubstr(clear + "RUNNING  [==========>         ]  50%  epoch 2/2  step 0/10"));
  // The event is printed on its own line (status line cleared first), then
  // the status line is drawn again below it.
  EXPECT_THAT(text, HasSubstr("step 0/10  loss 0.5000" + clear));
  EXPECT_THAT(text, HasSubstr("  epoch_end  epoch 1/2 done: loss 0.5000\n" + clear + "RUNNING"));
  EXPECT_THAT(text, HasSubstr(clear + "job j-1 FAILED: rank 1 exited 3\n  (no restarts left)\n"));
}

TEST(FollowPrinterTest, JsonModeWritesOneDocumentPerLine) {
  std::ostringstream out;
  FollowPrinter::Options options;
  options.json = true;
  FollowPrinter p(out, options);
  p.OnUpdate(EventUpdate("submitted", "job submitted"));
  p.OnUpdate(JobSnapshot(v1::JOB_STATE_RUNNING, 0, 1));
  EXPECT_EQ(p.Finish(JobSnapshot(v1::JOB_STATE_CANCELLED, 0, 1).job()), 1);
  std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("\"type\":\"submitted\""));
  EXPECT_THAT(lines[2], HasSubstr("\"state\":\"JOB_STATE_CANCELLED\""));
}

// Issue #48: `queue describe` and `queue list` word the use of every quota
// dimension from QueueStatus (used, borrowed, nominal, limits).
TEST(QueueTextTest, DescribeShowsTheUseOfEveryQuotaDimensionTheQueueHasOrUses) {
  v1::QueueStatus s;
  v1::Queue& q = *s.mutable_queue();
  q.set_name("team");
  q.set_nominal_gpu(2);
  q.set_borrowing_limit_gpu(1);
  q.set_nominal_cpus(2.5);
  q.set_lending_limit_cpus(2);
  q.set_nominal_memory_bytes(int64_t{8} << 30);
  q.set_borrowing_limit_memory_bytes(int64_t{16} << 30);
  (*q.mutable_nominal_gpu_flavors())["h100"] = 4;
  s.set_used_gpu(3);
  s.set_borrowed_gpu(1);
  s.set_used_cpus(3.5);
  s.set_borrowed_cpus(1);
  s.set_used_memory_bytes(int64_t{12} << 30);
  s.set_borrowed_memory_bytes(int64_t{4} << 30);
  (*s.mutable_used_gpu_flavors())["h100"] = 2;
  (*s.mutable_used_gpu_flavors())["a100"] = 1;
  EXPECT_EQ(GpuSlotsUse(s), "3 used of 2 (1 borrowed; borrows at most 1)");
  EXPECT_EQ(CpuSlotsUse(s), "0 used of unlimited");
  EXPECT_EQ(CpusUse(s), "3.5 used of 2.5 (1 borrowed; lends at most 2)");
  EXPECT_EQ(MemoryUse(s), "12 GiB used of 8 GiB (4 GiB borrowed; borrows at most 16 GiB)");
  EXPECT_THAT(FlavorUses(s), ElementsAre(::testing::Pair("a100", "1 used of unlimited"),
                                         ::testing::Pair("h100", "2 used of 4")));
  EXPECT_EQ(ResourceUseCell(s),
            "cpus 3.5/2.5 (lends at most 2), memory 12 GiB/8 GiB (borrows at most 16 GiB)");

  // Without such quotas: CPUs and memory only while held; a flavor quota
  // shows with nothing held.
  v1::QueueStatus plain;
  plain.mutable_queue()->set_name("plain");
  EXPECT_EQ(CpusUse(plain), "");
  EXPECT_EQ(MemoryUse(plain), "");
  EXPECT_TRUE(FlavorUses(plain).empty());
  EXPECT_EQ(ResourceUseCell(plain), "-");
  plain.set_used_cpus(1.001);
  plain.set_used_memory_bytes(int64_t{3} << 30);
  EXPECT_EQ(CpusUse(plain), "1.001 used of unlimited");
  EXPECT_EQ(MemoryUse(plain), "3 GiB used of unlimited");
  EXPECT_EQ(ResourceUseCell(plain), "cpus 1.001/-, memory 3 GiB/-");
  (*plain.mutable_queue()->mutable_nominal_gpu_flavors())["a100"] = 2;
  EXPECT_THAT(FlavorUses(plain), ElementsAre(::testing::Pair("a100", "0 used of 2")));
  v1::QueueStatus idle;
  idle.mutable_queue()->set_nominal_memory_bytes(int64_t{16} << 30);
  EXPECT_EQ(MemoryUse(idle), "0 used of 16 GiB");
  EXPECT_EQ(ResourceUseCell(idle), "memory 0/16 GiB");
}

// Issue #48 item 2: a flavor's quota borrows and lends; describe says what
// is borrowed and the limits, create's message the limits.
TEST(QueueTextTest, AFlavorLineSaysWhatIsBorrowedAndTheFlavorsLimits) {
  v1::QueueStatus s;
  v1::Queue& q = *s.mutable_queue();
  q.set_name("team");
  (*q.mutable_nominal_gpu_flavors())["h100"] = 4;
  (*q.mutable_nominal_gpu_flavors())["a100"] = 2;
  (*q.mutable_borrowing_limit_gpu_flavors())["h100"] = 2;
  (*q.mutable_lending_limit_gpu_flavors())["h100"] = 1;
  (*q.mutable_lending_limit_gpu_flavors())["a100"] = 0;
  (*s.mutable_used_gpu_flavors())["h100"] = 5;
  (*s.mutable_borrowed_gpu_flavors())["h100"] = 1;
  EXPECT_THAT(FlavorUses(s),
              ElementsAre(::testing::Pair("a100", "0 used of 2 (lends at most 0)"),
                          ::testing::Pair("h100",
                                          "5 used of 4 (1 borrowed; borrows at most 2, lends at "
                                          "most 1)")));
  EXPECT_EQ(FlavorQuotaText(q),
            "a100 2, h100 4 gpus; a100 lends at most 0; h100 borrows at most 2, lends at most 1");
  q.clear_borrowing_limit_gpu_flavors();
  q.clear_lending_limit_gpu_flavors();
  EXPECT_EQ(FlavorQuotaText(q), "a100 2, h100 4 gpus");
}

TEST(QueueTextTest, FlavorFlagsReadFlavorEqualsCount) {
  std::map<std::string, int> got;
  ASSERT_TRUE(
      ParseFlavorCounts("--borrowing-limit-gpus-flavor", {"h100=2", "a100=0", "h100=3"}, got).ok());
  EXPECT_EQ(got, (std::map<std::string, int>{{"a100", 0}, {"h100", 3}})) << "the last one wins";
  for (const char* bad : {"h100", "=2", "h100=-1", "h100=two", "h100="}) {
    std::map<std::string, int> none;
    const absl::Status s = ParseFlavorCounts("--lending-limit-gpus-flavor", {bad}, none);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_EQ(s.message(), absl::StrCat("--lending-limit-gpus-flavor: must be FLAVOR=N with N >= 0 "
                                        "(e.g. h100=4), got '",
                                        bad, "'"));
    EXPECT_TRUE(none.empty());
  }
}

}  // namespace
}  // namespace trainctl::cli

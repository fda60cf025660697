// The trainctl CLI's streaming verbs against a real coordinator
// (cli_test_support.h): logs (stored and followed) and follow mode (plain,
// JSON, failing, pending, interrupted).
#include "client/cli_test_support.h"

namespace trainctl {
namespace {

using namespace cli_testing;  // NOLINT: the CLI tests' shared fixture

// --- logs -----------------------------------------------------------------------

TEST_F(CliTest, LogsPrintsStoredLinesPerRank) {
  cluster_.AddWorker("w0", 2);
  std::string id = Submit();
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 2));
  CliRun r = Run({"logs", id});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Lines(r.out),
              ElementsAre("[rank0]: rank 0 trained 2 epochs", "[rank1]: rank 1 trained 2 epochs"));
  r = Run({"logs", id, "--rank", "1", "--attempt", "1", "--tail", "5"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "rank 1 trained 2 epochs\n");
  r = Run({"logs", id, "-f", "-o", "json"});  // A finished job: follow ends at once.
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  auto chunk = ParseJson<v1::LogChunk>(lines[1]);
  EXPECT_EQ(chunk.rank(), 1);
  EXPECT_EQ(chunk.lines(0).text(), "rank 1 trained 2 epochs");
  r = Run({"logs", id, "--attempt", "9"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "trainctl logs: --attempt: 9 is out of range: job " + id +
                       " has 1 attempt(s) (1..1)\n");
  r = Run({"logs", id, "--rank", "2"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "trainctl logs: --rank: 2 is outside job " + id +
                       "'s world: world_size 2 (ranks 0..1)\n");
  // Any client gets the same from the coordinator.
  {
    std::unique_ptr<Client> client = Client::FromChannel(cluster_.channel());
    LogsOptions bad;
    bad.rank = 7;
    absl::Status s = client->Logs(id, bad, [](const v1::LogChunk&) { return true; });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("rank: 7 is outside job '" + id + "''s world: world_size 2"));
    bad.rank.reset();
    bad.attempt = 4;
    s = client->Logs(id, bad, [](const v1::LogChunk&) { return true; });
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("attempt: 4 is out of range: job '" + id + "' has 1 attempt(s) (1..1"));
  }
  r = Run({"logs", "nope"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "trainctl logs: no job 'nope' (not an id, a job name or the start of an id)\n");
}

TEST_F(CliTest, LogsFollowWaitsForThePlacementThenStreamsUntilTheJobEnds) {
  std::string id = Submit({"world_size=1"});  // No worker yet: PENDING.
  CliRun r;
  std::thread follower([&] { r = Run({"logs", id, "-f"}); });
  absl::SleepFor(absl::Milliseconds(200));
  cluster_.AddWorker("w0", 1);
  ASSERT_EQ(cluster_.WaitForStartedJob(), id);
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 1));
  follower.join();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank0]: rank 0 trained 1 epochs\n");
}

// --- follow mode ----------------------------------------------------------------

TEST_F(CliTest, FollowPrintsPlainLinesAndExitsZeroWhenTheJobSucceeds) {
  cluster_.AddWorker("w0", 1);
  cluster_.AddWorker("w1", 1);
  CliRun r;
  std::thread follower([&] { r = Run({"submit", job_file_, "--follow"}); });
  std::string id = cluster_.WaitForStartedJob();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 2));
  follower.join();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("\r"))) << "not a terminal: no redrawn line";
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 8u) << r.out;
  EXPECT_THAT(lines[0], MatchesRegex("submitted job " + id + " \\((PENDING|SCHEDULED).*\\)"));
  auto has_line = [&](const std::string& re) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
      return ::testing::Matches(MatchesRegex(re))(l);
    });
  };
  EXPECT_TRUE(has_line("[0-9:]{8}  submitted  job submitted: 2 rank\\(s\\)")) << r.out;
  EXPECT_TRUE(has_line("[0-9:]{8}  scheduled  attempt 1 placed on .*")) << r.out;
  EXPECT_TRUE(has_line("[0-9:]{8}  running  all 2 ranks ready")) << r.out;
  EXPECT_TRUE(has_line(
      "[0-9:]{8}  epoch_end  epoch 1/2 done: loss 0.5000, eval loss 0.2500, accuracy 75.00%"))
      << r.out;
  EXPECT_TRUE(has_line(
      "[0-9:]{8}  epoch_end  epoch 2/2 done: loss 0.2500, eval loss 0.1250, accuracy 85.00%"))
      << r.out;
  EXPECT_TRUE(has_line("[0-9:]{8}  succeeded  every rank finished training")) << r.out;
  int progress_lines = 0;
  for (const std::string& l : lines)
    progress_lines += ::testing::Matches(HasSubstr("  progress  "))(l);
  EXPECT_LE(progress_lines, 1) << "at most one progress line per few seconds";
  EXPECT_THAT(lines[lines.size() - 2], MatchesRegex("job " + id + " SUCCEEDED after .*"));
  EXPECT_EQ(lines.back(), "final eval: loss 0.1250, accuracy 85.00%");
}

TEST_F(CliTest, FollowExitsOneWithTheReasonWhenTheJobFails) {
  cluster_.AddWorker("w0", 1);
  cluster_.AddWorker("w1", 1);
  CliRun r;
  std::thread follower([&] {
    r = Run({"submit", job_file_, "--follow", "--set", "restart.max_restarts=0"});
  });
  std::string id = cluster_.WaitForStartedJob();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(cluster_.FailRank(id, 1, 1, "data.train: out of memory"));
  ASSERT_TRUE(cluster_.WaitState(id, v1::JOB_STATE_FAILED));
  follower.join();
  EXPECT_EQ(r.code, 1) << r.out;
  std::vector<std::string> lines = Lines(r.out);
  EXPECT_THAT(
      r.out,
      MatchesRegex(
          "(.|\n)*\n[0-9:]{8}  attempt_failed  rank 1 on host-w[01] \\(worker w[01]\\) exited "
          "with code 3: data.train: out of memory \\| last log lines: \\| Traceback: the "
          "last words of rank 1\n(.|\n)*"));
  EXPECT_THAT(r.out, HasSubstr("  failed  no restarts left (max_restarts: 0)\n"));
  // The coordinator's whole reason: which rank, what it said, its last log
  // lines, the restart budget.
  EXPECT_THAT(
      r.out,
      MatchesRegex(
          "(.|\n)*\njob " + id +
          " FAILED after [0-9a-z]+: rank 1 on host-w[01] \\(worker w[01]\\) exited with code "
          "3: data.train: out of memory\n"
          "  .*last log lines:\n"
          "  .*Traceback: the last words of rank 1\n"
          "  \\(no restarts left: 0 of 0 used\\)\n"));
}

TEST_F(CliTest, FollowSaysWhyTheJobIsPending) {
  CliRun r;
  std::thread follower([&] {
    r = Run({"submit", job_file_, "--follow", "--set", "world_size=1"});
  });
  // No worker yet: the job waits, and the plain output says why.
  absl::SleepFor(absl::Milliseconds(500));
  cluster_.AddWorker("w0", 1);
  std::string id = cluster_.WaitForStartedJob();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 1));
  follower.join();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(
      r.out,
      MatchesRegex("(.|\n)*\n[0-9:]{8}  pending  no schedulable worker has cpu slots\n(.|\n)*"))
      << r.out;
}

TEST_F(CliTest, InterruptedFollowSaysTheJobKeepsRunningAndHowToFollowIt) {
  cluster_.AddWorker("w0", 1);
  const std::string log = dir_ + "/follow.log";
  const std::vector<std::string> args = {TRAINCTL_CLI_BINARY, "--coordinator",  cluster_.address(),
                                         "--token-file",      AdminTokenFile(), "submit",
                                         job_file_,           "--follow",       "--set",
                                         "world_size=1"};
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  SpawnOptions o;
  o.argv = args;
  o.fds = {{1, fd}, {2, fd}};
  absl::StatusOr<Subprocess> cli = Subprocess::Spawn(o);
  close(fd);
  ASSERT_TRUE(cli.ok()) << cli.status();
  std::string id = cluster_.WaitForStartedJob();
  ASSERT_FALSE(id.empty());
  auto read_log = [&] {
    std::ifstream f(log);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // Interrupt once the watch printed the job's history (it is following).
  for (absl::Time deadline = absl::Now() + absl::Seconds(15);
       absl::Now() < deadline && read_log().find("  scheduled  ") == std::string::npos;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(read_log(), HasSubstr("  scheduled  "));
  cli->Signal(SIGINT);
  std::optional<ExitStatus> status = cli->WaitFor(absl::Seconds(15));
  if (!status) {
    cli->Terminate(absl::ZeroDuration());
    FAIL() << "trainctl did not exit on SIGINT\n" << read_log();
  }
  ASSERT_TRUE(status->exited()) << read_log();
  EXPECT_EQ(status->code, 130);
  EXPECT_THAT(read_log(), HasSubstr("interrupted: job " + id +
                                    " keeps running on the cluster; follow it again with "
                                    "`trainctl logs -f " +
                                    id + "` or `trainctl status " + id + "`"));
  CliRun r = Run({"status", id});
  EXPECT_THAT(r.out, Not(HasSubstr("CANCELLED")))
      << "interrupting the follow does not stop the job";
}

// Issue #45 item 4: any user of the host (and any rank) could read an
// admin token from /proc/PID/cmdline of a running `trainctl logs -f
// --token ...`. With --token-file the running follower's command line holds
// the file's name and no secret.
TEST_F(CliTest, AFollowingLogsHasNoTokenOnItsCommandLine) {
  cluster_.AddWorker("w0", 1);
  const std::string id = Submit({"world_size=1"});
  ASSERT_EQ(cluster_.WaitForStartedJob(), id);
  ASSERT_TRUE(cluster_.SendLogs(id, 1, 0, {"rank 0 is training"}));
  const std::string token_file = AdminTokenFile();
  const std::string log = dir_ + "/logs-f.log";
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  SpawnOptions o;
  o.argv = {TRAINCTL_CLI_BINARY,
            "--coordinator",
            cluster_.address(),
            "--token-file",
            token_file,
            "logs",
            "-f",
            id};
  o.fds = {{1, fd}, {2, fd}};
  absl::StatusOr<Subprocess> cli = Subprocess::Spawn(o);
  close(fd);
  ASSERT_TRUE(cli.ok()) << cli.status();
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // Authenticated and following: the job's line came through.
  for (absl::Time deadline = absl::Now() + absl::Seconds(30);
       absl::Now() < deadline && read(log).find("rank 0 is training") == std::string::npos;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(read(log), HasSubstr("rank 0 is training"));
  const std::string cmdline = read(absl::StrCat("/proc/", cli->pid(), "/cmdline"));
  EXPECT_THAT(cmdline, HasSubstr(token_file)) << "the follower's own command line";
  EXPECT_THAT(cmdline, Not(HasSubstr(cluster_.admin_token())));
  EXPECT_THAT(cmdline,
              Not(HasSubstr(cluster_.admin_token().substr(cluster_.admin_token().size() / 2))));
  EXPECT_THAT(read(log), Not(HasSubstr("warning")));
  EXPECT_FALSE(cli->WaitFor(absl::ZeroDuration()).has_value()) << "still following\n" << read(log);
  cli->Terminate(absl::Seconds(5));
}

TEST(CliUsageTest, RunWithDeviceCudaAndNoGpuFailsAtOnce) {
  std::string dir = testing::MakeTempDir();
  std::string file = testing::WriteFile(dir, "job.yaml", testing::ValidJobYaml(1));
  absl::Time start = absl::Now();
  CliRun r = RunTrainctl({"run", file, "--set", "device=cuda", "--gpus", "none"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(
      r.err,
      "trainctl run: device: cuda, but --gpus none leaves this run no GPU; use --set device=cpu "
      "(or device=auto)\n");
  if (!worker::DiscoverGpus().empty()) GTEST_SKIP() << "this host has a GPU";
  r = RunTrainctl({"run", file, "--set", "device=cuda"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, StartsWith("trainctl run: device: cuda, but this host has no GPU visible"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10))
      << "fails at once, not after waiting for a slot";
}

TEST_F(CliTest, FollowInJsonWritesOneDocumentPerLine) {
  cluster_.AddWorker("w0", 1);
  CliRun r;
  std::thread follower([&] {
    r = Run({"-o", "json", "submit", job_file_, "--follow", "--set", "world_size=1"});
  });
  std::string id = cluster_.WaitForStartedJob();
  ASSERT_TRUE(cluster_.RunAttemptToSuccess(id, 1, 1));
  follower.join();
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(ParseJson<v1::Job>(lines.front()).id(), id);
  std::vector<std::string> types;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    auto u = ParseJson<v1::JobUpdate>(lines[i]);
    if (u.has_event()) types.push_back(u.event().type());
  }
  EXPECT_THAT(types, AllOf(Contains("submitted"), Contains("succeeded")));
  EXPECT_EQ(ParseJson<v1::Job>(lines.back()).state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace trainctl

#include "worker/daemon/rank_supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace trainctl::worker {
namespace {

struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> status, out, err;
  int64_t dropped = 0;
  std::vector<std::string> recent;
  int batches = 0;
  // Keep every batch (a receiver that never lets go of them).
  bool hold = false;
  std::vector<std::shared_ptr<const RankLogBatch>> held;
  int code = -2, sig = -2;
  bool exited = false;
  RankCallbacks Callbacks() {
    RankCallbacks cb;
    cb.on_status = [this](const std::string&, const std::string& l) {
      absl::MutexLock lock(&mu);
      status.push_back(l);
    };
    cb.on_logs = [this](const std::string&, std::shared_ptr<const RankLogBatch> b) {
      absl::MutexLock lock(&mu);
      for (const RankLogLine& l : b->lines) (l.stream == 1 ? out : err).push_back(l.text);
      dropped += b->dropped;
      recent.insert(recent.end(), b->recent.begin(), b->recent.end());
      ++batches;
      if (hold) held.push_back(std::move(b));
    };
    cb.on_exit = [this](const std::string&, int c, int s) {
      absl::MutexLock lock(&mu);
      code = c;
      sig = s;
      exited = true;
    };
    return cb;
  }
  bool WaitExit(absl::Duration d = absl::Seconds(10)) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&exited), d);
  }
};

RankLaunch Sh(const std::string& script) {
  RankLaunch l;
  l.key = "job/1/0";
  l.binary = "/bin/sh";
  l.args = {"-c", script};
  l.env = {"FOO=bar"};
  l.work_dir = "/tmp";
  return l;
}

TEST(RankSupervisorTest, CapturesStreamsStatusAndExitCode) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  ASSERT_TRUE(
      sup.Launch(Sh("echo out $FOO; echo err >&2; echo ready >&3; printf 'no newline'; exit 7"))
          .ok());
  ASSERT_TRUE(r.WaitExit());
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.out, (std::vector<std::string>{"out bar", "no newline"}));
  EXPECT_EQ(r.err, std::vector<std::string>{"err"});
  EXPECT_EQ(r.status, std::vector<std::string>{"ready"});
  EXPECT_EQ(r.code, 7);
  EXPECT_EQ(r.sig, 0);
}

TEST(RankSupervisorTest, RunsTheRankAsItsUserWithItsExtraFds) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  // The config the daemon opened: the rank reads it through fd 4 although
  // the file is root's, 0600, in a directory the rank cannot enter.
  char tmpl[] = "/tmp/sup_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  const std::string conf = dir + "/rank-0.conf";
  FILE* f = fopen(conf.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("run.rank=0\n", f);
  fclose(f);
  ASSERT_EQ(chmod(conf.c_str(), 0600), 0);
  const int fd = open(conf.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  RankLaunch l = Sh("id -u; cat <&4; cat " + conf +
                    " || echo refused; kill -0 $PPID || echo cannot signal the daemon");
  l.extra_fds = {{4, fd}};
  l.run_as = *nobody;
  ASSERT_TRUE(sup.Launch(l).ok());
  close(fd);
  ASSERT_TRUE(r.WaitExit());
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.out, (std::vector<std::string>{std::to_string(nobody->uid), "run.rank=0", "refused",
                                             "cannot signal the daemon"}));
  const std::string err = absl::StrJoin(r.err, "\n");
  EXPECT_NE(err.find(conf + ": Permission denied"), std::string::npos) << err;
  EXPECT_NE(err.find("not permitted"), std::string::npos) << err;
  EXPECT_EQ(r.code, 0);
  std::system(("rm -rf " + dir).c_str());
}

TEST(RankSupervisorTest, ReportsSignalsAndKillsStubbornRanksAfterGrace) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  ASSERT_TRUE(sup.Launch(Sh("trap '' TERM; echo started; while true; do sleep 0.05; done")).ok());
  absl::SleepFor(absl::Milliseconds(200));
  absl::Time t0 = absl::Now();
  ASSERT_TRUE(sup.Stop("job/1/0", absl::Milliseconds(300)));
  ASSERT_TRUE(r.WaitExit());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(250)) << "SIGTERM ignored, then SIGKILL";
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.code, -1);
  EXPECT_EQ(r.sig, SIGKILL);
}

TEST(RankSupervisorTest, WaitNoneRunningReturnsWhenTheLastRankHasExited) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  ASSERT_TRUE(sup.Launch(Sh("echo started; sleep 600")).ok());
  EXPECT_FALSE(sup.WaitNoneRunning(absl::Milliseconds(20))) << "still running";
  ASSERT_TRUE(sup.Stop("job/1/0", absl::Seconds(30)));
  EXPECT_TRUE(sup.WaitNoneRunning(absl::Seconds(60)));
  EXPECT_TRUE(sup.Running().empty());
  EXPECT_TRUE(sup.WaitNoneRunning(absl::ZeroDuration())) << "none running: at once";
}

TEST(RankSupervisorTest, DumpStacksThenStopSignalsTheRankThenTerminatesItAfterTheWait) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  // Stands in for a Python rank's faulthandler on SIGUSR1.
  ASSERT_TRUE(sup.Launch(Sh("trap 'echo stacks dumped >&2' USR1; echo started >&3; "
                            "while true; do sleep 0.05; done"))
                  .ok());
  {
    absl::MutexLock lock(&r.mu);
    auto started = [&r]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) { return !r.status.empty(); };
    ASSERT_TRUE(r.mu.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(10)));
  }
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(sup.DumpStacksThenStop("job/1/0", absl::Milliseconds(400), absl::Seconds(10)));
  ASSERT_TRUE(r.WaitExit());
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(350)) << "SIGTERM only after the dump's wait";
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.err, std::vector<std::string>{"stacks dumped"});
  EXPECT_EQ(r.code, -1);
  EXPECT_EQ(r.sig, SIGTERM);
}

TEST(RankSupervisorTest, NoOrphansAndDuplicateKeysRefused) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  // The rank starts a grandchild and exits; the grandchild is killed with its group.
  char tmpl[] = "/tmp/sup_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string pidfile = dir + "/gc.pid";
  ASSERT_TRUE(sup.Launch(Sh("sleep 30 & echo $! > " + pidfile + "; sleep 0.3; exit 0")).ok());
  EXPECT_EQ(sup.Launch(Sh("true")).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(r.WaitExit());
  FILE* f = fopen(pidfile.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int gc = 0;
  ASSERT_EQ(fscanf(f, "%d", &gc), 1);
  fclose(f);
  absl::SleepFor(absl::Milliseconds(100));
  // Gone, or a zombie waiting for init to reap it: not running either way.
  std::string state = "gone";
  if (FILE* st = fopen(("/proc/" + std::to_string(gc) + "/stat").c_str(), "r")) {
    char buf[512] = {0};
    if (fgets(buf, sizeof buf, st) != nullptr) {
      std::string s(buf);
      state = s.substr(s.rfind(')') + 2, 1);
    }
    fclose(st);
  }
  EXPECT_TRUE(state == "gone" || state == "Z")
      << "grandchild " << gc << " outlived its rank: " << state;
  EXPECT_TRUE(sup.Running().empty());
}

TEST(RankSupervisorTest, LongLinesAreCutAndMissingBinaryExits127) {
  Recorder r;
  RankSupervisor sup(r.Callbacks());
  ASSERT_TRUE(sup.Launch(Sh("head -c 10000 /dev/zero | tr '\\0' 'x'; echo")).ok());
  ASSERT_TRUE(r.WaitExit());
  {
    absl::MutexLock lock(&r.mu);
    ASSERT_GE(r.out.size(), 2u);
    EXPECT_EQ(r.out[0].size(), 4096u);
  }
  Recorder r2;
  RankSupervisor sup2(r2.Callbacks());
  RankLaunch l = Sh("");
  l.binary = "/nonexistent/trainctl-rank";
  l.args.clear();
  ASSERT_TRUE(sup2.Launch(l).ok());
  ASSERT_TRUE(r2.WaitExit());
  absl::MutexLock lock(&r2.mu);
  EXPECT_EQ(r2.code, 127);
}

TEST(RankSupervisorTest, OutputIsRateLimitedAndBatchedWithACountOfWhatWasDropped) {
  Recorder r;
  SupervisorOptions o;
  o.log_lines_per_sec = 100;
  o.log_burst = 50;
  RankSupervisor sup(r.Callbacks(), o);
  // 200,000 lines as fast as the shell can print them.
  ASSERT_TRUE(sup.Launch(Sh("seq 1 200000")).ok());
  ASSERT_TRUE(r.WaitExit(absl::Seconds(30)));
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.code, 0);
  // The burst, plus what the bucket refilled while it printed.
  EXPECT_GE(r.out.size(), 50u);
  EXPECT_LT(r.out.size(), 50u + 100u * 30u);
  EXPECT_EQ(r.out[0], "1");
  EXPECT_EQ(static_cast<int64_t>(r.out.size()) + r.dropped, 200000)
      << "every line is delivered or counted";
  EXPECT_LT(r.batches, 1000) << "batched per round, not one callback per line";
  // The last lines are known even though the rate dropped them.
  ASSERT_GE(r.recent.size(), RankLogBatch::kRecentLines);
  EXPECT_EQ(r.recent.back(), "200000");
}

TEST(RankSupervisorTest, BatchesHeldByTheReceiverBoundTheMemory) {
  Recorder r;
  r.hold = true;  // Nothing is ever released: the bound must hold anyway.
  SupervisorOptions o;
  o.log_lines_per_sec = 1000000;
  o.log_burst = 1000000;
  o.max_pending_log_bytes = 64 * 1024;
  RankSupervisor sup(r.Callbacks(), o);
  // ~20 MB of 100-byte lines.
  ASSERT_TRUE(sup.Launch(Sh("yes "
                            "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                            "xxxxxxxxxxxxxxxxxxxxxxxxxxxx'"
                            " | head -n 200000"))
                  .ok());
  ASSERT_TRUE(r.WaitExit(absl::Seconds(30)));
  absl::MutexLock lock(&r.mu);
  int64_t held_bytes = 0;
  for (const auto& b : r.held) {
    for (const RankLogLine& l : b->lines) held_bytes += static_cast<int64_t>(l.text.size());
  }
  EXPECT_LE(held_bytes, 64 * 1024);
  EXPECT_GT(held_bytes, 32 * 1024);
  EXPECT_EQ(static_cast<int64_t>(r.out.size()) + r.dropped, 200000);
  // Released batches free their budget: output flows again.
  r.held.clear();
}

}  // namespace
}  // namespace trainctl::worker

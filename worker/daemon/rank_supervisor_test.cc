#include "worker/daemon/rank_supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "absl/synchronization/mutex.h"

namespace trainctl::worker {
namespace {

struct Recorder {
  absl::Mutex mu;
  std::vector<std::string> status, out, err;
  int code = -2, sig = -2;
  bool exited = false;
  RankCallbacks Callbacks() {
    RankCallbacks cb;
    cb.on_status = [this](const std::string&, const std::string& l) {
      absl::MutexLock lock(&mu);
      status.push_back(l);
    };
    cb.on_log = [this](const std::string&, int stream, const std::string& l) {
      absl::MutexLock lock(&mu);
      (stream == 1 ? out : err).push_back(l);
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
  ASSERT_TRUE(sup.Launch(Sh("echo out $FOO; echo err >&2; echo ready >&3; printf 'no newline'; exit 7")).ok());
  ASSERT_TRUE(r.WaitExit());
  absl::MutexLock lock(&r.mu);
  EXPECT_EQ(r.out, (std::vector<std::string>{"out bar", "no newline"}));
  EXPECT_EQ(r.err, std::vector<std::string>{"err"});
  EXPECT_EQ(r.status, std::vector<std::string>{"ready"});
  EXPECT_EQ(r.code, 7);
  EXPECT_EQ(r.sig, 0);
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
  EXPECT_TRUE(state == "gone" || state == "Z") << "grandchild " << gc << " outlived its rank: " << state;
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

}  // namespace
}  // namespace trainctl::worker

// The worker daemon's rank table with fakes for its two neighbours: a
// launcher that records what it is asked to start and stop (no process
// runs), and an outbox that records every report. Each test drives the
// table on a real EventLoop, as the daemon does, through the messages a
// coordinator sends and the events a launcher reports.
#include "worker/daemon/rank_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/codepack/code_pack.h"
#include "common/jobspec/artifact_names.h"
#include "common/jobspec/job_spec.h"

namespace trainctl::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class FakeLauncher final : public RankLauncher {
 public:
  absl::StatusOr<pid_t> Launch(const RankLaunch& launch) override {
    if (!fail_with.ok()) return fail_with;
    launches.push_back(launch);
    running.push_back(launch.key);
    return next_pid++;
  }
  bool Stop(const std::string& key, absl::Duration grace) override {
    stops.emplace_back(key, grace);
    return std::find(running.begin(), running.end(), key) != running.end();
  }
  bool DumpStacksThenStop(const std::string& key, absl::Duration dump_wait,
                          absl::Duration grace) override {
    dumps.emplace_back(key, dump_wait);
    return Stop(key, grace);
  }
  std::vector<std::string> Running() const override { return running; }

  absl::Status fail_with = absl::OkStatus();
  std::vector<std::pair<std::string, absl::Duration>> dumps;
  pid_t next_pid = 1000;
  std::vector<RankLaunch> launches;
  std::vector<std::string> running;
  std::vector<std::pair<std::string, absl::Duration>> stops;
};

class FakeOutbox final : public CoordinatorOutbox {
 public:
  bool Send(v1::WorkerMessage msg, bool critical) override {
    sent.push_back({std::move(msg), critical});
    return true;
  }
  std::string worker_id() override { return "w-7"; }

  struct Sent {
    v1::WorkerMessage msg;
    bool critical;
  };
  std::vector<Sent> sent;
};

// Serves archives by digest from files the test made (a copy of the
// bytes, or `damage` instead); counts the fetches.
class FakeCodeSource final : public CodeSource {
 public:
  absl::Status FetchCode(const std::string& job_id, const std::string& digest,
                         Sink write) override {
    absl::MutexLock lock(&mu);
    ++fetches;
    if (!fail_with.ok()) return fail_with;
    auto it = archives.find(digest);
    if (it == archives.end()) return absl::NotFoundError("no such code");
    if (!damage.empty()) return write(damage);
    std::ostringstream bytes;
    bytes << std::ifstream(it->second, std::ios::binary).rdbuf();
    return write(bytes.str());
  }
  void CancelFetches() override {}

  absl::Mutex mu;
  int fetches ABSL_GUARDED_BY(mu) = 0;
  absl::Status fail_with ABSL_GUARDED_BY(mu) = absl::OkStatus();
  std::string damage ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> archives ABSL_GUARDED_BY(mu);
};

// "RANK=0" in a launch's environment.
std::string EnvOf(const RankLaunch& l, const std::string& name) {
  for (const std::string& e : l.env) {
    if (e.rfind(name + "=", 0) == 0) return e.substr(name.size() + 1);
  }
  return "<unset>";
}

class RankTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Canonical, as the daemon makes its work dir at Start.
    dir_ = fs::path(absl::StrCat(::testing::TempDir(), "/rank_table_test.", getpid()))
               .lexically_normal()
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_ + "/work");
    options_.work_dir = dir_ + "/work";
    options_.address = "127.0.0.1";
    options_.allow_commands = true;
    options_.data_roots = {"/"};
    unsetenv("OMP_NUM_THREADS");  // torchrun's one-thread rule applies
  }
  void TearDown() override {
    loop_.StopAndJoin();
    table_.reset();
    fs::remove_all(dir_);
  }

  RankTable& Table() {
    if (!table_) {
      RankTablePaths paths;
      paths.base_dir = dir_;
      paths.data_read_roots = {"/"};
      table_ = std::make_unique<RankTable>(options_, paths, loop_, out_, launcher_, &code_);
    }
    return *table_;
  }
  // Runs `fn` on the loop, as the daemon's posts do.
  void OnLoop(const std::function<void()>& fn) { loop_.RunSync(fn); }
  void Deliver(const v1::CoordinatorMessage& m) {
    OnLoop([&] { Table().OnMessage(m); });
  }

  // A command job of two ranks, both on this host, rank 0's host making the
  // rendezvous (MASTER_PORT).
  static v1::CoordinatorMessage Start(int32_t attempt = 1) {
    ParsedJobSpec p = ParseJobSpecYaml(
        "name: t\nworld_size: 2\ndevice: cpu\ncommand:\n  argv: [/bin/sh, -c, 'exit 0']\n",
        "t.yaml", {});
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].ToString());
    v1::CoordinatorMessage m;
    v1::StartRanks* s = m.mutable_start_ranks();
    s->set_job_id("job-1");
    s->set_attempt(attempt);
    *s->mutable_spec() = p.spec;
    s->set_produce_rendezvous(true);
    s->set_owner("alice");
    s->set_rendezvous_secret("00112233");
    for (int rank : {0, 1}) {
      v1::RankAssignment* ra = s->add_ranks();
      ra->set_rank(rank);
      ra->set_local_rank(rank);
      ra->set_world_size(2);
      ra->set_local_world_size(2);
      ra->set_num_nodes(1);
      ra->mutable_slot()->set_kind(v1::Slot::KIND_CPU);
      ra->mutable_slot()->set_index(rank);
    }
    return m;
  }
  static v1::CoordinatorMessage Stop(int32_t attempt, std::vector<int32_t> ranks, int grace_ms) {
    v1::CoordinatorMessage m;
    v1::StopRanks* s = m.mutable_stop_ranks();
    s->set_job_id("job-1");
    s->set_attempt(attempt);
    for (int32_t r : ranks) s->add_ranks(r);
    s->set_grace_period_ms(grace_ms);
    return m;
  }

  // The rank statuses sent, as "rank:STATE".
  std::vector<std::string> Statuses() const {
    std::vector<std::string> out;
    for (const FakeOutbox::Sent& s : out_.sent) {
      if (!s.msg.has_rank_status()) continue;
      out.push_back(absl::StrCat(s.msg.rank_status().rank(), ":",
                                 v1::RankState_Name(s.msg.rank_status().state())));
    }
    return out;
  }
  const v1::RankStatus& LastStatus() const {
    for (auto it = out_.sent.rbegin(); it != out_.sent.rend(); ++it) {
      if (it->msg.has_rank_status()) return it->msg.rank_status();
    }
    static const v1::RankStatus none;
    ADD_FAILURE() << "no rank status was sent";
    return none;
  }
  std::vector<v1::RunningRank> Running() {
    std::vector<v1::RunningRank> r;
    OnLoop([&] { r = Table().RunningRanks(); });
    return r;
  }

  std::string dir_;
  FakeClock clock_;  // options_.clock in a test that sets it
  DaemonOptions options_;
  EventLoop loop_;
  FakeLauncher launcher_;
  FakeOutbox out_;
  FakeCodeSource code_;
  std::unique_ptr<RankTable> table_;
};

TEST_F(RankTableTest, StartReportsTheRendezvousThenLaunchesEveryRankUnderTorchrunsContract) {
  Deliver(Start());
  ASSERT_FALSE(out_.sent.empty());
  ASSERT_TRUE(out_.sent[0].msg.has_rendezvous()) << out_.sent[0].msg.DebugString();
  EXPECT_TRUE(out_.sent[0].critical);
  const std::string port = absl::StrCat(out_.sent[0].msg.rendezvous().info().master_port());
  ASSERT_EQ(launcher_.launches.size(), 2u);
  for (int rank : {0, 1}) {
    const RankLaunch& l = launcher_.launches[rank];
    EXPECT_EQ(l.key, absl::StrCat("job-1/1/", rank));
    EXPECT_EQ(l.binary, "/bin/sh");
    EXPECT_THAT(l.args, ElementsAre("-c", "exit 0"));
    EXPECT_EQ(EnvOf(l, "RANK"), absl::StrCat(rank));
    EXPECT_EQ(EnvOf(l, "WORLD_SIZE"), "2");
    EXPECT_EQ(EnvOf(l, "MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(EnvOf(l, "MASTER_PORT"), port);
    EXPECT_EQ(EnvOf(l, "OMP_NUM_THREADS"), "1");  // two ranks share the host
    EXPECT_TRUE(fs::is_directory(l.work_dir)) << l.work_dir;
  }
  // A command rank is ready once started.
  EXPECT_THAT(Statuses(), ElementsAre("0:RANK_STATE_STARTING", "0:RANK_STATE_RUNNING",
                                      "1:RANK_STATE_STARTING", "1:RANK_STATE_RUNNING"));
  for (const FakeOutbox::Sent& s : out_.sent) EXPECT_TRUE(s.critical) << s.msg.DebugString();
}

TEST_F(RankTableTest, AReconnectListsTheRunningRanksAndTheResentStartLaunchesNothing) {
  Deliver(Start());
  std::vector<v1::RunningRank> running = Running();
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].job_id(), "job-1");
  EXPECT_EQ(running[0].attempt(), 1);
  EXPECT_EQ(running[0].pid(), 1000);
  EXPECT_EQ(running[1].pid(), 1001);
  const size_t sent = out_.sent.size();
  // The coordinator resends StartRanks to a worker that registered again.
  Deliver(Start());
  EXPECT_EQ(launcher_.launches.size(), 2u);
  EXPECT_EQ(out_.sent.size(), sent);
}

TEST_F(RankTableTest, StopAsksTheLauncherAndTheExitReportsStoppedOnce) {
  Deliver(Start());
  out_.sent.clear();
  Deliver(Stop(1, {}, 1500));
  ASSERT_EQ(launcher_.stops.size(), 2u);
  EXPECT_EQ(launcher_.stops[0].first, "job-1/1/0");
  EXPECT_EQ(launcher_.stops[0].second, absl::Milliseconds(1500));
  EXPECT_THAT(Statuses(), IsEmpty());  // Each exit reports its own end.
  OnLoop([&] { Table().OnExit("job-1/1/0", -1, SIGTERM); });
  EXPECT_EQ(LastStatus().state(), v1::RANK_STATE_STOPPED);
  EXPECT_EQ(LastStatus().exit().message(), "stopped on request");
  OnLoop([&] { Table().OnExit("job-1/1/1", 0, 0); });
  EXPECT_EQ(LastStatus().rank(), 1);
  EXPECT_EQ(LastStatus().state(), v1::RANK_STATE_STOPPED);
  // Every end reported: the attempt is forgotten; a late exit says nothing.
  EXPECT_THAT(Running(), IsEmpty());
  OnLoop([&] { Table().OnExit("job-1/1/1", 0, 0); });
  EXPECT_THAT(Statuses(), ElementsAre("0:RANK_STATE_STOPPED", "1:RANK_STATE_STOPPED"));
}

TEST_F(RankTableTest, APreemptionMakesEachRanksPreemptionFileBeforeItsStop) {
  Deliver(Start());
  ASSERT_EQ(launcher_.launches.size(), 2u);
  std::vector<std::string> files;
  for (const RankLaunch& l : launcher_.launches) files.push_back(EnvOf(l, "TRAINCTL_PREEMPT_FILE"));
  EXPECT_EQ(files[0], dir_ + "/work/jobs/job-1/attempt-1/rank-0.preempted");
  EXPECT_EQ(files[1], dir_ + "/work/jobs/job-1/attempt-1/rank-1.preempted");
  for (const std::string& f : files) EXPECT_FALSE(fs::exists(f));
  // A plain stop makes none.
  Deliver(Stop(1, {1}, 1000));
  EXPECT_FALSE(fs::exists(files[1]));
  v1::CoordinatorMessage preempt = Stop(1, {0}, 60000);
  preempt.mutable_stop_ranks()->set_checkpoint_first(true);
  Deliver(preempt);
  EXPECT_TRUE(fs::exists(files[0]));
  ASSERT_EQ(launcher_.stops.size(), 2u);
  EXPECT_EQ(launcher_.stops[1].second, absl::Milliseconds(60000));
}

TEST_F(RankTableTest, ARankThatFailsIsReportedWithItsPythonException) {
  Deliver(Start());
  auto batch = std::make_shared<RankLogBatch>();
  batch->lines.push_back({2, absl::Now(), "Traceback (most recent call last):"});
  batch->lines.push_back({2, absl::Now(), "ValueError: bad shape"});
  batch->recent = {"Traceback (most recent call last):", "ValueError: bad shape"};
  OnLoop([&] {
    Table().OnLogBatch("job-1/1/0", *batch);
    Table().OnExit("job-1/1/0", 1, 0);
  });
  const v1::RankStatus& st = LastStatus();
  EXPECT_EQ(st.rank(), 0);
  EXPECT_EQ(st.state(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.exit().exit_code(), 1);
  EXPECT_EQ(st.exit().kind(), v1::FAILURE_KIND_USER_CODE);
  EXPECT_THAT(st.exit().message(), HasSubstr("rank 0 exited with code 1: ValueError: bad shape"));
  EXPECT_THAT(st.exit().last_log_lines(), Contains("ValueError: bad shape"));
  // Its lines went out before its end; rank 1 runs on.
  bool logs_before_end = false;
  for (const FakeOutbox::Sent& s : out_.sent) {
    if (s.msg.has_logs() && s.msg.logs().lines_size() == 2) {
      logs_before_end = true;
      // Numbered from 1 in the rank's attempt (LogLine.seq: where a
      // resumed `logs -f` goes on).
      EXPECT_EQ(s.msg.logs().lines(0).seq(), 1);
      EXPECT_EQ(s.msg.logs().lines(1).seq(), 2);
    }
    if (s.msg.has_rank_status() && s.msg.rank_status().state() == v1::RANK_STATE_FAILED) break;
  }
  EXPECT_TRUE(logs_before_end);
  std::vector<v1::RunningRank> running = Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].rank(), 1);
}

TEST_F(RankTableTest, AStaleAttemptToldToStopIsStoppedByKeyWithoutAReport) {
  // Attempt 3 is not in the table (this daemon restarted, or it ended
  // here): a rank still running under its key is stopped all the same.
  Deliver(Stop(3, {0, 1}, 200));
  ASSERT_EQ(launcher_.stops.size(), 2u);
  EXPECT_EQ(launcher_.stops[0].first, "job-1/3/0");
  EXPECT_EQ(launcher_.stops[1].first, "job-1/3/1");
  EXPECT_TRUE(out_.sent.empty());
  // A newer attempt of the job starts normally after it.
  Deliver(Start(4));
  EXPECT_EQ(launcher_.launches.size(), 2u);
  EXPECT_EQ(launcher_.launches[0].key, "job-1/4/0");
}

TEST_F(RankTableTest, ASpawnErrorEndsTheRankFailedKindLaunch) {
  launcher_.fail_with = absl::InternalError("fork: resource temporarily unavailable");
  Deliver(Start());
  const v1::RankStatus& st = LastStatus();
  EXPECT_EQ(st.state(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.exit().kind(), v1::FAILURE_KIND_LAUNCH);
  EXPECT_THAT(st.exit().message(),
              HasSubstr("cannot start /bin/sh: fork: resource temporarily unavailable"));
  EXPECT_THAT(Statuses(), ElementsAre("0:RANK_STATE_FAILED", "1:RANK_STATE_FAILED"));
  EXPECT_THAT(Running(), IsEmpty());
}

TEST_F(RankTableTest,
       ACommandJobOnAWorkerWithoutAllowCommandsFailsAsConfigurationAndStartsNothing) {
  options_.allow_commands = false;
  Deliver(Start());
  EXPECT_TRUE(launcher_.launches.empty());
  EXPECT_EQ(LastStatus().exit().kind(), v1::FAILURE_KIND_CONFIG);
  EXPECT_THAT(LastStatus().exit().message(), HasSubstr("--allow-commands"));
}

// A hung script (StopRanks.stack_dump_ms): only a rank whose Python
// start-up hook beat is sent SIGUSR1 first (another program could die of
// it); the hook leads the ranks' PYTHONPATH, before the job's own.
TEST_F(RankTableTest, AHungScriptsHookedRanksDumpTheirStacksBeforeTheyStop) {
  options_.python_dir = "/opt/trainctl/python";
  v1::CoordinatorMessage start = Start();
  (*start.mutable_start_ranks()->mutable_spec()->mutable_command()->mutable_env())["PYTHONPATH"] =
      "/mine";
  Deliver(start);
  ASSERT_EQ(launcher_.launches.size(), 2u);
  EXPECT_EQ(EnvOf(launcher_.launches[0], "PYTHONPATH"),
            "/opt/trainctl/python/trainctl/_rank_boot:/mine");
  int pythonpaths = 0;
  for (const std::string& e : launcher_.launches[0].env)
    pythonpaths += e.rfind("PYTHONPATH=", 0) == 0;
  EXPECT_EQ(pythonpaths, 1);
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", "progress 0 30 phase=train moves=12 torch_ms=0\n");
  });
  v1::CoordinatorMessage stop = Stop(1, {}, 1500);
  stop.mutable_stop_ranks()->set_stack_dump_ms(1000);
  Deliver(stop);
  ASSERT_EQ(launcher_.dumps.size(), 1u);
  EXPECT_EQ(launcher_.dumps[0].first, "job-1/1/0");
  EXPECT_EQ(launcher_.dumps[0].second, absl::Seconds(1));
  EXPECT_EQ(launcher_.stops.size(), 2u) << "both stop; rank 1 (no hook) without the signal";
}

TEST_F(RankTableTest, LimitsThisWorkerCannotEnforceFailTheLaunchAsConfigurationAndStartNothing) {
  // cgroups off (--cgroup-root ""): a job with resources never runs
  // unlimited; each rank fails as CONFIG, naming why and what to do.
  options_.cgroup_root = "";
  v1::CoordinatorMessage m = Start();
  m.mutable_start_ranks()->mutable_spec()->mutable_resources()->set_memory(64 << 20);
  Deliver(m);
  EXPECT_TRUE(launcher_.launches.empty());
  const v1::RankStatus& st = LastStatus();
  EXPECT_EQ(st.state(), v1::RANK_STATE_FAILED);
  EXPECT_EQ(st.exit().kind(), v1::FAILURE_KIND_CONFIG);
  EXPECT_THAT(st.exit().message(),
              HasSubstr("resources: this worker cannot enforce the job's limits: cgroups are off"));
  EXPECT_THAT(st.exit().message(), HasSubstr("or leave out resources"));
  EXPECT_THAT(Statuses(), ElementsAre("0:RANK_STATE_FAILED", "1:RANK_STATE_FAILED"));
  EXPECT_THAT(Running(), IsEmpty());
}

TEST_F(RankTableTest, OnlyACheckpointOfTheJobInItsDirectoryIsReportedAndItsMetricsGoFirst) {
  Deliver(Start());
  out_.sent.clear();
  const std::string ck_dir = options_.work_dir + "/jobs/job-1/checkpoints";
  rankproto::RankMetric metric;
  metric.kind = "epoch_end";
  metric.epoch = 1;
  rankproto::CheckpointNote note;
  note.epochs_done = 1;
  note.global_step = 10;
  note.path = ck_dir + "/job-1.ckpt-epoch-000001.pt";
  rankproto::CheckpointNote elsewhere = note;
  elsewhere.path = options_.work_dir + "/worker.key";
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", rankproto::FormatMetric(metric));
    Table().OnStatusLine("job-1/1/0", rankproto::FormatCheckpoint(note));
    Table().OnStatusLine("job-1/1/0", rankproto::FormatCheckpoint(elsewhere));
  });
  ASSERT_EQ(out_.sent.size(), 2u);
  EXPECT_TRUE(out_.sent[0].msg.has_metrics());
  EXPECT_TRUE(out_.sent[0].critical);  // an epoch end is kept across a reconnect
  ASSERT_TRUE(out_.sent[1].msg.has_checkpoint());
  EXPECT_TRUE(out_.sent[1].critical);
  EXPECT_EQ(out_.sent[1].msg.checkpoint().record().path(), note.path);
  EXPECT_EQ(out_.sent[1].msg.checkpoint().record().epochs_done(), 1);
}

// Reports are stamped with the daemon's injected clock (DaemonOptions::clock),
// its wall side: a wall clock stepped back an hour moves the stamps with it,
// and the note of an ignored status line is stamped the same way.
TEST_F(RankTableTest, ReportsAreStampedWithTheDaemonsClock) {
  clock_.StepWall(absl::Hours(-1));
  options_.clock = &clock_;
  Deliver(Start());
  out_.sent.clear();
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", "metric kind=train epoch=0 step=2 loss=0 lr=0.1");
    Table().FlushMetrics();
  });
  ASSERT_EQ(out_.sent.size(), 1u);
  ASSERT_TRUE(out_.sent[0].msg.has_metrics());
  const absl::Time wall = clock_.Now();
  EXPECT_EQ(out_.sent[0].msg.metrics().points(0).time().seconds(), absl::ToUnixSeconds(wall));
  EXPECT_EQ(absl::ToUnixSeconds(wall), absl::ToUnixSeconds(clock_.Mono() - absl::Hours(1)));
  out_.sent.clear();
  clock_.Advance(absl::Minutes(5));
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", "nonsense that is no status line");
    Table().FlushLogs();
  });
  bool stamped = false;
  for (const auto& sent : out_.sent) {
    if (!sent.msg.has_logs()) continue;
    for (const v1::LogLine& l : sent.msg.logs().lines()) {
      if (l.text().find("ignored status line") == std::string::npos) continue;
      EXPECT_EQ(l.time().seconds(), absl::ToUnixSeconds(clock_.Now())) << l.DebugString();
      stamped = true;
    }
  }
  EXPECT_TRUE(stamped) << "no note of the ignored line";
}

// A script's reports (python/trainctl report()): each point carries what
// its line named and nothing else, an eval report is KIND_EVAL, and a batch
// with one is kept across a reconnect as an epoch end is.
TEST_F(RankTableTest, AScriptsReportsBecomePointsWithOnlyTheirFieldsAndEvalIsEval) {
  Deliver(Start());
  out_.sent.clear();
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", "metric kind=train epoch=0 step=2 loss=0 lr=0.1");
    Table().OnStatusLine("job-1/1/0",
                         "metric kind=eval epoch=0 step=2 eval_accuracy=0.5 s.val_f1=0.75");
    Table().FlushMetrics();
  });
  ASSERT_EQ(out_.sent.size(), 1u);
  ASSERT_TRUE(out_.sent[0].msg.has_metrics());
  EXPECT_TRUE(out_.sent[0].critical) << "an eval report is kept across a reconnect";
  const v1::MetricBatch& b = out_.sent[0].msg.metrics();
  ASSERT_EQ(b.points_size(), 2);
  const v1::MetricPoint& train = b.points(0);
  EXPECT_EQ(train.kind(), v1::MetricPoint::KIND_TRAIN);
  EXPECT_TRUE(train.has_loss()) << "a reported 0 is reported";
  EXPECT_DOUBLE_EQ(train.lr(), 0.1);
  EXPECT_FALSE(train.has_samples_per_sec() || train.has_steps_per_epoch() || train.has_data_ms() ||
               train.has_samples_seen() || train.has_eval())
      << train.DebugString();
  const v1::MetricPoint& eval = b.points(1);
  EXPECT_EQ(eval.kind(), v1::MetricPoint::KIND_EVAL);
  EXPECT_EQ(eval.step(), 2);
  ASSERT_TRUE(eval.has_eval());
  EXPECT_DOUBLE_EQ(eval.eval().accuracy(), 0.5);
  EXPECT_FALSE(eval.eval().has_loss() || eval.eval().has_samples()) << eval.DebugString();
  EXPECT_FALSE(eval.has_loss() || eval.has_lr() || eval.has_samples_per_sec())
      << eval.DebugString();
  EXPECT_DOUBLE_EQ(eval.scalars().at("val_f1"), 0.75);

  // The engine's line names every field: all set, 0s included.
  out_.sent.clear();
  rankproto::RankMetric engine;
  engine.step = 3;
  engine.loss = 0.25;
  OnLoop([&] {
    Table().OnStatusLine("job-1/1/0", rankproto::FormatMetric(engine));
    Table().FlushMetrics();
  });
  ASSERT_EQ(out_.sent.size(), 1u);
  EXPECT_FALSE(out_.sent[0].critical);
  const v1::MetricPoint& window = out_.sent[0].msg.metrics().points(0);
  EXPECT_TRUE(window.has_loss() && window.has_lr() && window.has_samples_per_sec() &&
              window.has_steps_per_epoch() && window.has_loss_scale() && window.has_samples_seen())
      << window.DebugString();
  EXPECT_FALSE(window.has_eval());
}

// Code travels with the job: the ranks start in the attempt's own copy of
// the job's code, fetched once per host however many attempts use it.
class RankTableCodeTest : public RankTableTest {
 protected:
  void SetUp() override {
    RankTableTest::SetUp();
    fs::create_directories(dir_ + "/src/pkg");
    std::ofstream(dir_ + "/src/train.py") << "print('hi')\n";
    std::ofstream(dir_ + "/src/pkg/util.py") << "X = 1\n";
    absl::StatusOr<codepack::PackedCode> packed =
        codepack::PackDirectory(dir_ + "/src", dir_ + "/code.tar");
    ASSERT_TRUE(packed.ok()) << packed.status();
    digest_ = packed->digest;
    absl::MutexLock lock(&code_.mu);
    code_.archives[digest_] = dir_ + "/code.tar";
  }
  v1::CoordinatorMessage StartWithCode(int32_t attempt, const std::string& working_dir = "") {
    v1::CoordinatorMessage m = Start(attempt);
    v1::CommandSpec* cmd = m.mutable_start_ranks()->mutable_spec()->mutable_command();
    cmd->mutable_code()->set_digest(digest_);
    cmd->set_working_dir(working_dir);
    return m;
  }
  // Waits (bounded) until `n` launches or `n` FAILED statuses happened: the
  // fetch runs on a thread of its own and posts its end to the loop.
  void AwaitOutcome(size_t launches, size_t failures) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      size_t failed = 0;
      size_t launched = 0;
      OnLoop([&] {
        launched = launcher_.launches.size();
        for (const std::string& st : Statuses()) failed += absl::EndsWith(st, "FAILED") ? 1 : 0;
      });
      if (launched >= launches && failed >= failures) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "timed out waiting for " << launches << " launches and " << failures
                  << " failures";
  }
  int Fetches() {
    absl::MutexLock lock(&code_.mu);
    return code_.fetches;
  }
  std::string digest_;
};

TEST_F(RankTableCodeTest, RanksStartInTheAttemptsCopyOfTheCodeFetchedOncePerHost) {
  Deliver(StartWithCode(1));
  AwaitOutcome(2, 0);
  const std::string code_dir = options_.work_dir + "/jobs/job-1/attempt-1/code";
  for (const RankLaunch& l : launcher_.launches) EXPECT_EQ(l.work_dir, code_dir);
  EXPECT_TRUE(fs::exists(code_dir + "/train.py"));
  EXPECT_TRUE(fs::exists(code_dir + "/pkg/util.py"));
  // The rendezvous went out before the ranks started, as without code.
  ASSERT_FALSE(out_.sent.empty());
  EXPECT_TRUE(out_.sent[0].msg.has_rendezvous());
  EXPECT_EQ(Fetches(), 1);

  // The next attempt (a restart) uses this host's copy of the archive.
  Deliver(Stop(1, {}, 0));
  OnLoop([&] {
    for (const RankLaunch& l : launcher_.launches) Table().OnExit(l.key, 0, SIGTERM);
  });
  Deliver(StartWithCode(2, "pkg"));
  AwaitOutcome(4, 0);
  EXPECT_EQ(launcher_.launches[2].work_dir, options_.work_dir + "/jobs/job-1/attempt-2/code/pkg");
  EXPECT_EQ(Fetches(), 1);
}

TEST_F(RankTableCodeTest, AFailedFetchFailsTheRanksNamingTheCodeAndARetryFetchesAgain) {
  {
    absl::MutexLock lock(&code_.mu);
    code_.fail_with = absl::UnavailableError("coordinator away");
  }
  Deliver(StartWithCode(1));
  AwaitOutcome(0, 2);
  EXPECT_TRUE(launcher_.launches.empty());
  EXPECT_EQ(LastStatus().exit().kind(), v1::FAILURE_KIND_LAUNCH);
  EXPECT_THAT(LastStatus().exit().message(), HasSubstr(absl::StrCat("fetching code ", digest_)));
  EXPECT_THAT(LastStatus().exit().message(), HasSubstr("coordinator away"));
  {
    absl::MutexLock lock(&code_.mu);
    code_.fail_with = absl::OkStatus();
  }
  Deliver(StartWithCode(2));
  AwaitOutcome(2, 2);
  EXPECT_EQ(Fetches(), 2);
}

TEST_F(RankTableCodeTest, BytesThatDoNotMatchTheDigestAreNotKeptAndStartNothing) {
  {
    absl::MutexLock lock(&code_.mu);
    code_.damage = "not the archive";
  }
  Deliver(StartWithCode(1));
  AwaitOutcome(0, 2);
  EXPECT_TRUE(launcher_.launches.empty());
  EXPECT_THAT(LastStatus().exit().message(), HasSubstr("arrived as sha256:"));
  EXPECT_FALSE(fs::exists(options_.work_dir + "/code/" + digest_.substr(7) + ".tar"));
}

TEST_F(RankTableCodeTest, AWorkingDirOutsideTheCodeIsAConfigurationError) {
  for (const char* bad : {"/etc", "../x"}) {
    out_.sent.clear();
    Deliver(StartWithCode(bad[0] == '/' ? 1 : 2, bad));
    EXPECT_TRUE(launcher_.launches.empty());
    EXPECT_EQ(LastStatus().exit().kind(), v1::FAILURE_KIND_CONFIG);
    EXPECT_THAT(LastStatus().exit().message(),
                HasSubstr("must be a relative path inside the job's code"));
  }
  out_.sent.clear();
  Deliver(StartWithCode(3, "no-such-dir"));
  AwaitOutcome(0, 2);
  EXPECT_EQ(LastStatus().exit().kind(), v1::FAILURE_KIND_CONFIG);
  EXPECT_THAT(LastStatus().exit().message(), HasSubstr("is not a directory of the job's code"));
}

}  // namespace
}  // namespace trainctl::worker

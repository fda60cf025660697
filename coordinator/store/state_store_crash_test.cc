// StateStore under concurrency and crashes: readers and writers at once, and
// a writer SIGKILLed at random points loses no acknowledged write.
#include "coordinator/store/state_store_test_support.h"

namespace trainctl::coordinator {
namespace {

using namespace store_testing;  // NOLINT: the tests' shared helpers

TEST(StateStoreTest, ConcurrentWritersAndReaders) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("state.db"));
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 6;
  constexpr int kIterations = 25;
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 1; i <= kIterations; ++i) {
        const std::string job_id = absl::StrCat("job-", t);
        if (!store->jobs().PutJob(MakeJob(job_id), t, {MakeEvent(job_id, i)}).ok()) ++failures;
        if (!store->telemetry().AppendMetrics(MakeMetrics("shared", 1, t * 1000 + i, 1, t)).ok())
          ++failures;
        if (!store->telemetry().AppendLogs(MakeLogs("shared", 1, t, {absl::StrCat(i)})).ok())
          ++failures;
        v1::Worker worker;
        worker.set_id(absl::StrCat("w", t));
        worker.add_busy_slots(i);
        if (!store->workers().PutWorker(worker).ok()) ++failures;
      }
    });
  }
  std::thread reader([&] {
    while (!done.load()) {
      if (!store->telemetry().ListMetrics("shared", 10).ok()) ++failures;
      if (!store->LoadAll().ok()) ++failures;
      if (!store->telemetry().ListLogs("shared", 1, std::nullopt, 3).ok()) ++failures;
    }
  });
  for (auto& thread : threads) thread.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);

  auto snapshot = store->LoadAll();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs.size(), size_t{kThreads});
  for (int64_t last : snapshot->last_event_seqs) EXPECT_EQ(last, kIterations);
  EXPECT_EQ(snapshot->workers.size(), size_t{kThreads});
  auto metrics = store->telemetry().ListMetrics("shared", 0);
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->size(), size_t{kThreads * kIterations});
  for (int t = 0; t < kThreads; ++t) {
    auto logs = store->telemetry().ListLogs("shared", 1, t, 0);
    ASSERT_TRUE(logs.ok());
    ASSERT_EQ(logs->size(), size_t{kIterations});
    // Per rank, in the order each writer appended.
    for (int i = 0; i < kIterations; ++i) EXPECT_EQ((*logs)[i].text(), absl::StrCat(i + 1));
  }
}

// ---------------------------------------------------------------------------
// Crash test: a child process writes through the store and acknowledges each
// iteration on a pipe only after every call in it returned OK; the parent
// SIGKILLs it at a random moment and checks that every acknowledged write
// survived. The child is this binary re-executed with the disabled test
// below (exec right after fork: nothing of the parent's threads is reused).

constexpr char kCrashDbEnv[] = "TRAINCTL_STORE_CRASH_DB";
constexpr char kCrashAckFdEnv[] = "TRAINCTL_STORE_CRASH_ACK_FD";
constexpr int64_t kCrashRetention = 100000;  // large enough to never trim in the test

StoreOptions CrashOptions() {
  StoreOptions options;
  options.max_metric_points_per_job = kCrashRetention;
  options.max_log_lines_per_rank = kCrashRetention;
  options.max_events_per_job = kCrashRetention;
  return options;
}

// Iteration i of the child: a new job "j<i>" with its event, an update of job
// "main" with event seq i, a metric point of step i, a log line "i" on rank
// i % 2, and worker "w" with busy slot i.
absl::Status CrashIteration(StateStore& store, int64_t i) {
  const std::string id = absl::StrCat("j", i);
  absl::Status status = store.jobs().PutJob(MakeJob(id), i, {MakeEvent(id, 1, "submitted")});
  if (!status.ok()) return status;
  v1::Job main = MakeJob("main", v1::JOB_STATE_RUNNING);
  main.mutable_progress()->set_step(i);
  status = store.jobs().PutJob(main, 0, {MakeEvent("main", i, "progress")});
  if (!status.ok()) return status;
  status = store.telemetry().AppendMetrics(MakeMetrics("main", 1, i, 1));
  if (!status.ok()) return status;
  status = store.telemetry().AppendLogs(
      MakeLogs("main", 1, static_cast<int32_t>(i % 2), {absl::StrCat(i)}));
  if (!status.ok()) return status;
  v1::Worker worker;
  worker.set_id("w");
  worker.add_busy_slots(static_cast<int32_t>(i));
  return store.workers().PutWorker(worker);
}

TEST(StateStoreCrashChild, DISABLED_WriteUntilKilled) {
  const char* db = std::getenv(kCrashDbEnv);
  const char* fd_text = std::getenv(kCrashAckFdEnv);
  if (db == nullptr || fd_text == nullptr) GTEST_SKIP() << "only run by CrashLosesNoAckedWrite";
  const int ack_fd = std::atoi(fd_text);
  auto store = StateStore::Open(db, CrashOptions());
  ASSERT_TRUE(store.ok()) << store.status();
  for (int64_t i = 1;; ++i) {
    absl::Status status = CrashIteration(**store, i);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(write(ack_fd, &i, sizeof(i)), static_cast<ssize_t>(sizeof(i)));
  }
}

// Reads one acknowledgement; false at EOF or after timeout_ms.
bool ReadAck(int fd, int timeout_ms, int64_t* ack) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return false;
  size_t got = 0;
  char* out = reinterpret_cast<char*>(ack);
  while (got < sizeof(*ack)) {
    ssize_t n = read(fd, out + got, sizeof(*ack) - got);
    if (n <= 0) return false;  // a partial ack at EOF cannot happen: writes <= PIPE_BUF are atomic
    got += static_cast<size_t>(n);
  }
  return true;
}

TEST(StateStoreCrashTest, CrashLosesNoAckedWrite) {
  std::random_device seed_source;
  const uint32_t seed = seed_source();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  const auto test_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(12);

  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds; ++round) {
    if (std::chrono::steady_clock::now() > test_deadline) break;
    SCOPED_TRACE(absl::StrCat("round ", round));
    TempDir dir;
    const std::string path = dir.File("state.db");

    // Prepared before fork: the child only calls async-signal-safe functions
    // until execve.
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    std::vector<std::string> env_strings = {
        absl::StrCat(kCrashDbEnv, "=", path),
        absl::StrCat(kCrashAckFdEnv, "=", pipe_fds[1]),
    };
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    std::string filter = "--gtest_filter=StateStoreCrashChild.DISABLED_WriteUntilKilled";
    std::string also_disabled = "--gtest_also_run_disabled_tests";
    std::vector<char*> argv = {exe.data(), filter.data(), also_disabled.data(), nullptr};
    int dev_null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    ASSERT_GE(dev_null, 0);

    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(pipe_fds[0]);
      dup2(dev_null, STDOUT_FILENO);  // keep gtest's chatter out of our output
      execve(exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(dev_null);
    close(pipe_fds[1]);

    // Kill after a random number of acknowledged iterations, then after a
    // random pause so the kill lands anywhere inside an iteration.
    const int64_t kill_after = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    int64_t last_ack = 0;
    int64_t ack = 0;
    bool child_alive = true;
    while (last_ack < kill_after) {
      if (!ReadAck(pipe_fds[0], 5000, &ack)) {
        child_alive = false;
        break;
      }
      ASSERT_EQ(ack, last_ack + 1);
      last_ack = ack;
    }
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 5000)(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    // Acknowledgements already in the pipe count too.
    while (ReadAck(pipe_fds[0], 5000, &ack)) {
      ASSERT_EQ(ack, last_ack + 1);
      last_ack = ack;
    }
    close(pipe_fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(child_alive) << "child stopped before it was killed, status " << wstatus;
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "child was not killed by SIGKILL, status " << wstatus;
    ASSERT_GE(last_ack, kill_after);

    // Every acknowledged iteration is there; at most the one in flight
    // beyond it, and only as whole calls (each call is one transaction).
    auto store = StateStore::Open(path, CrashOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    auto snapshot = (*store)->LoadAll();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ASSERT_GE(snapshot->jobs.size(), static_cast<size_t>(last_ack + 1));
    ASSERT_LE(snapshot->jobs.size(), static_cast<size_t>(last_ack + 2));
    EXPECT_EQ(snapshot->jobs[0].id(), "main");
    EXPECT_EQ(snapshot->submit_seqs[0], 0);
    const int64_t main_step = snapshot->jobs[0].progress().step();
    EXPECT_GE(main_step, last_ack);
    EXPECT_LE(main_step, last_ack + 1);
    EXPECT_EQ(snapshot->last_event_seqs[0], main_step);
    for (size_t k = 1; k < snapshot->jobs.size(); ++k) {
      EXPECT_EQ(snapshot->jobs[k].id(), absl::StrCat("j", k));
      EXPECT_EQ(snapshot->submit_seqs[k], static_cast<int64_t>(k));
      EXPECT_EQ(snapshot->last_event_seqs[k], 1);
    }
    auto events = (*store)->jobs().ListEvents("main", 0, 0);
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), static_cast<size_t>(main_step));
    for (int64_t i = 0; i < main_step; ++i) EXPECT_EQ((*events)[i].seq(), i + 1);

    auto metrics = (*store)->telemetry().ListMetrics("main", 0);
    ASSERT_TRUE(metrics.ok());
    ASSERT_GE(metrics->size(), static_cast<size_t>(last_ack));
    ASSERT_LE(metrics->size(), static_cast<size_t>(last_ack + 1));
    for (size_t i = 0; i < metrics->size(); ++i) {
      EXPECT_EQ((*metrics)[i].step(), static_cast<int64_t>(i + 1));
    }
    auto logs = (*store)->telemetry().ListLogs("main", 1, std::nullopt, 0);
    ASSERT_TRUE(logs.ok());
    ASSERT_GE(logs->size(), static_cast<size_t>(last_ack));
    ASSERT_LE(logs->size(), static_cast<size_t>(last_ack + 1));
    std::set<int64_t> lines;
    for (const auto& line : *logs) lines.insert(std::stoll(line.text()));
    for (int64_t i = 1; i <= last_ack; ++i) EXPECT_EQ(lines.count(i), 1u) << "log line " << i;

    ASSERT_EQ(snapshot->workers.size(), 1u);
    ASSERT_EQ(snapshot->workers[0].busy_slots_size(), 1);
    EXPECT_GE(snapshot->workers[0].busy_slots(0), last_ack);

    // The reopened store keeps working, and SQLite finds the file sound.
    EXPECT_TRUE(CrashIteration(**store, last_ack + 100).ok());
    store->reset();
    EXPECT_EQ(IntegrityCheck(path), "ok");
  }
}

// --- groups (at-least-once telemetry) ------------------------------------------

}  // namespace
}  // namespace trainctl::coordinator

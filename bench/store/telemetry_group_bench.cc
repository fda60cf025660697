// What one telemetry group costs the store, on SQLite and on PostgreSQL:
// the shape of bench/coordinator's telemetry scenario (jobs of 8 ranks, each
// rank one worker sending a metric point and a chunk of log lines), applied
// as TelemetryBatcher does -- BeginGroup, one append per message,
// CommitGroup with every worker's seq -- without the gRPC around it, so the
// figure is the store's alone. Not a test (never registered with ctest):
//
//   build/bench/store/trainctl-bench-store-telemetry
//     [--gtest_filter=*Postgres*]   env: TG_GROUPS [200] TG_MESSAGES [200] TG_RANKS [1000] TG_LINES
//     [10]
//
// PostgreSQL: a throwaway server started by the binary (pg_test_server.h),
// Unix socket, fsync on; skipped when the server binaries are missing.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/store/pg_test_server.h"
#include "coordinator/store/state_store.h"
#include "gtest/gtest.h"

namespace trainctl::coordinator {
namespace {

int Env(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

void RunGroups(const std::string& spec, const char* backend) {
  auto opened = StateStore::OpenSpec(spec);
  ASSERT_TRUE(opened.ok()) << opened.status();
  StateStore& store = **opened;
  const int groups = Env("TG_GROUPS", 200), messages = Env("TG_MESSAGES", 200),
            ranks = Env("TG_RANKS", 1000), lines = Env("TG_LINES", 10);
  int64_t step = 0, seq = 0, rows = 0;
  int next_rank = 0;
  double first_ms = 0;
  // Where a group's time goes: BeginGroup, the appends, CommitGroup.
  double begin_ms = 0, append_ms = 0, commit_ms = 0;
  const auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  const auto start = std::chrono::steady_clock::now();
  for (int g = 0; g < groups; ++g) {
    const auto group_start = std::chrono::steady_clock::now();
    ASSERT_TRUE(store.BeginGroup().ok());
    begin_ms += ms_since(group_start);
    const auto appends_start = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, int64_t>> seqs;
    for (int m = 0; m < messages; ++m) {
      // Alternately a metric point and a log chunk, ranks round robin.
      const int rank = next_rank;
      if (m % 2 == 1) next_rank = (next_rank + 1) % ranks;
      const std::string job = absl::StrCat("job-", rank / 8);
      absl::Status s;
      if (m % 2 == 0) {
        v1::MetricBatch batch;
        batch.set_job_id(job);
        batch.set_attempt(1);
        v1::MetricPoint* p = batch.add_points();
        p->set_kind(v1::MetricPoint::KIND_TRAIN);
        p->set_rank(rank % 8);
        p->set_step(++step);
        p->set_loss(1.0 / static_cast<double>(step));
        s = store.telemetry().AppendMetrics(batch);
        rows += 1;
      } else {
        v1::LogChunk chunk;
        chunk.set_job_id(job);
        chunk.set_attempt(1);
        chunk.set_rank(rank % 8);
        for (int i = 0; i < lines; ++i) {
          v1::LogLine* line = chunk.add_lines();
          line->set_rank(rank % 8);
          line->set_text(
              absl::StrCat("step ", step, " line ", i, ": loss 0.1234 lr 0.001 samples/s 12345"));
        }
        s = store.telemetry().AppendLogs(chunk);
        rows += lines;
      }
      ASSERT_TRUE(s.ok()) << s;
      seqs.emplace_back(absl::StrCat("worker-", rank), ++seq);
    }
    append_ms += ms_since(appends_start);
    const auto commit_start = std::chrono::steady_clock::now();
    ASSERT_TRUE(store.CommitGroup(seqs).ok());
    commit_ms += ms_since(commit_start);
    if (g == 0) {
      first_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - group_start)
              .count();
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s: %d groups of %d messages (%d ranks, %d lines a chunk): %.1f ms a group "
      "(the first, with the row counts of new keys: %.1f ms; of a group on average: BeginGroup "
      "%.2f ms, the appends %.2f ms, CommitGroup %.2f ms), %.0f messages/s, %.0f rows/s\n",
      backend, groups, messages, ranks, lines, 1000 * s / groups, first_ms, begin_ms / groups,
      append_ms / groups, commit_ms / groups, groups * messages / s, rows / s);
}

TEST(TelemetryGroupBench, Sqlite) {
  char tmpl[] = "/tmp/telemetry_group_bench.XXXXXX";
  const char* dir = mkdtemp(tmpl);
  ASSERT_NE(dir, nullptr);
  RunGroups(absl::StrCat("sqlite:", dir, "/state.db"), "SQLite");
  std::filesystem::remove_all(dir);
}

TEST(TelemetryGroupBench, Postgres) {
  store_testing::PgTestServer& pg = store_testing::PgServer();
  if (!pg.ok()) GTEST_SKIP() << "no PostgreSQL: " << pg.status();
  auto uri = pg.NewDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status();
  RunGroups(*uri, "PostgreSQL");
}

}  // namespace
}  // namespace trainctl::coordinator

// Helpers shared by the StateStore tests (state_store_test,
// state_store_telemetry_test, state_store_crash_test): temporary
// directories, jobs, events, points and log lines to store, and raw SQLite
// access to inspect or damage a database on purpose.
#pragma once

#include "coordinator/store/pg_test_server.h"
#include "coordinator/store/state_store.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainctl::coordinator::store_testing {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory under $TMPDIR, removed with its contents at the end.
class TempDir : public ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("state_store_test") {
    if (path().empty()) ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
  }
};

inline v1::Job MakeJob(const std::string& id, v1::JobState state = v1::JOB_STATE_PENDING) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name(id);
  job.mutable_spec()->set_world_size(2);
  return job;
}

inline v1::Event MakeEvent(const std::string& job_id, int64_t seq, const std::string& type = "e") {
  v1::Event event;
  event.set_seq(seq);
  event.set_job_id(job_id);
  event.set_type(type);
  event.set_rank(-1);
  event.set_message(absl::StrCat(type, " #", seq));
  return event;
}

inline v1::MetricBatch MakeMetrics(const std::string& job_id, int32_t attempt, int64_t first_step,
                                   int n, int32_t rank = 0) {
  v1::MetricBatch batch;
  batch.set_job_id(job_id);
  batch.set_attempt(attempt);
  for (int i = 0; i < n; ++i) {
    v1::MetricPoint* p = batch.add_points();
    p->set_kind(v1::MetricPoint::KIND_TRAIN);
    p->set_rank(rank);
    p->set_step(first_step + i);
    p->set_loss(1.0 / static_cast<double>(first_step + i));
  }
  return batch;
}

inline v1::LogChunk MakeLogs(const std::string& job_id, int32_t attempt, int32_t rank,
                             const std::vector<std::string>& texts) {
  v1::LogChunk chunk;
  chunk.set_job_id(job_id);
  chunk.set_attempt(attempt);
  chunk.set_rank(rank);
  for (const std::string& text : texts) {
    v1::LogLine* line = chunk.add_lines();
    line->set_rank(rank);
    line->set_stream(v1::LogLine::STREAM_STDOUT);
    line->set_text(text);
  }
  return chunk;
}

inline std::vector<int64_t> Steps(const std::vector<v1::MetricPoint>& points) {
  std::vector<int64_t> steps;
  for (const auto& p : points) steps.push_back(p.step());
  return steps;
}
inline std::vector<int64_t> Seqs(const std::vector<v1::Event>& events) {
  std::vector<int64_t> seqs;
  for (const auto& e : events) seqs.push_back(e.seq());
  return seqs;
}
inline std::vector<std::string> Texts(const std::vector<v1::LogLine>& lines) {
  std::vector<std::string> texts;
  for (const auto& l : lines) texts.push_back(absl::StrCat(l.rank(), ":", l.text()));
  return texts;
}

inline std::unique_ptr<StateStore> OpenOrDie(const std::string& path, StoreOptions options = {}) {
  auto store = StateStore::Open(path, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

// Runs SQL on a database file with the raw C API (the store must be closed).
inline void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "") << " in " << sql;
  sqlite3_free(error);
  sqlite3_close(db);
}

inline std::string IntegrityCheck(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  sqlite3_stmt* stmt = nullptr;
  std::string result;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &stmt, nullptr) == SQLITE_OK) {
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      result += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return result;
}

// ---------------------------------------------------------------------------
// One set of test cases for both backends: TEST_P(StoreBackendTest, ...)
// with Fresh() for a store that need not outlive the test's first Open
// (SQLite: ":memory:") and Persistent() for one to reopen (SQLite: a file in
// a temporary directory; PostgreSQL: the test's own database, either way).

enum class Backend { kSqlite, kPostgres };

class StoreBackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kSqlite) {
      persistent_ = absl::StrCat("sqlite:", dir_.File("state.db"));
      return;
    }
    PgTestServer& pg = PgServer();
    if (!pg.ok()) GTEST_SKIP() << "PostgreSQL variant skipped: " << pg.status();
    auto uri = pg.NewDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    persistent_ = *uri;
  }

  bool postgres() const { return GetParam() == Backend::kPostgres; }
  // The spec of the test's database that survives a reopen.
  const std::string& Persistent() const { return persistent_; }
  // A store for this test only.
  std::unique_ptr<StateStore> Fresh(StoreOptions options = {}) {
    return OpenSpecOrDie(postgres() ? persistent_ : std::string("sqlite::memory:"), options);
  }
  std::unique_ptr<StateStore> Reopen(StoreOptions options = {}) {
    return OpenSpecOrDie(persistent_, options);
  }
  static std::unique_ptr<StateStore> OpenSpecOrDie(const std::string& spec, StoreOptions options) {
    auto store = StateStore::OpenSpec(spec, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  TempDir dir_;
  std::string persistent_;
};

inline std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kSqlite ? "Sqlite" : "Postgres";
}

#define TRAINCTL_STORE_BACKENDS(suite)                                               \
  INSTANTIATE_TEST_SUITE_P(                                                          \
      Backends, suite,                                                               \
      ::testing::Values(::trainctl::coordinator::store_testing::Backend::kSqlite,    \
                        ::trainctl::coordinator::store_testing::Backend::kPostgres), \
      ::trainctl::coordinator::store_testing::BackendName)

}  // namespace trainctl::coordinator::store_testing

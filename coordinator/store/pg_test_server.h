// A throwaway PostgreSQL server for the state store's tests: Debian's
// binaries (/usr/lib/postgresql/*/bin), a cluster made by initdb in a fresh
// temporary directory, postgres listening only on a Unix socket in that
// directory (no TCP port), fsync on, run as an unprivileged user (`nobody`
// when the tests run as root: postgres refuses root). One server per test
// binary, started at first use and stopped (fast shutdown, its directory
// removed) when the binary's tests end; each test gets its own database.
// When the binaries or libpq are missing, Get() says why and the
// PostgreSQL variant of a test skips with that reason.
//
// Threading: the tests' main thread only.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#ifdef TRAINCTL_WITH_LIBPQ
#include <libpq-fe.h>
#endif

namespace trainctl::coordinator::store_testing {

class PgTestServer {
 public:
  // The binary's server, started at the first call; check ok().
  static PgTestServer& Get() {
    static PgTestServer* server = [] {
      auto* s = new PgTestServer();
      s->status_ = s->Start();
      if (!s->status_.ok()) s->Stop();
      return s;
    }();
    return *server;
  }

  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }

  // A new empty database; its libpq URI.
  absl::StatusOr<std::string> NewDatabase() {
#ifdef TRAINCTL_WITH_LIBPQ
    if (!ok()) return status_;
    const std::string name = absl::StrCat("t_", ++databases_);
    PGconn* conn = PQconnectdb(Conninfo("postgres").c_str());
    absl::Status st;
    if (PQstatus(conn) != CONNECTION_OK) {
      st = absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn)));
    } else {
      PGresult* res = PQexec(conn, absl::StrCat("CREATE DATABASE ", name).c_str());
      if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        st = absl::InternalError(absl::StrCat("CREATE DATABASE: ", PQresultErrorMessage(res)));
      }
      PQclear(res);
    }
    PQfinish(conn);
    if (!st.ok()) return st;
    return absl::StrCat("postgresql:///", name, "?host=", dir_, "&port=", kPort, "&user=trainctl");
#else
    return status_;
#endif
  }

  // A login role that must give `password` (scram-sha-256 on the server's
  // socket; every other role stays trusted), made the owner of database
  // `db`: a libpq URI for it, without the password.
  absl::StatusOr<std::string> PasswordRole(const std::string& role, const std::string& password,
                                           const std::string& db) {
#ifdef TRAINCTL_WITH_LIBPQ
    if (!ok()) return status_;
    absl::Status st = AdminExec(
        "postgres", absl::StrCat("CREATE ROLE ", role, " LOGIN PASSWORD '", password, "'"));
    if (st.ok())
      st = AdminExec("postgres", absl::StrCat("ALTER DATABASE ", db, " OWNER TO ", role));
    if (!st.ok()) return st;
    const std::string hba = dir_ + "/data/pg_hba.conf";
    std::string before;
    {
      std::ifstream in(hba);
      before.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    {
      std::ofstream out(hba, std::ios::trunc);
      out << "local all " << role << " scram-sha-256\n" << before;
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", hba));
    }
    absl::StatusOr<std::string> reloaded = AdminQuery("postgres", "SELECT pg_reload_conf()");
    if (!reloaded.ok()) return reloaded.status();
    return absl::StrCat("postgresql:///", db, "?host=", dir_, "&port=", kPort, "&user=", role);
#else
    (void)role;
    (void)password;
    (void)db;
    return status_;
#endif
  }

  // The name of the database NewDatabase made last.
  std::string last_database() const { return absl::StrCat("t_", databases_); }

  // Runs `sql` as the server's superuser in database `db`.
  absl::Status AdminExec(const std::string& db, const std::string& sql) {
#ifdef TRAINCTL_WITH_LIBPQ
    if (!ok()) return status_;
    PGconn* conn = PQconnectdb(Conninfo(db).c_str());
    absl::Status st;
    if (PQstatus(conn) != CONNECTION_OK) {
      st = absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn)));
    } else {
      PGresult* res = PQexec(conn, sql.c_str());
      if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = absl::InternalError(absl::StrCat(sql, ": ", PQresultErrorMessage(res)));
      }
      PQclear(res);
    }
    PQfinish(conn);
    return st;
#else
    (void)db;
    (void)sql;
    return status_;
#endif
  }

  // Runs the query `sql` as the superuser in database `db`: the first
  // column of the first row as text ("" for NULL or no row).
  absl::StatusOr<std::string> AdminQuery(const std::string& db, const std::string& sql) {
#ifdef TRAINCTL_WITH_LIBPQ
    if (!ok()) return status_;
    PGconn* conn = PQconnectdb(Conninfo(db).c_str());
    absl::StatusOr<std::string> out;
    if (PQstatus(conn) != CONNECTION_OK) {
      out = absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn)));
    } else {
      PGresult* res = PQexec(conn, sql.c_str());
      if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        out = absl::InternalError(absl::StrCat(sql, ": ", PQresultErrorMessage(res)));
      } else {
        out =
            PQntuples(res) > 0 && !PQgetisnull(res, 0, 0) ? std::string(PQgetvalue(res, 0, 0)) : "";
      }
      PQclear(res);
    }
    PQfinish(conn);
    return out;
#else
    (void)db;
    (void)sql;
    return status_;
#endif
  }

  // Ends every session on database `db` but the caller's (a lost
  // connection, as a restarted server or a network cut leaves).
  absl::Status TerminateSessions(const std::string& db) {
    return AdminExec("postgres",
                     absl::StrCat("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = '",
                                  db, "' AND pid <> pg_backend_pid()"));
  }

  // `kill -9` of the server (its backends exit on their postmaster's
  // death): every session is gone at once, nothing is shut down cleanly.
  // Waits until no process of it is left (its data directory free again).
  void Crash() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    // The backends notice the postmaster's death and exit; a new postmaster
    // refuses to start while one still holds the shared memory.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && BackendsLeft()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Starts the server again on the same data (crash recovery runs).
  absl::Status Restart() {
    if (pid_ > 0) return absl::OkStatus();
    return Launch();
  }

  // Stops the server and removes its directory (idempotent).
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGQUIT);  // immediate shutdown: the directory goes next
      bool gone = false;
      for (int i = 0; i < 300 && !gone; ++i) {
        gone = waitpid(pid_, nullptr, WNOHANG) == pid_;
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!gone) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }

 private:
  static constexpr int kPort = 5432;  // only names the socket file in dir_

  std::string Conninfo(const std::string& db) const {
    return absl::StrCat("host=", dir_, " port=", kPort, " user=trainctl dbname=", db,
                        " connect_timeout=5");
  }

  static std::string FindBin() {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
      if (std::filesystem::exists(e.path() / "bin" / "postgres") &&
          std::filesystem::exists(e.path() / "bin" / "initdb")) {
        found.push_back((e.path() / "bin").string());
      }
    }
    if (found.empty()) return "";
    // Highest major version (numeric order).
    std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
      return std::atoi(std::filesystem::path(a).parent_path().filename().c_str()) <
             std::atoi(std::filesystem::path(b).parent_path().filename().c_str());
    });
    return found.back();
  }

  // Forks `argv` as the server's user, output to `log`; its pid.
  pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<char*> args;  // built before fork: the child only execs
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    if (getuid() == 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid_) != 0 || setuid(uid_) != 0) _exit(126);
    }
    // Dies with the test binary, even when it is killed.
    prctl(PR_SET_PDEATHSIG, SIGQUIT);
    execv(args[0], args.data());
    _exit(127);
  }

  // A process whose command line names this server's data directory
  // (the postmaster's children are "postgres: ..." with the same uid; the
  // data directory is in /proc/PID/cwd).
  bool BackendsLeft() const {
    std::error_code ec;
    const std::filesystem::path data = std::filesystem::path(dir_) / "data";
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
      std::error_code ec2;
      if (std::filesystem::read_symlink(e.path() / "cwd", ec2) == data) return true;
    }
    return false;
  }

  std::string LogTail(const std::string& log) const {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
  }

  absl::Status Start() {
#ifndef TRAINCTL_WITH_LIBPQ
    return absl::FailedPreconditionError("built without libpq (Debian: libpq-dev)");
#else
    const std::string bin = FindBin();
    if (bin.empty()) {
      return absl::FailedPreconditionError(
          "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (Debian: postgresql)");
    }
    uid_ = getuid();
    gid_ = getgid();
    if (uid_ == 0) {
      struct passwd* pw = getpwnam("nobody");
      if (pw == nullptr)
        return absl::FailedPreconditionError("running as root and no user 'nobody'");
      uid_ = pw->pw_uid;
      gid_ = pw->pw_gid;
    }
    char pattern[] = "/tmp/trainctl-pg.XXXXXX";
    if (mkdtemp(pattern) == nullptr)
      return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
    dir_ = pattern;
    if (chown(dir_.c_str(), uid_, gid_) != 0) {
      return absl::InternalError(absl::StrCat("chown ", dir_, ": ", std::strerror(errno)));
    }
    const std::string data = dir_ + "/data";
    const std::string log = dir_ + "/server.log";
    pid_t initdb = Spawn({bin + "/initdb", "-D", data, "-U", "trainctl", "--auth=trust",
                          "--no-locale", "-E", "UTF8", "--no-sync"},
                         log);
    int wstatus = 0;
    if (initdb < 0 || waitpid(initdb, &wstatus, 0) != initdb || !WIFEXITED(wstatus) ||
        WEXITSTATUS(wstatus) != 0) {
      return absl::InternalError(absl::StrCat("initdb failed: ", LogTail(log)));
    }
    bin_ = bin;
    return Launch();
#endif
  }

  // Starts postgres on the cluster initdb made; waits until it answers.
  absl::Status Launch() {
#ifndef TRAINCTL_WITH_LIBPQ
    return absl::FailedPreconditionError("built without libpq (Debian: libpq-dev)");
#else
    const std::string data = dir_ + "/data";
    const std::string log = dir_ + "/server.log";
    int wstatus = 0;
    pid_ = Spawn({bin_ + "/postgres", "-D", data, "-k", dir_, "-p", absl::StrCat(kPort), "-c",
                  "listen_addresses=", "-c", "fsync=on", "-c", "shared_buffers=16MB", "-c",
                  "max_connections=30", "-c", "max_wal_size=64MB"},
                 log);
    if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    const std::string ping = Conninfo("postgres");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (PQping(ping.c_str()) != PQPING_OK) {
      if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("postgres exited at start: ", LogTail(log)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("postgres not ready in 60 s: ", LogTail(log)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::OkStatus();
#endif
  }

  absl::Status status_;
  std::string bin_;
  std::string dir_;
  pid_t pid_ = -1;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  int databases_ = 0;
};

// Stops the server (when one was started) after the binary's last test.
class PgTestServerEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (started()) PgTestServer::Get().Stop();
  }
  static bool& started() {
    static bool s = false;
    return s;
  }
};
inline ::testing::Environment* const kPgTestServerEnvironment =
    ::testing::AddGlobalTestEnvironment(new PgTestServerEnvironment);

// The server, for a test that needs it; marks it for the teardown.
inline PgTestServer& PgServer() {
  PgTestServerEnvironment::started() = true;
  return PgTestServer::Get();
}

}  // namespace trainctl::coordinator::store_testing

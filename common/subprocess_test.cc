#include "common/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/temp_dir.h"

namespace trainctl {
namespace {

// A pipe whose ends close with it.
struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    CloseWrite();
    if (read >= 0) close(read);
  }
  void CloseWrite() {
    if (write >= 0) close(write);
    write = -1;
  }
  // Everything until EOF (close the parent's write end first).
  std::string ReadAll() {
    CloseWrite();
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(read, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
};

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

// Runs `o` with stdout into a pipe; returns (what it printed, how it ended).
std::pair<std::string, ExitStatus> RunToEnd(SpawnOptions o) {
  Pipe out;
  o.fds.push_back({1, out.write});
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {"", ExitStatus{}};
  std::string text = out.ReadAll();
  return {text, p->Wait()};
}

// A zombie counts as dead: an orphan waits for init to reap it.
bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Waits until `pid` no longer exists (it was reaped by its parent or init).
bool GoneWithin(pid_t pid, absl::Duration timeout) {
  for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    if (!Alive(pid)) return true;
  }
  return !Alive(pid);
}

// Fields 5 (process group) and 6 (session) of /proc/<pid>/stat as the child printed it.
std::pair<long, long> GroupAndSession(const std::string& stat) {
  std::string after = stat.substr(stat.rfind(')') + 2);
  std::vector<std::string> f = absl::StrSplit(after, ' ');
  long pgrp = 0, sid = 0;
  EXPECT_TRUE(absl::SimpleAtoi(f[2], &pgrp));
  EXPECT_TRUE(absl::SimpleAtoi(f[3], &sid));
  return {pgrp, sid};
}

TEST(SubprocessTest, ExitCodesAreDecoded) {
  for (int code : {0, 3, 255}) {
    auto [out, st] = RunToEnd(Shell("exit " + std::to_string(code)));
    EXPECT_TRUE(st.exited());
    EXPECT_EQ(st.code, code);
    EXPECT_EQ(st.signal, 0);
    EXPECT_EQ(st.CodeOrMinusSignal(), code);
    EXPECT_EQ(st.success(), code == 0);
  }
  EXPECT_EQ(ExitStatus::FromWaitStatus(3 << 8).ToString(), "exit code 3");
}

TEST(SubprocessTest, DeathBySignalIsDecoded) {
  auto [out, st] = RunToEnd(Shell("kill -9 $$"));
  EXPECT_FALSE(st.exited());
  EXPECT_EQ(st.code, -1);
  EXPECT_EQ(st.signal, SIGKILL);
  EXPECT_EQ(st.CodeOrMinusSignal(), -SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(st.raw));
}

TEST(SubprocessTest, MissingProgramExits127WithTheMessage) {
  Pipe err;
  SpawnOptions o;
  o.argv = {"/nonexistent/program"};
  o.exec_error_message = "cannot run it\n";
  o.fds.push_back({2, err.write});
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(err.ReadAll(), "cannot run it\n");
  EXPECT_EQ(p->Wait().code, 127);
  EXPECT_FALSE(Subprocess::Spawn(SpawnOptions{}).ok());
}

TEST(SubprocessTest, EnvironmentIsInheritedWithOverridesOrExact) {
  setenv("SUBPROCESS_TEST_KEEP", "kept", 1);
  setenv("SUBPROCESS_TEST_OVER", "old", 1);
  SpawnOptions o =
      Shell("echo \"$SUBPROCESS_TEST_KEEP $SUBPROCESS_TEST_OVER $SUBPROCESS_TEST_NEW\"");
  o.env = {"SUBPROCESS_TEST_OVER=new", "SUBPROCESS_TEST_NEW=added"};
  EXPECT_EQ(RunToEnd(o).first, "kept new added\n");

  SpawnOptions exact;
  exact.argv = {"/usr/bin/env"};
  exact.env = {"ONLY=this"};
  exact.inherit_env = false;
  EXPECT_EQ(RunToEnd(exact).first, "ONLY=this\n");
}

TEST(SubprocessTest, WorkingDirectoryIsSetOrTheChildExits125) {
  const std::string dir = MakeTempDir("subprocess_test");
  ASSERT_FALSE(dir.empty());
  SpawnOptions o;
  o.argv = {"/bin/pwd"};
  o.work_dir = dir;
  char real[4096];
  ASSERT_NE(realpath(dir.c_str(), real), nullptr);
  EXPECT_EQ(RunToEnd(o).first, std::string(real) + "\n");
  o.work_dir = dir + "/missing";
  EXPECT_EQ(RunToEnd(o).second.code, 125);
  rmdir(dir.c_str());
}

TEST(SubprocessTest, FdsAreRedirectedAndOthersClosed) {
  Pipe extra, err;
  // Not close-on-exec: without close_other_fds the child would see it.
  const int leaked = open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 0);
  const std::string leak_check =
      "if (: <&" + std::to_string(leaked) + ") 2>/dev/null; then echo leaked; else echo closed; fi";
  SpawnOptions o = Shell("echo to-five >&5; echo to-err >&2; cat; " + leak_check);
  o.fds = {{0, ChildFd::kDevNull}, {5, extra.write}, {2, err.write}};
  auto [out, st] = RunToEnd(o);
  EXPECT_EQ(st.code, 0);
  EXPECT_EQ(out, "closed\n");  // cat read /dev/null: nothing
  EXPECT_EQ(extra.ReadAll(), "to-five\n");
  EXPECT_EQ(err.ReadAll(), "to-err\n");

  SpawnOptions keep = Shell(leak_check);
  keep.close_other_fds = false;
  EXPECT_EQ(RunToEnd(keep).first, "leaked\n");
  close(leaked);
}

TEST(SubprocessTest, FdsMaySwapPlaces) {
  // The child's 1 is the parent's pipe now on 4 and vice versa: the copies
  // must not clobber each other.
  Pipe a, b;
  const int a4 = fcntl(a.write, F_DUPFD_CLOEXEC, 20), b1 = fcntl(b.write, F_DUPFD_CLOEXEC, 21);
  SpawnOptions o = Shell("echo one; echo four >&4");
  o.fds = {{1, a4}, {4, b1}};
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok());
  close(a4);
  close(b1);
  EXPECT_EQ(a.ReadAll(), "one\n");
  EXPECT_EQ(b.ReadAll(), "four\n");
  EXPECT_EQ(p->Wait().code, 0);
}

TEST(SubprocessTest, PollDoesNotBlockAndWaitForTimesOut) {
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(Shell("exec sleep 30"));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->Poll().has_value());
  EXPECT_FALSE(p->WaitFor(absl::Milliseconds(50)).has_value());
  EXPECT_TRUE(p->running());
  EXPECT_TRUE(p->Signal(SIGKILL));
  std::optional<ExitStatus> st = p->WaitFor(absl::Seconds(10));
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->signal, SIGKILL);
  EXPECT_FALSE(p->running());
  EXPECT_FALSE(p->Signal(SIGKILL));
  EXPECT_EQ(p->exit_status()->signal, SIGKILL);
}

// Runs `cat /proc/self/stat` under `o`: (its pid, process group, session).
std::tuple<pid_t, long, long> GroupOfChild(SpawnOptions o) {
  o.argv = {"/bin/cat", "/proc/self/stat"};
  Pipe out;
  o.fds = {{1, out.write}};
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {-1, 0, 0};
  auto [pgrp, sid] = GroupAndSession(out.ReadAll());
  p->Wait();
  return {p->pid(), pgrp, sid};
}

TEST(SubprocessTest, ChildLeadsItsOwnGroupOrSession) {
  SpawnOptions o;
  auto [pid, pgrp, sid] = GroupOfChild(o);
  EXPECT_EQ(pgrp, pid);
  EXPECT_NE(sid, pid);

  o.new_session = true;
  auto [pid2, pgrp2, sid2] = GroupOfChild(o);
  EXPECT_EQ(pgrp2, pid2);
  EXPECT_EQ(sid2, pid2);

  o.new_session = false;
  o.new_process_group = false;
  auto [pid3, pgrp3, sid3] = GroupOfChild(o);
  EXPECT_EQ(pgrp3, getpgrp());
  EXPECT_EQ(sid3, getsid(0));
}

// A shell that starts a grandchild (sleep) and waits; `grandchild` is its pid.
Subprocess SpawnWithGrandchild(pid_t* grandchild) {
  Pipe out;
  SpawnOptions o = Shell("sleep 60 & echo $!; wait");
  o.fds = {{1, out.write}};
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status();
  out.CloseWrite();
  std::string line;
  char c;
  while (read(out.read, &c, 1) == 1 && c != '\n') line.push_back(c);
  EXPECT_TRUE(absl::SimpleAtoi(line, grandchild)) << line;
  return p.ok() ? std::move(*p) : Subprocess();
}

TEST(SubprocessTest, TerminateReachesGrandchildren) {
  pid_t grandchild = 0;
  Subprocess p = SpawnWithGrandchild(&grandchild);
  ASSERT_GT(grandchild, 0);
  ASSERT_TRUE(Alive(grandchild));
  ExitStatus st = p.Terminate(absl::Seconds(5));
  EXPECT_EQ(st.signal, SIGTERM);
  EXPECT_TRUE(GoneWithin(grandchild, absl::Seconds(10)));
}

// Spawns `o` with stdout into a pipe and returns once it printed "ready".
absl::StatusOr<Subprocess> SpawnUntilReady(SpawnOptions o) {
  Pipe out;
  o.fds.push_back({1, out.write});
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(o);
  out.CloseWrite();
  char buf[6];
  if (p.ok() && read(out.read, buf, sizeof buf) != 6) return absl::InternalError("no ready line");
  return p;
}

TEST(SubprocessTest, TerminateKillsAChildThatIgnoresSigterm) {
  // "ready" once the trap is set, so SIGTERM cannot come before it.
  absl::StatusOr<Subprocess> p =
      SpawnUntilReady(Shell("trap '' TERM; echo ready; while :; do sleep 0.05; done"));
  ASSERT_TRUE(p.ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ(p->Terminate(absl::Milliseconds(200)).signal, SIGKILL);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST(SubprocessTest, DestructorKillsTheGroup) {
  pid_t grandchild = 0;
  {
    Subprocess p = SpawnWithGrandchild(&grandchild);
    ASSERT_GT(grandchild, 0);
  }
  EXPECT_TRUE(GoneWithin(grandchild, absl::Seconds(10)));
}

TEST(SubprocessTest, BlockedSignalsAreUnblockedInTheChild) {
  // Daemons block SIGTERM in every thread (common/stop_signals.h); their
  // children must still take it.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(Shell("exec sleep 30"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Terminate(absl::Seconds(10)).signal, SIGTERM);
}

TEST(SubprocessTest, ParentDeathSignalFollowsTheSpawningThread) {
  // PR_SET_PDEATHSIG fires when the thread that forked exits.
  std::optional<Subprocess> child;
  // The thread waits for the child's "ready" (printed after its prctl):
  // a thread that exits before then leaves a child with no signal to get.
  std::thread spawner([&] {
    SpawnOptions o = Shell("echo ready; exec sleep 30");
    o.parent_death_signal = SIGKILL;
    absl::StatusOr<Subprocess> p = SpawnUntilReady(o);
    ASSERT_TRUE(p.ok());
    child = std::move(*p);
  });
  spawner.join();
  ASSERT_TRUE(child.has_value());
  std::optional<ExitStatus> st = child->WaitFor(absl::Seconds(10));
  ASSERT_TRUE(st.has_value()) << "the child outlived its spawning thread";
  EXPECT_EQ(st->signal, SIGKILL);
}

TEST(SubprocessTest, MoveKeepsOneOwner) {
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(Shell("exit 4"));
  ASSERT_TRUE(p.ok());
  Subprocess a = std::move(*p);
  EXPECT_EQ(p->pid(), -1);
  EXPECT_FALSE(p->running());
  Subprocess b;
  b = std::move(a);
  EXPECT_EQ(b.Wait().code, 4);
}

TEST(SubprocessTest, LookupUserReadsThePasswdDatabase) {
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_EQ(nobody->name, "nobody");
  EXPECT_NE(nobody->uid, 0u);
  EXPECT_FALSE(nobody->home.empty());
  // Its primary group is among its groups, as initgroups would set them.
  EXPECT_NE(std::find(nobody->groups.begin(), nobody->groups.end(), nobody->gid),
            nobody->groups.end());
  absl::StatusOr<RunAs> stranger = LookupUser("no-such-user-trainctl");
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(stranger.status().message().find("no-such-user-trainctl"), std::string::npos)
      << stranger.status();
  EXPECT_EQ(LookupUser("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, RunAsSwitchesUidGidGroupsAndIdentityVariables) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  SpawnOptions o = Shell(
      "id -u; id -g; id -G; echo \"$HOME $USER $LOGNAME $KEEP\"; cat /proc/self/status | grep "
      "^Uid:");
  o.run_as = *nobody;
  o.env = {"KEEP=kept", "LOGNAME=chosen"};  // a name in env wins over the user's
  auto [out, st] = RunToEnd(o);
  ASSERT_TRUE(st.success()) << st.ToString() << " " << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  ASSERT_GE(lines.size(), 5u) << out;
  EXPECT_EQ(lines[0], std::to_string(nobody->uid));
  EXPECT_EQ(lines[1], std::to_string(nobody->gid));
  std::vector<std::string> groups = absl::StrSplit(lines[2], ' ');
  std::vector<std::string> want;
  for (gid_t g : nobody->groups) want.push_back(std::to_string(g));
  std::sort(groups.begin(), groups.end());
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  EXPECT_EQ(groups, want) << "root's groups must not stay: " << lines[2];
  EXPECT_EQ(lines[3], nobody->home + " nobody chosen kept");
  // Real, effective, saved and filesystem uid alike: no way back to root.
  const std::string u = std::to_string(nobody->uid);
  EXPECT_EQ(lines[4], "Uid:\t" + u + "\t" + u + "\t" + u + "\t" + u);
}

TEST(SubprocessTest, RunAsChildCannotReadTheParentsPrivateFile) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  const std::string dir = MakeTempDir("subprocess_run_as");
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  const std::string secret = dir + "/secret.key";
  std::ofstream(secret) << "private\n";
  ASSERT_EQ(chmod(secret.c_str(), 0600), 0);
  Pipe err;
  SpawnOptions o = Shell("cat " + secret);
  o.run_as = *nobody;
  o.fds.push_back({2, err.write});
  auto [out, st] = RunToEnd(o);
  EXPECT_EQ(out, "");
  EXPECT_EQ(st.code, 1);
  EXPECT_NE(err.ReadAll().find("Permission denied"), std::string::npos);
  // Without run_as the same child (root) reads it: the refusal is the user's.
  EXPECT_EQ(RunToEnd(Shell("cat " + secret)).first, "private\n");
  std::system(("rm -rf " + dir).c_str());
}

TEST(SubprocessTest, RunAsKeepsTheParentDeathSignal) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  // A change of credentials clears PR_SET_PDEATHSIG: it must be set after
  // the switch, or a child of a dead daemon would live on.
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  std::optional<Subprocess> child;
  std::thread spawner([&] {
    SpawnOptions o = Shell("echo ready; exec sleep 30");
    o.run_as = *nobody;
    o.parent_death_signal = SIGKILL;
    absl::StatusOr<Subprocess> p = SpawnUntilReady(o);
    ASSERT_TRUE(p.ok());
    child = std::move(*p);
  });
  spawner.join();
  ASSERT_TRUE(child.has_value());
  std::optional<ExitStatus> st = child->WaitFor(absl::Seconds(10));
  ASSERT_TRUE(st.has_value()) << "the child outlived its spawning thread";
  EXPECT_EQ(st->signal, SIGKILL);
}

TEST(SubprocessTest, RunAsWithoutThePrivilegeExits124) {
  if (geteuid() == 0) GTEST_SKIP() << "root may switch to any user";
  absl::StatusOr<RunAs> nobody = LookupUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  Pipe err;
  SpawnOptions o = Shell("echo ran");
  o.run_as = *nobody;
  o.fds.push_back({2, err.write});
  auto [out, st] = RunToEnd(o);
  EXPECT_EQ(out, "");
  EXPECT_EQ(st.code, 124);
  EXPECT_EQ(err.ReadAll(), "/bin/sh: cannot run as user nobody\n");
}

TEST(TempDirTest, MakesAFreshPrivateDirectoryUnderTmpdir) {
  const std::string base = MakeTempDir("temp_dir_test_base");
  ASSERT_FALSE(base.empty());
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", base.c_str(), 1);
  const std::string a = MakeTempDir("x"), b = MakeTempDir("x");
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(base + "/x_", 0), 0u) << a;
  struct stat st;
  ASSERT_EQ(stat(a.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  rmdir(a.c_str());
  rmdir(b.c_str());
  rmdir(base.c_str());
}

TEST(TempDirTest, AScopedOneIsRemovedWithItsTreeWhenItGoes) {
  std::string path;
  {
    ScopedTempDir dir("scoped_temp_dir_test");
    path = dir.path();
    ASSERT_FALSE(path.empty());
    EXPECT_EQ(dir.File("a"), path + "/a");
    ASSERT_EQ(mkdir(dir.File("sub").c_str(), 0700), 0);
    std::ofstream(dir.File("sub/f")) << "x";
  }
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

// The child half of the next test: runs only when that test starts this
// binary with TRAINCTL_AT_EXIT_PATH_FILE set. It makes the directory, writes
// its path there, checks that a forked child's exit() leaves it, and returns
// (gtest's main then exits, which removes it).
TEST(TempDirTest, AtExitChild) {
  const char* path_file = std::getenv("TRAINCTL_AT_EXIT_PATH_FILE");
  if (path_file == nullptr) GTEST_SKIP() << "run by ADirectoryRemovedAtExitGoesWithItsProcess";
  const std::string dir = MakeTempDirRemovedAtExit("at_exit_test");
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/f") << "x";
  std::ofstream(path_file) << dir;
  const pid_t child = fork();
  if (child == 0) std::exit(0);  // a forked child: not its directory
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  struct stat st;
  EXPECT_EQ(stat(dir.c_str(), &st), 0) << "a forked child's exit removed " << dir;
}

TEST(TempDirTest, ADirectoryRemovedAtExitGoesWithItsProcess) {
  ScopedTempDir out("temp_dir_at_exit_test");
  const std::string path_file = out.File("path");
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const std::string cmd =
      absl::StrCat("TRAINCTL_AT_EXIT_PATH_FILE='", path_file, "' '", self,
                   "' --gtest_filter=TempDirTest.AtExitChild > '", out.File("log"), "' 2>&1");
  const int rc = std::system(cmd.c_str());
  std::ifstream log(out.File("log"));
  const std::string child_log((std::istreambuf_iterator<char>(log)),
                              std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << child_log;
  std::ifstream in(path_file);
  const std::string dir((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(dir.empty()) << child_log;
  struct stat st;
  EXPECT_EQ(stat(dir.c_str(), &st), -1) << dir;
  EXPECT_EQ(errno, ENOENT);
}

}  // namespace
}  // namespace trainctl

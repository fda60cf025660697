// The coordinator's web dashboard in a real browser: a coordinator and a
// worker daemon as processes, a job that trains for ~20 s, and headless
// Chromium (Debian `chromium`) driven over the DevTools protocol
// (--remote-debugging-pipe: NUL-separated JSON on fds 3 and 4). The browser
// signs in through the /login form with a viewer token, opens the job page
// while the job trains, and the test asserts, without any reload, that the
// loss chart (Chart.js) gains points while the job runs and that the state
// turns SUCCEEDED, with eval accuracy and throughput charted, events listed
// and every resource served by the coordinator itself (offline); then the
// job list shows the job, the workers page the worker's labels and slots,
// and the queues page a queue's quota and cohort.
// The JSON API's authentication is checked over plain HTTP too.
//
// A second test opens the dashboard through `trainctl dashboard`'s one-time
// sign-in link (no login form) on a command job that reports a loss, a
// custom scalar and an eval accuracy: signed in, the job page charts exactly
// those three (the eval report by step; no empty throughput or eval loss
// chart; whole steps on the x axes), the job's final model with the command
// that fetches it, event times on one line, a screenshot is taken, the job
// list shows the script's step and loss, the link works once;
// `trainctl metrics -o csv` lists the custom scalar as a column and the
// worker wrote both into the job's TensorBoard directory.
//
// TRAINCTL_DASHBOARD_SCREENSHOT=PATH saves the finished job page as a PNG
// (how docs/dashboard.png is made). Skipped (with the reason) where
// chromium is not installed.
#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/jobspec/job_spec.h"
#include "common/subprocess.h"
#include "tests/support/cluster.h"

namespace trainctl {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using trainctl::testing::Cluster;

const char* kChromium = "/usr/bin/chromium";

std::string SourceDir() {
  const char* s = std::getenv("TRAINCTL_SOURCE_DIR");
  return s ? s : std::string(TRAINCTL_SOURCE_DIR_FALLBACK);
}

// Headless Chromium and one page of it, over the DevTools pipe.
class Browser {
 public:
  ~Browser() {
    chromium_.Terminate(absl::Seconds(5));
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
  }

  bool Start(const std::string& profile_dir, const std::string& log_path) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0) return false;
    if (pipe2(from, O_CLOEXEC) != 0) {
      close(to[0]);
      close(to[1]);
      return false;
    }
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    SpawnOptions o;
    o.argv = {kChromium,
              "--headless=new",
              "--no-sandbox",
              "--disable-gpu",
              "--disable-dev-shm-usage",
              "--no-first-run",
              "--remote-debugging-pipe",
              "--user-data-dir=" + profile_dir,
              "--window-size=1280,1000",
              "about:blank"};
    // Chromium reads commands on fd 3 and writes answers on fd 4.
    o.fds = {{3, to[0]}, {4, from[1]}};
    if (log >= 0) o.fds.insert(o.fds.end(), {{1, log}, {2, log}});
    o.parent_death_signal = SIGKILL;
    absl::StatusOr<Subprocess> chromium = Subprocess::Spawn(o);
    for (int fd : {to[0], from[1], log}) {
      if (fd >= 0) close(fd);
    }
    to_ = to[1];
    from_ = from[0];
    if (!chromium.ok()) return false;
    chromium_ = std::move(*chromium);
    log_path_ = log_path;
    // Chromium's first start on a fresh machine (a new profile, font caches)
    // under a loaded CI machine can take well over the 20 s a command gets:
    // wait for its first answer here, generously, so the page commands after
    // it are not charged for the start.
    Struct version = Call("Browser.getVersion", "{}", false, absl::Seconds(180));
    if (!version.fields().count("product")) {
      ADD_FAILURE() << "chromium did not answer in 180 s; its log:\n" << LogTail();
      return false;
    }
    return true;
  }

  // The end of chromium's own log, for a failure message.
  std::string LogTail() const {
    std::ifstream in(log_path_);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
  }

  // Sends a command (to the page once Open() attached) and returns its
  // "result"; an error or a timeout fails the test and returns an empty one.
  Struct Call(const std::string& method, const std::string& params_json = "{}", bool page = true,
              absl::Duration timeout = absl::Seconds(20)) {
    const int id = ++next_id_;
    std::string msg =
        absl::StrCat("{\"id\":", id, ",\"method\":\"", method, "\",\"params\":", params_json);
    if (page && !session_.empty()) absl::StrAppend(&msg, ",\"sessionId\":\"", session_, "\"");
    msg += "}";
    msg.push_back('\0');
    if (write(to_, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) {
      ADD_FAILURE() << "cannot write to chromium";
      return {};
    }
    for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;) {
      size_t nul;
      while ((nul = buffer_.find('\0')) != std::string::npos) {
        std::string one = buffer_.substr(0, nul);
        buffer_.erase(0, nul + 1);
        Struct reply;
        if (!google::protobuf::util::JsonStringToMessage(one, &reply).ok()) continue;
        auto f = reply.fields();
        if (!f.count("id") || static_cast<int>(f["id"].number_value()) != id) continue;  // an event
        if (f.count("error")) {
          // An evaluation the page's own navigation (location.href = ...)
          // cut short: no answer yet, as for a poll that comes too early;
          // WaitTrue asks again on the new page.
          const bool navigated = method == "Runtime.evaluate" &&
                                 (absl::StrContains(one, "Inspected target navigated or closed") ||
                                  absl::StrContains(one, "Execution context was destroyed"));
          if (!navigated) ADD_FAILURE() << method << ": " << one;
          return {};
        }
        return f["result"].struct_value();
      }
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, 200) > 0) {
        char chunk[65536];
        ssize_t n = read(from_, chunk, sizeof(chunk));
        if (n <= 0) {
          ADD_FAILURE() << "chromium closed its DevTools pipe";
          return {};
        }
        buffer_.append(chunk, static_cast<size_t>(n));
      }
    }
    ADD_FAILURE() << method << ": no answer in " << timeout;
    return {};
  }

  // Opens `url` in a new page and attaches to it (commands go there after).
  bool Open(const std::string& url) {
    Struct target = Call("Target.createTarget", absl::StrCat("{\"url\":\"", url, "\"}"), false,
                         absl::Seconds(60));
    if (!target.fields().count("targetId")) {
      ADD_FAILURE() << "no page for " << url << "; chromium's log:\n" << LogTail();
      return false;
    }
    Struct attached =
        Call("Target.attachToTarget",
             absl::StrCat("{\"targetId\":\"", target.fields().at("targetId").string_value(),
                          "\",\"flatten\":true}"),
             false);
    if (!attached.fields().count("sessionId")) return false;
    session_ = attached.fields().at("sessionId").string_value();
    return true;
  }

  // The value of a JavaScript expression in the page (null on an exception).
  Value Eval(const std::string& expression) {
    Value expr;
    expr.set_string_value(expression);
    std::string quoted;
    (void)google::protobuf::util::MessageToJsonString(expr, &quoted);
    Struct r = Call("Runtime.evaluate",
                    absl::StrCat("{\"expression\":", quoted, ",\"returnByValue\":true}"));
    if (r.fields().count("exceptionDetails") || !r.fields().count("result")) return Value();
    const Struct& result = r.fields().at("result").struct_value();
    return result.fields().count("value") ? result.fields().at("value") : Value();
  }
  double Number(const std::string& expression) { return Eval(expression).number_value(); }
  std::string String(const std::string& expression) { return Eval(expression).string_value(); }

  // Polls `expression` until it is true; false on timeout.
  bool WaitTrue(const std::string& expression, absl::Duration timeout) {
    for (absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(100))) {
      if (Eval(expression).bool_value()) return true;
    }
    return false;
  }

 private:
  Subprocess chromium_;
  int to_ = -1, from_ = -1;
  int next_id_ = 0;
  std::string session_;
  std::string buffer_;
  std::string log_path_;
};

// "HOST:PORT" from the coordinator's "dashboard on http://HOST:PORT/" line.
std::string DashboardAddress(testing::Process* p) {
  static const std::regex re("dashboard on http://([^/\\s]+)/");
  for (absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    std::smatch m;
    std::string log = p->ReadLog();
    if (std::regex_search(log, m, re)) return m[1];
  }
  return "";
}

// A job that trains for ~10-25 s (by the machine) and evaluates every epoch.
// Whether the real rank binary is built (a LibTorch build); else the stand-in.
bool RealRank(const std::string& build) {
  return access((build + "/worker/trainer/trainctl-rank").c_str(), X_OK) == 0;
}

v1::JobSpec TrainingJob(bool real_rank) {
  if (real_rank) {
    // The classic example (trainctl-rank, Gloo on CPU, examples/mlp-synthetic.yaml)
    // with more data and an eval set.
    ParsedJobSpec p = ParseJobSpecYaml(
        "name: dashboard-mlp\nworld_size: 2\ndevice: cpu\n"
        "model: {name: mlp, input_dim: 5, hidden: [], classes: 2}\n"
        "data:\n"
        "  train: {format: synthetic, length: 600000, size: 5, classes: 2, seed: 0}\n"
        "  eval: {format: synthetic, length: 600, size: 5, classes: 2, seed: 1}\n"
        "  batch_size: 30\n"
        "training: {epochs: 6, loss: cross_entropy, optimizer: {name: adam, lr: 0.001}}\n"
        "metrics: {every_steps: 100}\n",
        "dashboard.yaml", {"restart.max_restarts=0"});
    EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].message);
    return p.spec;
  }
  // The stand-in rank: epochs of ~1 s (sleeps: as long on a loaded machine,
  // where the page takes longer to sign in) with an eval result each.
  ParsedJobSpec p = ParseJobSpecYaml(
      "model: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n",
      "dashboard.yaml",
      {"name=dashboard-slow", "world_size=2", "training.epochs=30", "restart.max_restarts=0"});
  EXPECT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].message);
  return p.spec;
}

// Every tick on chart `id`'s x axis is a whole number (a step, an epoch).
std::string WholeXTicks(const std::string& id) {
  return absl::StrCat("Chart.getChart('", id, "').scales.x.ticks.length > 0 && Chart.getChart('",
                      id, "').scales.x.ticks.every(t => Number.isInteger(t.value))");
}

// Every event's time on one line, in the one form the dashboard uses.
constexpr char kEventTimesOnOneLine[] =
    "document.querySelectorAll('#events tbody tr').length > 0 && "
    "[...document.querySelectorAll('#events tbody tr')].every(tr => "
    "tr.children[1].classList.contains('time') && "
    "getComputedStyle(tr.children[1]).whiteSpace === 'nowrap' && "
    "/^\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d$/.test(tr.children[1].textContent))";

TEST(DashboardE2ETest, JobPageChartsLiveAndTurnsSucceededWithoutReload) {
  if (access(kChromium, X_OK) != 0) {
    GTEST_SKIP() << kChromium
                 << " is not installed (Debian package `chromium`, see scripts/install-deps.sh)";
  }
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  const bool real_rank = RealRank(build);
  Cluster cluster(build, real_rank ? build + "/worker/trainer/trainctl-rank"
                                   : SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator({"--http_listen=127.0.0.1:0"}));
  ASSERT_TRUE(cluster.StartWorker("w0", 2, false, {"--labels=zone=lab,disk=ssd"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string addr = DashboardAddress(cluster.coordinator());
  ASSERT_FALSE(addr.empty()) << cluster.coordinator()->ReadLog();
  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "dash-viewer");
  ASSERT_FALSE(viewer.empty());

  // The JSON API sits behind the same tokens as the gRPC API.
  {
    httplib::Client http(addr);
    auto anonymous = http.Get("/api/jobs");
    ASSERT_TRUE(anonymous);
    EXPECT_EQ(anonymous->status, 401);
    EXPECT_NE(anonymous->body.find("no token"), std::string::npos) << anonymous->body;
    auto wrong = http.Get("/api/jobs", {{"Authorization", "Bearer not-a-token"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    const std::string worker_secret = [&] {
      std::ifstream f(cluster.WorkerTokenFile("w0"));
      std::string s;
      std::getline(f, s);
      return s;
    }();
    auto as_worker = http.Get("/api/workers", {{"Authorization", "Bearer " + worker_secret}});
    ASSERT_TRUE(as_worker);
    EXPECT_EQ(as_worker->status, 403) << as_worker->body;
    auto workers = http.Get("/api/workers", {{"Authorization", "Bearer " + viewer}});
    ASSERT_TRUE(workers);
    EXPECT_EQ(workers->status, 200);
    EXPECT_NE(workers->body.find("\"zone\":\"lab\""), std::string::npos) << workers->body;
    auto page = http.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 303) << "a page without a token sends the browser to /login";
    EXPECT_EQ(page->get_header_value("Location"), "/login?next=/");
    auto bad_rank = http.Get("/api/jobs/nope/logs?rank=x", {{"Authorization", "Bearer " + viewer}});
    ASSERT_TRUE(bad_rank);
    EXPECT_EQ(bad_rank->status, 404) << bad_rank->body;
  }

  // Chromium first (its start can take long on a loaded machine), then the
  // job: the page must see the job run, so the job's time goes to the page.
  Browser browser;
  ASSERT_TRUE(browser.Start(cluster.dir() + "/chromium-profile", cluster.dir() + "/chromium.log"));
  const std::string id = cluster.Submit(TrainingJob(real_rank));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(browser.Open(absl::StrCat("http://", addr, "/login?next=/jobs/", id)));
  ASSERT_TRUE(
      browser.WaitTrue("document.readyState === 'complete' && !!document.getElementById('token')",
                       absl::Seconds(30)));
  // Every page from here on records what its Content-Security-Policy
  // blocked: the dashboard must work under it with nothing blocked.
  browser.Call("Page.enable");
  browser.Call(
      "Page.addScriptToEvaluateOnNewDocument",
      "{\"source\":\"window.__csp = []; document.addEventListener('securitypolicyviolation', "
      "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));\"}");
  EXPECT_EQ(browser.String("document.getElementById('next').value"), absl::StrCat("/jobs/", id))
      << "login.js fills in where to return";
  browser.Eval(absl::StrCat("document.getElementById('token').value = '", viewer,
                            "'; document.getElementById('login').submit(); true"));
  ASSERT_TRUE(browser.WaitTrue(
      absl::StrCat("location.pathname === '/jobs/", id, "' && typeof Chart !== 'undefined'"),
      absl::Seconds(20)))
      << "the login form did not lead to the job page";
  // The loss chart appears with the job's first metric point.
  ASSERT_TRUE(browser.WaitTrue("!!Chart.getChart('loss-chart')", absl::Seconds(120)))
      << browser.String("document.body.innerText");
  // Anything that reloads the page loses this.
  browser.Eval("window.__dashboardTestMarker = 42; true");

  const std::string points = "Chart.getChart('loss-chart').data.datasets[0].data.length";
  const std::string state = "document.getElementById('job-state').textContent";
  double first_running = -1, last_running = -1;
  // The job trains 6 epochs: ~20 s alone, several times that on a loaded
  // CI machine (other e2e tests and the sanitizer stage beside it). Its end
  // is read from the API (the page is not what decides how long a job
  // takes); meanwhile the page is sampled, and once the job has ended the
  // page must show it within a bound of its own.
  v1::JobState api_state = v1::JOB_STATE_UNSPECIFIED;
  const v1::Job at_page_ready = cluster.Get(id);  // for a failure's message
  for (absl::Time deadline = absl::Now() + absl::Seconds(300); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(250))) {
    api_state = cluster.Get(id).state();
    if (api_state == v1::JOB_STATE_SUCCEEDED || api_state == v1::JOB_STATE_FAILED ||
        api_state == v1::JOB_STATE_CANCELLED) {
      break;
    }
    if (browser.String(state) == "RUNNING") {
      const double n = browser.Number(points);
      if (first_running < 0 && n > 0) first_running = n;
      last_running = n;
    }
  }
  ASSERT_EQ(api_state, v1::JOB_STATE_SUCCEEDED)
      << cluster.Get(id).DebugString() << cluster.worker("w0")->ReadLog();
  ASSERT_TRUE(browser.WaitTrue(absl::StrCat(state, " === 'SUCCEEDED'"), absl::Seconds(30)))
      << "the job SUCCEEDED but the page shows " << browser.String(state);
  EXPECT_GT(first_running, 0)
      << "the loss chart had no point while the job ran (when the page was ready the job was "
      << v1::JobState_Name(at_page_ready.state()) << " at epoch "
      << at_page_ready.progress().epoch() << ")";
  EXPECT_GT(last_running, first_running) << "the loss chart did not gain points while the job ran";
  EXPECT_EQ(browser.Number("window.__dashboardTestMarker"), 42) << "the page was reloaded";

  // After the end: the last points arrive, then polling stops.
  ASSERT_TRUE(browser.WaitTrue(absl::StrCat(points, " > ", last_running), absl::Seconds(10)) ||
              browser.Number(points) >= last_running);
  EXPECT_GE(browser.Number("Chart.getChart('eval-chart').data.datasets[0].data.length"), 1)
      << "no eval accuracy point";
  // Issue #44 item 12: epochs on the x axis, never "1.5".
  EXPECT_TRUE(browser.Eval(WholeXTicks("eval-chart")).bool_value())
      << browser.String("JSON.stringify(Chart.getChart('eval-chart').scales.x.ticks)");
  EXPECT_GE(browser.Number("Chart.getChart('throughput-chart').data.datasets[0].data.length"), 2);
  EXPECT_GT(browser.Number("Chart.getChart('throughput-chart').data.datasets[0].data[0].y"), 0);
  EXPECT_GE(browser.Number("document.querySelectorAll('#events tbody tr').length"), 3)
      << "events not listed";
  EXPECT_TRUE(browser.Eval(kEventTimesOnOneLine).bool_value()) << browser.String(
      "[...document.querySelectorAll('#events tbody tr')].map(tr => tr.children[1].textContent)");
  EXPECT_TRUE(
      browser.WaitTrue("document.getElementById('logs').textContent.length > 0", absl::Seconds(10)))
      << "no log lines shown";
  // Offline: every script, style and request came from the coordinator.
  EXPECT_TRUE(browser
                  .Eval("performance.getEntriesByType('resource').every(e => "
                        "e.name.startsWith(location.origin))")
                  .bool_value());
  EXPECT_EQ(browser.String("Chart.version"), "3.9.1");
  EXPECT_EQ(browser.String("JSON.stringify(window.__csp)"), "[]")
      << "the CSP blocked part of the page";

  if (const char* shot = std::getenv("TRAINCTL_DASHBOARD_SCREENSHOT");
      shot != nullptr && *shot != '\0') {
    browser.Call("Emulation.setDeviceMetricsOverride",
                 "{\"width\":1280,\"height\":1000,\"deviceScaleFactor\":1,\"mobile\":false}");
    absl::SleepFor(absl::Milliseconds(500));
    Struct png = browser.Call("Page.captureScreenshot", "{\"format\":\"png\"}");
    std::string bytes;
    ASSERT_TRUE(absl::Base64Unescape(png.fields().at("data").string_value(), &bytes));
    std::ofstream(shot, std::ios::binary) << bytes;
  }

  // Lineage: a continuation of the finished job is linked from its page, and
  // links back (it need not finish for that).
  v1::JobSpec cont = TrainingJob(real_rank);
  cont.mutable_training()->set_epochs(cont.training().epochs() + 1);
  cont.mutable_resume_from()->set_job(id);
  const std::string next = cluster.Submit(cont);
  ASSERT_FALSE(next.empty()) << "the finished job checkpointed every epoch: it can be continued";
  browser.Eval(absl::StrCat("location.href = '/jobs/", id, "'; true"));
  EXPECT_TRUE(browser.WaitTrue(
      absl::StrCat("document.getElementById('job-lineage')?.textContent === 'continued by ", next,
                   "'"),
      absl::Seconds(15)))
      << browser.String("document.body.innerText");
  browser.Eval(absl::StrCat("location.href = '/jobs/", next, "'; true"));
  EXPECT_TRUE(browser.WaitTrue(
      absl::StrCat("document.getElementById('job-lineage')?.textContent === 'continues ", id, "'"),
      absl::Seconds(15)))
      << browser.String("document.body.innerText");
  {
    // Its slots are free again for the workers page below (a stand-in rank
    // may have finished its one more epoch already: nothing to cancel).
    grpc::ClientContext cancel_ctx;
    cancel_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CancelJobRequest cancel;
    cancel.set_job_id(next);
    v1::Job cancelled;
    grpc::Status c = cluster.jobs()->CancelJob(&cancel_ctx, cancel, &cancelled);
    ASSERT_TRUE(c.ok() || c.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
        << c.error_message();
  }

  // The other two views, signed in by the cookie: the job list and the workers.
  browser.Eval("location.href = '/'; true");
  // A finished job's row shows its progress: complete.
  EXPECT_TRUE(
      browser.WaitTrue(absl::StrCat("[...document.querySelectorAll('#jobs tbody tr')].some(tr => "
                                    "tr.textContent.includes('",
                                    id,
                                    "') && tr.textContent.includes('SUCCEEDED') "
                                    "&& tr.textContent.includes(', done'))"),
                       absl::Seconds(15)))
      << browser.String("document.body.innerText");
  browser.Eval("location.href = '/workers'; true");
  EXPECT_TRUE(browser.WaitTrue(
      "[...document.querySelectorAll('#workers tbody tr')].some(tr => "
      "tr.textContent.includes('zone=lab') && tr.textContent.includes('disk=ssd') && "
      "tr.textContent.includes('0/2'))",
      absl::Seconds(40)))
      << browser.String("document.body.innerText");
  // The queues view: a queue the admin defines, with its quota in every
  // dimension (slots, CPUs, memory, a GPU flavor) and its cohort, none of it
  // used (its one job ended).
  {
    trainctl::testing::Process create(
        {build + "/client/trainctl", "--coordinator", cluster.address(), "--token-file",
         cluster.AdminTokenFile(), "queue", "create", "team-a", "--cpu", "2", "--cohort", "lab",
         "--nominal-cpus", "1.5", "--nominal-memory", "2Gi", "--nominal-gpus-flavor", "h100=4"},
        cluster.dir() + "/queue-create.log", cluster.dir());
    ASSERT_TRUE(create.Start());
    ASSERT_EQ(create.Wait(absl::Seconds(30)), 0) << create.ReadLog();
  }
  browser.Eval("location.href = '/queues'; true");
  EXPECT_TRUE(browser.WaitTrue(
      "[...document.querySelectorAll('#queues tbody tr')].some(tr => "
      "tr.textContent.includes('team-a') && tr.textContent.includes('lab') && "
      "tr.textContent.includes('0/2') && tr.textContent.includes('0/-') && "
      "tr.textContent.includes('0/1.5') && tr.textContent.includes('0 B/2 GiB') && "
      "tr.textContent.includes('h100 0/4'))",
      absl::Seconds(20)))
      << browser.String("document.body.innerText");
  EXPECT_EQ(browser.String("JSON.stringify(window.__csp)"), "[]")
      << "the CSP blocked part of the page";
}

// Reports a loss and a custom scalar at steps 1..5, and an eval accuracy
// at step 5; saves a final model (bytes: the test needs no torch).
constexpr char kReportingScript[] = R"py(
import trainctl
for step in range(1, 6):
    trainctl.report(step=step, epoch=0, loss=1.0 / step, val_f1=0.5 + step / 20.0)
trainctl.report(step=5, epoch=0, eval_accuracy=0.625)
trainctl.save_model(b"the final model")
print("reported")
)py";

TEST(DashboardE2ETest, ASignInLinkShowsACommandJobsOwnScalarsWhichReachMetricsAndTensorBoard) {
  if (access(kChromium, X_OK) != 0) {
    GTEST_SKIP() << kChromium
                 << " is not installed (Debian package `chromium`, see scripts/install-deps.sh)";
  }
  const std::string build = trainctl::testing::BuildDirOfThisTest();
  Cluster cluster(build, SourceDir() + "/tests/support/fake_rank.py");
  ASSERT_TRUE(cluster.StartCoordinator({"--http_listen=127.0.0.1:0"}));
  ASSERT_TRUE(cluster.StartWorker("w0", 1, false, {"--allow_commands"}));
  ASSERT_TRUE(cluster.WaitWorkers(1));
  const std::string addr = DashboardAddress(cluster.coordinator());
  ASSERT_FALSE(addr.empty()) << cluster.coordinator()->ReadLog();
  const std::string script = cluster.dir() + "/report.py";
  std::ofstream(script) << kReportingScript;
  const std::string ckpt = cluster.dir() + "/ck";
  ParsedJobSpec p = ParseJobSpecYaml(
      absl::StrCat(
          "name: scalars\nworld_size: 1\ndevice: cpu\ncommand:\n  argv: [/usr/bin/python3, ",
          script, "]\nrestart: {max_restarts: 0}\ncheckpoint: {dir: ", ckpt,
          "}\ntensorboard: {enabled: true}\n"),
      "scalars.yaml");
  ASSERT_TRUE(p.ok()) << (p.errors.empty() ? "" : p.errors[0].message);
  const std::string id = cluster.Submit(p.spec);
  ASSERT_FALSE(id.empty());
  v1::Job job = cluster.WaitState(id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason() << "\n"
                                                  << cluster.RankLog(id, 1, 0);

  const std::string viewer = cluster.CreateToken(v1::ROLE_VIEWER, "link-viewer");
  ASSERT_FALSE(viewer.empty());
  auto cli = [&](const std::string& name, std::vector<std::string> args) {
    std::vector<std::string> argv = {build + "/client/trainctl", "--coordinator", cluster.address(),
                                     "--token", viewer};
    argv.insert(argv.end(), args.begin(), args.end());
    trainctl::testing::Process proc(argv, cluster.dir() + "/" + name + ".log");
    EXPECT_TRUE(proc.Start());
    const int status = proc.Wait(absl::Seconds(30));
    EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << proc.ReadLog();
    return proc.ReadLog();
  };
  // The worker wrote rank 0's reports as TensorBoard scalars (read by an
  // independent reader): the loss under the engine's tag, val_f1 under its
  // own name, at steps 1..5.
  const std::string events = cluster.dir() + "/tfevents.jsonl";
  const std::string read =
      absl::StrCat("/usr/bin/python3 ", SourceDir(), "/tests/support/read_tfevents.py ", ckpt,
                   "/tensorboard > ", events, " 2>&1");
  ASSERT_EQ(std::system(read.c_str()), 0) << read;
  std::string tb;
  {
    std::ifstream in(events);
    tb.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_NE(tb.find("\"file_version\""), std::string::npos) << tb;
  EXPECT_NE(tb.find("\"step\": 5,"), std::string::npos) << tb;
  EXPECT_NE(tb.find("\"val_f1\": 0.75"), std::string::npos) << tb;
  EXPECT_NE(tb.find("\"train/loss\": 0.2"), std::string::npos) << "step 5's loss 1/5\n" << tb;
  EXPECT_EQ(tb.find("train/samples_per_sec"), std::string::npos)
      << "a field the job never reported\n"
      << tb;

  // The custom scalar is a column of `trainctl metrics`.
  const std::string csv = cli("metrics", {"metrics", id, "-o", "csv"});
  EXPECT_NE(csv.find(",eval_accuracy,val_f1,time\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",0.75,"), std::string::npos) << "step 5's val_f1\n" << csv;

  const std::string printed = cli("dashboard", {"dashboard"});
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(printed, m, std::regex("(http://[^\\s]+/signin\\?code=[0-9a-f]{64})")))
      << printed;
  const std::string link = m[1];
  EXPECT_EQ(link.substr(0, link.find("/signin")), "http://" + addr)
      << "the host the CLI dialed, the dashboard's port";

  Browser browser;
  ASSERT_TRUE(browser.Start(cluster.dir() + "/chromium-profile", cluster.dir() + "/chromium.log"));
  ASSERT_TRUE(browser.Open(absl::StrCat(link, "&next=/jobs/", id)));
  ASSERT_TRUE(browser.WaitTrue(
      absl::StrCat("location.pathname === '/jobs/", id,
                   "' && document.getElementById('job-state')?.textContent === 'SUCCEEDED' "
                   "&& typeof Chart !== 'undefined' && !!Chart.getChart('scalar-val_f1')"),
      absl::Seconds(30)))
      << "not signed in on the job page: "
      << browser.String("location.href + ' ' + document.body.innerText");
  EXPECT_TRUE(
      browser.WaitTrue("Chart.getChart('scalar-val_f1').data.datasets[0].data.length === 5 && "
                       "Chart.getChart('loss-chart').data.datasets[0].data.length === 5",
                       absl::Seconds(10)));
  EXPECT_DOUBLE_EQ(browser.Number("Chart.getChart('scalar-val_f1').data.datasets[0].data[4].y"),
                   0.75);
  // The script's eval report is on the eval chart, at its step.
  EXPECT_TRUE(browser.WaitTrue("Chart.getChart('eval-chart')?.data.datasets[0].data.length === 1",
                               absl::Seconds(10)));
  EXPECT_DOUBLE_EQ(browser.Number("Chart.getChart('eval-chart').data.datasets[0].data[0].x"), 5);
  EXPECT_DOUBLE_EQ(browser.Number("Chart.getChart('eval-chart').data.datasets[0].data[0].y"),
                   0.625);
  EXPECT_TRUE(browser
                  .Eval("Chart.getChart('throughput-chart') === undefined && "
                        "Chart.getChart('eval-loss-chart') === undefined && "
                        "document.querySelectorAll('canvas').length === 3")
                  .bool_value())
      << "a chart for a metric the job never reported";
  // Issue #44 item 12: whole steps on the x axes (5 steps drew 1, 1.5, 2...);
  // the final model's path with the command that fetches it; event times
  // on one line.
  EXPECT_TRUE(
      browser.Eval(WholeXTicks("eval-chart") + " && " + WholeXTicks("loss-chart")).bool_value())
      << browser.String("JSON.stringify(Chart.getChart('loss-chart').scales.x.ticks)");
  ASSERT_FALSE(job.final_model().empty()) << "the script saved a model";
  EXPECT_TRUE(browser.WaitTrue("!document.getElementById('job-model').hidden", absl::Seconds(10)));
  EXPECT_EQ(browser.String("document.getElementById('job-model-path').textContent"),
            job.final_model());
  EXPECT_EQ(browser.String("document.getElementById('job-model-fetch').textContent"),
            "trainctl fetch " + id);
  EXPECT_TRUE(browser.Eval(kEventTimesOnOneLine).bool_value()) << browser.String(
      "[...document.querySelectorAll('#events tbody tr')].map(tr => tr.children[1].textContent)");
  Struct png = browser.Call("Page.captureScreenshot", "{\"format\":\"png\"}");
  std::string bytes;
  ASSERT_TRUE(png.fields().count("data"));
  ASSERT_TRUE(absl::Base64Unescape(png.fields().at("data").string_value(), &bytes));
  EXPECT_GT(bytes.size(), 5000u);
  EXPECT_EQ(bytes.substr(0, 4), "\x89PNG");
  std::ofstream(cluster.dir() + "/signed-in.png", std::ios::binary) << bytes;

  // Issue #44 item 12: the job list showed "–" for the script's progress
  // and loss; it reported step 5 and a loss of 1/5.
  browser.Eval("location.href = '/'; true");
  EXPECT_TRUE(
      browser.WaitTrue(absl::StrCat("[...document.querySelectorAll('#jobs tbody tr')].some(tr => "
                                    "tr.textContent.includes('",
                                    id,
                                    "') && tr.children[2].textContent === "
                                    "'step 5' && tr.children[4].textContent === '0.2000')"),
                       absl::Seconds(15)))
      << browser.String("document.body.innerText");

  // The link worked once.
  httplib::Client http(addr);
  auto again = http.Get(link.substr(link.find("/signin")));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 401);
  EXPECT_NE(again->body.find("unknown, used or expired"), std::string::npos) << again->body;
}

}  // namespace
}  // namespace trainctl

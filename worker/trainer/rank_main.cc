// trainctl-rank: one rank of a data-parallel training job, launched and
// supervised by trainctl-worker (see worker/protocol/rank_protocol.h for the
// contract).
//
//   trainctl-rank --config PATH
//
// Start-up, in order, so that cheap failures come first:
//   1. read and parse the config            -> error config,     exit 2
//   2. load the datasets, build the model   -> error data/config, exit 2
//   3. rendezvous (Gloo: rank 0 hosts the store and reports
//      "rendezvous HOST:PORT"; others dial run.store_address) and connect
//      the communicator                     -> error rendezvous, exit 3
//   4. resume point, optimizer, broadcast of rank 0's parameters; "ready"
//   5. train; metrics and progress on the status fd; exit 0
// While training: bad data/model -> error config, exit 2; a failed or
// timed-out collective -> error collective, exit 3; SIGTERM/SIGINT -> stop
// at the next step boundary (after at most ~10 s the communicator is aborted
// so a blocked collective cannot delay it), error exit, exit 143; anything
// else -> error exit, exit 1. NaN/Inf gradients or a collapsed loss scale ->
// error nan:STEP, exit 1; a failed allocation (std::bad_alloc, LibTorch's
// "can't allocate memory", CUDA out of memory) -> error out_of_memory,
// exit 1. Log lines go to stdout, errors also to stderr.
#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <signal.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "worker/dist/collective_probe.h"
#include "worker/dist/collectives.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/engine/model.h"
#include "worker/protocol/rank_protocol.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/datasets.h"
#include "worker/trainer/rank_config.h"
#include "worker/trainer/tensorboard_writer.h"
#include "worker/trainer/trainer.h"
#if TRAINCTL_HAVE_GLOO
#include "worker/dist/gloo_collectives.h"
#endif
#if TRAINCTL_HAVE_NCCL && TRAINCTL_NCCL_TORCH_CUDA
#include "worker/dist/nccl_collectives.h"
#endif

namespace trainctl::trainer {
namespace {

using rankproto::ErrorKind;

constexpr int kExitOk = 0;
constexpr int kExitOther = 1;
constexpr int kExitConfig = 2;
constexpr int kExitCollective = 3;
constexpr int kExitTerminated = 128 + SIGTERM;

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

extern "C" void OnStopSignal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

// Writes status lines to the daemon's pipe (thread-safe: the stop watcher
// may report while the training thread does).
class StatusReporter {
 public:
  void set_fd(int fd) { fd_ = fd; }
  void Send(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ >= 0 && !rankproto::WriteLine(fd_, line)) fd_ = -1;  // daemon end closed
  }

 private:
  std::mutex mu_;
  int fd_ = -1;
};

StatusReporter g_status;

void LogLine(const std::string& line) {
  std::cout << line << std::endl;
}

[[noreturn]] void Fail(ErrorKind kind, const std::string& message, int exit_code, int64_t step = 0) {
  g_status.Send(rankproto::FormatError(kind, message, step));
  std::cerr << "trainctl-rank: error " << rankproto::ErrorKindName(kind) << ": " << message << std::endl;
  std::cout.flush();
  // Skip destructors: after a failure a communicator or loader thread may be
  // stuck, and the daemon is waiting for the exit.
  std::_Exit(exit_code);
}

[[noreturn]] void FailStatus(ErrorKind kind, const absl::Status& s, int exit_code) {
  Fail(kind, std::string(s.message()), exit_code);
}

// Sends the rank's heartbeat (a `progress` line with the collective probe's
// state) about once a second from its own thread, so that a rank blocked in
// a collective keeps saying where it is blocked. A rank stopped with SIGSTOP
// sends nothing at all, which is how the coordinator tells it apart.
class HeartbeatReporter {
 public:
  explicit HeartbeatReporter(std::shared_ptr<dist::CollectiveProbe> probe)
      : probe_(std::move(probe)), thread_([this] { Loop(); }) {}
  ~HeartbeatReporter() {
    done_.store(true);
    thread_.join();
  }
  // From the training loop's progress callback (at most once a second, and
  // at epoch boundaries): records the position and reports at once.
  void Progress(int32_t epoch, int64_t step) {
    epoch_.store(epoch, std::memory_order_relaxed);
    step_.store(step, std::memory_order_relaxed);
    Send();
  }

 private:
  void Send() {
    const dist::ProbeSnapshot p = probe_->Snapshot();
    rankproto::RankHeartbeat hb;
    hb.phase = dist::ProbePhaseName(p.phase);
    hb.seq = p.seq;
    hb.waiting_seq = p.waiting_seq;
    hb.op = dist::ProbeOpName(p.op);
    hb.op_step = p.op_step;
    hb.op_bucket = p.op_bucket;
    hb.waiting_ms = absl::ToInt64Milliseconds(p.waiting);
    hb.p99_step_ms = p.p99_step_ms;
    hb.compute_ms = p.compute_ms;
    g_status.Send(rankproto::FormatProgress(epoch_.load(), step_.load(), hb));
  }
  void Loop() {
    using namespace std::chrono_literals;
    auto next = std::chrono::steady_clock::now() + 1s;
    while (!done_.load()) {
      if (std::chrono::steady_clock::now() >= next) {
        Send();
        next += 1s;
        if (next < std::chrono::steady_clock::now()) next = std::chrono::steady_clock::now() + 1s;
      }
      std::this_thread::sleep_for(50ms);
    }
  }

  std::shared_ptr<dist::CollectiveProbe> probe_;
  std::atomic<int32_t> epoch_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Kills a stop that the training loop cannot reach: aborts the communicator
// when a stop was requested and the loop has not returned within 10 s, and
// exits outright 5 s after that.
class StopWatcher {
 public:
  StopWatcher() : thread_([this] { Loop(); }) {}
  ~StopWatcher() {
    done_.store(true);
    thread_.join();
  }
  void set_comm(std::shared_ptr<dist::Collectives> comm) {
    std::lock_guard<std::mutex> lock(mu_);
    comm_ = std::move(comm);
  }

 private:
  void Loop() {
    using namespace std::chrono_literals;
    while (!done_.load()) {
      if (g_stop.load()) break;
      std::this_thread::sleep_for(50ms);
    }
    if (done_.load()) return;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!done_.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
    if (done_.load()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (comm_ != nullptr) comm_->Abort();
    }
    deadline = std::chrono::steady_clock::now() + 5s;
    while (!done_.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
    if (done_.load()) return;
    Fail(ErrorKind::kExit, absl::StrCat("stopped by signal ", g_signal.load()), kExitTerminated);
  }

  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::shared_ptr<dist::Collectives> comm_;
  std::thread thread_;
};

// An allocation failure in any of its spellings: std::bad_alloc, LibTorch's
// CPU allocator ("DefaultCPUAllocator: can't allocate memory"), CUDA's
// caching allocator ("CUDA out of memory").
bool IsOutOfMemoryText(absl::string_view text) {
  for (absl::string_view needle : {"can't allocate memory", "CUDA out of memory", "std::bad_alloc",
                                  "out of memory", "Cannot allocate memory"}) {
    if (text.find(needle) != absl::string_view::npos) return true;
  }
  return false;
}

// Peak resident memory of this process (VmHWM), or 0.
int64_t PeakRss() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

int g_rank_for_oom = 0;

[[noreturn]] void FailOutOfMemory(absl::string_view what) {
  what = what.substr(0, what.find('\n'));  // c10 appends a backtrace
  Fail(ErrorKind::kOutOfMemory,
       absl::StrFormat("rank %d ran out of memory (peak resident %.1f GiB): %s; lower data.batch_size "
                       "(or the model size, or data.num_workers)",
                       g_rank_for_oom, static_cast<double>(PeakRss()) / (1 << 30), std::string(what).substr(0, 300)),
       kExitOther);
}

// Test hook (run.debug.address_space_limit_mb): caps the address space at
// what the process maps now plus this much, so a test can make a too-large
// batch fail like a memory-limited host would. 0 = no cap.
absl::Status LimitAddressSpace(int64_t extra_mb) {
  if (extra_mb <= 0) return absl::OkStatus();
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return absl::InternalError("run.debug.address_space_limit_mb: cannot read /proc/self/statm");
  unsigned long pages = 0;
  const int n = std::fscanf(f, "%lu", &pages);
  std::fclose(f);
  if (n != 1) return absl::InternalError("run.debug.address_space_limit_mb: bad /proc/self/statm");
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                       static_cast<rlim_t>(extra_mb) * (1 << 20);
  struct rlimit rl {limit, limit};
  if (setrlimit(RLIMIT_AS, &rl) != 0) {
    return absl::InternalError(absl::StrCat("run.debug.address_space_limit_mb: setrlimit: ", std::strerror(errno)));
  }
  LogLine(absl::StrCat("address space capped at ", limit >> 20, " MiB (run.debug.address_space_limit_mb)"));
  return absl::OkStatus();
}

int64_t ModelClasses(const engine::ModelOptions& m) {
  if (m.name == "mlp") return m.mlp.output_dim;
  if (m.name == "cnn") return m.cnn.classes;
  return 0;  // TorchScript: the module decides; labels are not range-checked up front
}

// The host this rank's Gloo device binds to and advertises to its peers.
std::string GlooBindHost(const rankproto::FlatConfig& flat, const RunOptions& run) {
  auto it = flat.find(rankproto::run_keys::kAdvertiseHost);
  if (it != flat.end() && !it->second.empty()) return it->second;
  std::string host;
  uint16_t port = 0;
  if (run.rank == 0 ||
      !dist::RendezvousStore::ParseAddress(run.store_address, &host, &port).ok() ||
      host == "127.0.0.1" || host == "localhost" || host == "::1") {
    return "127.0.0.1";
  }
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

absl::StatusOr<std::string> HexDecode(const std::string& hex) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      char c = hex[i + j];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("bad hex digit '", std::string(1, c), "'"));
      v = v * 16 + d;
    }
    out.push_back(static_cast<char>(v));
  }
  return out;
}

int Main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  std::string config_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else {
      std::cerr << "usage: trainctl-rank --config PATH (unknown argument '" << a << "')" << std::endl;
      return kExitConfig;
    }
  }
  if (config_path.empty()) {
    std::cerr << "usage: trainctl-rank --config PATH" << std::endl;
    return kExitConfig;
  }

  // 1. Config. Until run.status_fd is known, errors can only go to stderr.
  auto flat = rankproto::ReadConfigFile(config_path);
  if (!flat.ok()) FailStatus(ErrorKind::kConfig, flat.status(), kExitConfig);
  {
    auto fd = rankproto::GetInt(*flat, rankproto::run_keys::kStatusFd, -1);
    if (fd.ok()) g_status.set_fd(static_cast<int>(*fd));
  }
  auto parsed = ParseRankConfig(*flat);
  if (!parsed.ok()) FailStatus(ErrorKind::kConfig, parsed.status(), kExitConfig);
  const RankConfig& cfg = *parsed;
  const RunOptions& run = cfg.run;
  StopWatcher watcher;

  torch::set_num_threads(run.num_threads);
  torch::manual_seed(cfg.training.data.seed);
  c10::Device device(c10::kCPU);
  if (run.device == "cuda") {
    if (!torch::cuda::is_available()) {
      Fail(ErrorKind::kConfig, "run.device: cuda, but this LibTorch has no CUDA or no GPU is visible",
           kExitConfig);
    }
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(run.cuda_device));
  }
  LogLine(absl::StrCat("trainctl-rank: rank ", run.rank, "/", run.world_size, " on ", device.str(),
                       ", backend ", run.backend.empty() ? "none" : run.backend, ", torch threads ",
                       run.num_threads));
  for (const std::string& note : cfg.notes) LogLine(note);

  // 2. Data and model.
  // Classification splits need integer labels: bounded by the model's classes
  // when it has a known head, any non-negative label for TorchScript modules.
  int64_t classes = 0;
  if (cfg.training.loss == LossKind::kCrossEntropy) {
    classes = ModelClasses(cfg.model);
    if (classes == 0) classes = int64_t{1} << 30;
  }
  g_rank_for_oom = run.rank;
  auto train = LoadDataset(cfg.train, classes);
  if (!train.ok()) FailStatus(ErrorKind::kData, train.status(), kExitConfig);
  std::shared_ptr<const engine::Dataset> eval;
  if (cfg.eval.has_value()) {
    auto e = LoadDataset(*cfg.eval, classes);
    if (!e.ok()) FailStatus(ErrorKind::kData, e.status(), kExitConfig);
    eval = *e;
  }
  auto model = engine::CreateModel(cfg.model);
  if (!model.ok()) Fail(ErrorKind::kConfig, absl::StrCat("model: ", model.status().message()), kExitConfig);
  std::shared_ptr<engine::Model> shared_model = std::move(model).value();

  // Resume point: the coordinator's record, the same on every rank (rank 0
  // reads the file and broadcasts it). Nothing is picked from a directory.
  const CheckpointOptions& ck = cfg.training.checkpoint;
  if (ck.writer && !ck.dir.empty()) {
    absl::Status dir_ok = CheckCheckpointDir(ck.dir);
    if (!dir_ok.ok()) FailStatus(ErrorKind::kConfig, dir_ok, kExitConfig);
  }

  // 3. Rendezvous and communicator.
  const absl::Duration timeout = absl::Seconds(run.timeout_s);
  std::shared_ptr<dist::Collectives> comm;
  const std::string key_prefix = absl::StrCat("trainctl/", run.job_id, "/", run.attempt, "/");
  if (run.backend == "gloo") {
#if TRAINCTL_HAVE_GLOO
    std::shared_ptr<dist::RendezvousStore> store;
    if (run.rank == 0) {
      auto s = dist::RendezvousStore::Host(run.advertise_host, static_cast<uint16_t>(run.store_port),
                                           timeout, run.store_secret);
      if (!s.ok()) FailStatus(ErrorKind::kRendezvous, s.status(), kExitCollective);
      store = *s;
      g_status.Send(rankproto::FormatRendezvous(store->address()));
    } else {
      auto s = dist::RendezvousStore::Connect(run.store_address, timeout, run.store_secret);
      if (!s.ok()) FailStatus(ErrorKind::kRendezvous, s.status(), kExitCollective);
      store = *s;
    }
    dist::GlooOptions go;
    go.rank = run.rank;
    go.world_size = run.world_size;
    go.bind_host = GlooBindHost(*flat, run);
    go.timeout = timeout;
    go.key_prefix = key_prefix + "gloo/";
    // TRAINCTL_SHM=0 in the worker's environment keeps single-host jobs on
    // Gloo's TCP transport (e.g. where /dev/shm is unusable).
    const char* shm_env = std::getenv("TRAINCTL_SHM");
    go.all_ranks_local = run.local_world_size == run.world_size &&
                         !(shm_env != nullptr && std::string(shm_env) == "0");
    auto c = dist::CreateGlooCollectives(go, store);
    if (!c.ok()) FailStatus(ErrorKind::kRendezvous, c.status(), kExitCollective);
    comm = *c;
    if (run.rank == 0) {
      LogLine(absl::StrCat("collectives: ", comm->name(), " (", run.world_size, " ranks",
                           go.all_ranks_local && comm->name() == "gloo"
                               ? "; shared memory unavailable, all-reduce over TCP)"
                               : ")"));
    }
#else
    Fail(ErrorKind::kConfig, "run.backend: gloo, but this trainctl-rank was built without Gloo", kExitConfig);
#endif
  } else if (run.backend == "nccl") {
#if TRAINCTL_HAVE_NCCL && TRAINCTL_NCCL_TORCH_CUDA
    auto id = HexDecode(run.nccl_unique_id_hex);
    if (!id.ok() || id->size() != dist::kNcclUniqueIdBytes) {
      Fail(ErrorKind::kConfig,
           absl::StrCat(rankproto::run_keys::kNcclUniqueId, ": not ", dist::kNcclUniqueIdBytes, " hex-encoded bytes"),
           kExitConfig);
    }
    dist::NcclOptions no;
    no.rank = run.rank;
    no.world_size = run.world_size;
    no.device = run.cuda_device;
    no.unique_id = *id;
    no.timeout = timeout;
    auto c = dist::CreateNcclCollectives(no);
    if (!c.ok()) FailStatus(ErrorKind::kRendezvous, c.status(), kExitCollective);
    (*c)->UseCurrentTorchStream();
    comm = *c;
#else
    (void)HexDecode;
    Fail(ErrorKind::kConfig,
         "run.backend: nccl, but this trainctl-rank was built without NCCL and LibTorch-CUDA "
         "(TRAINCTL_NCCL_TORCH_CUDA)",
         kExitConfig);
#endif
  }
  watcher.set_comm(comm);
  // Every collective is numbered and every wait visible to the heartbeat.
  auto probe = std::make_shared<dist::CollectiveProbe>();
  if (comm != nullptr) comm = std::make_shared<dist::TrackedCollectives>(comm, probe);
  HeartbeatReporter heartbeat(probe);

  // 4. Trainer (loads the checkpoint, broadcasts rank 0's parameters).
  TrainerSetup setup;
  setup.options = cfg.training;
  setup.rank = run.rank;
  setup.world_size = run.world_size;
  setup.device = device;
  setup.manifest.job_id = run.job_id;
  setup.manifest.attempt = run.attempt;
  setup.manifest.spec_hash = ck.spec_hash;
  setup.checkpoint_writer = ck.writer;
  setup.resume_from = ck.resume_from;
  setup.resume_checksum = ck.resume_checksum;
  setup.resume_job_id = ck.resume_job_id;
  if (!ck.resume_from.empty()) {
    LogLine(absl::StrCat("resuming from checkpoint ", ck.resume_from,
                         run.rank == 0 ? "" : " (read by rank 0, received by broadcast)"));
  }
  setup.stop = &g_stop;
  setup.debug_step_sleep_ms = run.debug_step_sleep_ms;
  // Test hook: TRAINCTL_TEST_STEP_SLEEP_MS (through the daemon's
  // environment) paces every rank like run.debug.step_sleep_ms.
  if (const char* ms = std::getenv("TRAINCTL_TEST_STEP_SLEEP_MS"); ms != nullptr) {
    setup.debug_step_sleep_ms = std::clamp(std::atoll(ms), 0LL, 60000LL);
  }
  setup.skip_steps = run.skip_steps;
  if (!run.skip_steps.empty()) {
    LogLine(absl::StrCat("rolled back: skipping step(s) ", absl::StrJoin(run.skip_steps, ", ")));
  }
  setup.probe = probe;
  // Test hook: TRAINCTL_DEBUG_COMPUTE_SLEEP_MS in the worker's environment
  // makes its ranks stragglers (docs/failures.md).
  if (const char* slow = std::getenv("TRAINCTL_DEBUG_COMPUTE_SLEEP_MS"); slow != nullptr) {
    int64_t ms = 0;
    if (absl::SimpleAtoi(slow, &ms) && ms > 0 && ms <= 60000) {
      setup.debug_compute_sleep_ms = ms;
      LogLine(absl::StrCat("test hook: sleeping ", ms, " ms of compute per step"));
    }
  }
  TrainerCallbacks callbacks;
  // Rank 0 also writes the job's scalars as TensorBoard event files.
  std::shared_ptr<TensorBoardWriter> tensorboard;
  if (const std::string tb_dir = rankproto::GetString(*flat, rankproto::run_keys::kTensorBoardDir, "");
      run.rank == 0 && !tb_dir.empty()) {
    auto w = TensorBoardWriter::Open(tb_dir);
    if (!w.ok()) FailStatus(ErrorKind::kConfig, w.status(), kExitConfig);
    tensorboard = std::move(w).value();
    LogLine(absl::StrCat("TensorBoard event file ", tensorboard->path()));
  }
  callbacks.on_metric = [tensorboard](const rankproto::RankMetric& m) {
    g_status.Send(rankproto::FormatMetric(m));
    if (tensorboard == nullptr) return;
    const int64_t step = int64_t{m.epoch} * m.steps_per_epoch + m.step;
    std::vector<std::pair<std::string, float>> scalars;
    auto add = [&](const char* tag, double v) { scalars.emplace_back(tag, static_cast<float>(v)); };
    if (m.kind == "epoch_end") {
      add("epoch/loss", m.loss);
      add("epoch/samples_per_sec", m.samples_per_sec);
      if (m.has_eval) {
        add("eval/loss", m.eval_loss);
        add("eval/accuracy", m.eval_accuracy);
      }
    } else {
      add("train/loss", m.loss);
      add("train/lr", m.lr);
      add("train/samples_per_sec", m.samples_per_sec);
      add("train/step_ms/data", m.data_ms);
      add("train/step_ms/compute", m.compute_ms);
      add("train/step_ms/comm", m.comm_ms);
      if (m.loss_scale > 0) add("train/loss_scale", m.loss_scale);
    }
    // A failed write (disk full) costs the plot, not the training.
    static bool warned = false;
    if (absl::Status s = tensorboard->Write(step, scalars); !s.ok() && !warned) {
      warned = true;
      LogLine(absl::StrCat("TensorBoard: ", s.message(), " (later failures are not logged)"));
    }
  };
  callbacks.on_progress = [&heartbeat](int32_t epoch, int64_t step) { heartbeat.Progress(epoch, step); };
  callbacks.on_log = [](const std::string& line) { LogLine(line); };
  // Test hook: TRAINCTL_TEST_SAMPLE_LOG=DIR makes every rank append the
  // sample indices of each optimizer step to DIR/<job>.a<attempt>.r<rank>.samples
  // ("EPOCH GLOBAL_STEP i,i,..." per line), so end-to-end tests can check
  // which samples a run trained on across restarts. Unset in production.
  if (const char* dir = std::getenv("TRAINCTL_TEST_SAMPLE_LOG"); dir != nullptr && *dir != '\0') {
    auto out = std::make_shared<std::ofstream>(absl::StrCat(dir, "/", run.job_id, ".a", run.attempt, ".r", run.rank,
                                                            ".samples"),
                                               std::ios::app);
    callbacks.on_step_samples = [out](int64_t epoch, int64_t step, const std::vector<int64_t>& idx) {
      *out << epoch << " " << step << " " << absl::StrJoin(idx, ",") << "\n";
      out->flush();
    };
  }
  callbacks.on_checkpoint = [](const WrittenCheckpoint& w, const TrainingPosition& p) {
    rankproto::CheckpointNote note;
    note.epochs_done = p.epochs_done;
    note.global_step = p.global_step;
    note.epoch_consumed = p.epoch_consumed;
    note.size_bytes = w.size_bytes;
    note.checksum = w.checksum;
    note.path = w.path;
    g_status.Send(rankproto::FormatCheckpoint(note));
    LogLine(absl::StrCat("checkpoint ", w.path, " (", w.size_bytes, " bytes, ", w.checksum, ")"));
  };

  Trainer* trainer_ptr = nullptr;
  {
    auto limit_mb = rankproto::GetInt(*flat, "run.debug.address_space_limit_mb", 0);
    if (!limit_mb.ok()) FailStatus(ErrorKind::kConfig, limit_mb.status(), kExitConfig);
    if (absl::Status s = LimitAddressSpace(*limit_mb); !s.ok()) FailStatus(ErrorKind::kConfig, s, kExitConfig);
  }
  auto report = [&](const absl::Status& s) {
    if (g_stop.load()) {
      Fail(ErrorKind::kExit, absl::StrCat("stopped by signal ", g_signal.load(), ": ", s.message()),
           kExitTerminated);
    }
    if (IsOutOfMemoryText(s.message())) FailOutOfMemory(s.message());
    switch (FailureKindOf(s)) {
      case FailureKind::kNan:
        Fail(ErrorKind::kNan, std::string(s.message()), kExitOther,
             trainer_ptr != nullptr ? std::max<int64_t>(trainer_ptr->nan_step(), 0) : 0);
      case FailureKind::kConfig: FailStatus(ErrorKind::kConfig, s, kExitConfig);
      case FailureKind::kCollective: FailStatus(ErrorKind::kCollective, s, kExitCollective);
      case FailureKind::kStopped: FailStatus(ErrorKind::kExit, s, kExitTerminated);
      case FailureKind::kDiskFull: FailStatus(ErrorKind::kDiskFull, s, kExitOther);
      case FailureKind::kOther: FailStatus(ErrorKind::kExit, s, kExitOther);
    }
    FailStatus(ErrorKind::kExit, s, kExitOther);
  };

  auto trainer = Trainer::Create(setup, shared_model, *train, eval, comm, callbacks);
  if (!trainer.ok()) report(trainer.status());
  trainer_ptr = trainer->get();
  LogLine(absl::StrCat("training ", cfg.training.epochs, " epochs of ", (*trainer)->steps_per_epoch(),
                       " steps from epoch ", (*trainer)->start_epoch()));
  g_status.Send(rankproto::FormatReady());

  // 5. Train.
  auto result = (*trainer)->Run();
  if (!result.ok()) report(result.status());
  if (run.rank == 0 && !result->exported_model.empty()) {
    g_status.Send(rankproto::FormatModel(result->exported_model));
  }
  LogLine(absl::StrCat("done: ", result->epochs_done, " epochs, ", result->global_step, " steps, ",
                       result->skipped_steps, " skipped"));
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(kExitOk);
}

}  // namespace
}  // namespace trainctl::trainer

int main(int argc, char** argv) {
  // glibc hands the top of the heap back to the kernel after every step and
  // faults it in again on the next: bench/ddp measured 143,500 minor faults/s
  // and a 1-rank MLP step of 28 ms that drops to 19 ms (below PyTorch's 21)
  // with fixed thresholds. Keep freed memory for the next step, unless the
  // operator tuned malloc through the environment.
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 30);
  try {
    return trainctl::trainer::Main(argc, argv);
  } catch (const std::bad_alloc& e) {
    trainctl::trainer::FailOutOfMemory(e.what());
  } catch (const std::exception& e) {
    if (trainctl::trainer::IsOutOfMemoryText(e.what())) {
      std::string what = e.what();
      trainctl::trainer::FailOutOfMemory(what.substr(0, what.find('\n')));
    }
    std::string what = e.what();
    trainctl::trainer::Fail(trainctl::rankproto::ErrorKind::kExit, what.substr(0, what.find('\n')),
                            trainctl::trainer::kExitOther);
  }
}

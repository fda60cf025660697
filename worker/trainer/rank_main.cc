// trainctl-rank: one rank of a data-parallel training job, launched and
// supervised by trainctl-worker (see worker/protocol/rank_protocol.h for the
// contract).
//
//   trainctl-rank --config PATH | --config-fd N
//
// The daemon passes --config-fd: rank.conf opened by the daemon and
// inherited, so that the rank, running as --rank-user, needs no permission
// on the file (it holds the attempt's store secret; docs/security.md).
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
//
// Each numbered step is a function below; the status lines, exit codes,
// heartbeat thread and stop watcher are in rank_reporting.h.
#include <malloc.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "worker/dist/collective_probe.h"
#include "worker/dist/collectives.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/engine/model.h"
#include "worker/protocol/rank_protocol.h"
#include "worker/trainer/checkpoint.h"
#include "worker/trainer/datasets.h"
#include "worker/trainer/rank_config.h"
#include "worker/trainer/rank_reporting.h"
#include "worker/trainer/step_timeline.h"
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

using rank::Fail;
using rank::FailStatus;
using rank::kExitCollective;
using rank::kExitConfig;
using rank::kExitOk;
using rank::kExitOther;
using rank::kExitTerminated;
using rank::LogLine;
using rankproto::ErrorKind;

// Test hook: TRAINCTL_TEST_STEP_SLEEP_MS=N in the worker's environment makes
// its ranks sleep N ms in every optimizer step, counted as compute time
// (tests pace runs with it and make stragglers; docs/failures.md). It
// overrides run.debug.step_sleep_ms.
constexpr char kStepSleepEnv[] = "TRAINCTL_TEST_STEP_SLEEP_MS";

// Where the config comes from: a path, or an inherited fd (-1: none).
struct ConfigSource {
  std::string path;
  int fd = -1;
};

// --config PATH or --config-fd N; exits with usage on anything else.
ConfigSource ParseArgs(int argc, char** argv) {
  ConfigSource src;
  auto usage = [](const std::string& why) {
    std::cerr << "usage: trainctl-rank --config PATH | --config-fd N" << why << std::endl;
    std::_Exit(kExitConfig);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string fd_text;
    if (a == "--config" && i + 1 < argc) {
      src.path = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      src.path = a.substr(9);
    } else if (a == "--config-fd" && i + 1 < argc) {
      fd_text = argv[++i];
    } else if (a.rfind("--config-fd=", 0) == 0) {
      fd_text = a.substr(12);
    } else {
      usage(" (unknown argument '" + a + "')");
    }
    if (!fd_text.empty() && (!absl::SimpleAtoi(fd_text, &src.fd) || src.fd < 0)) {
      usage(" (--config-fd: not an fd: '" + fd_text + "')");
    }
  }
  if (src.path.empty() == (src.fd < 0)) usage("");
  return src;
}

struct LoadedConfig {
  rankproto::FlatConfig flat;
  RankConfig cfg;
};

// 1. Config. Until run.status_fd is known, errors can only go to stderr.
LoadedConfig ReadConfig(const ConfigSource& src) {
  auto flat = src.fd >= 0 ? rankproto::ReadConfigFd(src.fd) : rankproto::ReadConfigFile(src.path);
  if (src.fd >= 0) ::close(src.fd);
  if (!flat.ok()) FailStatus(ErrorKind::kConfig, flat.status(), kExitConfig);
  if (auto fd = rankproto::GetInt(*flat, rankproto::run_keys::kStatusFd, -1); fd.ok()) {
    rank::DaemonPipe().set_fd(static_cast<int>(*fd));
  }
  auto parsed = ParseRankConfig(*flat);
  if (!parsed.ok()) FailStatus(ErrorKind::kConfig, parsed.status(), kExitConfig);
  return LoadedConfig{std::move(flat).value(), std::move(parsed).value()};
}

// LibTorch's threads and seed, and the rank's device.
c10::Device StartTorch(const RankConfig& cfg) {
  const RunOptions& run = cfg.run;
  torch::set_num_threads(run.num_threads);
  torch::manual_seed(cfg.training.data.seed);
  c10::Device device(c10::kCPU);
  if (run.device == "cuda") {
    if (!torch::cuda::is_available()) {
      Fail(ErrorKind::kConfig,
           "run.device: cuda, but this LibTorch has no CUDA or no GPU is visible", kExitConfig);
    }
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(run.cuda_device));
  }
  LogLine(absl::StrCat("trainctl-rank: rank ", run.rank, "/", run.world_size, " on ", device.str(),
                       ", backend ", run.backend.empty() ? "none" : run.backend, ", torch threads ",
                       run.num_threads));
  for (const std::string& note : cfg.notes) LogLine(note);
  return device;
}

int64_t ModelClasses(const engine::ModelOptions& m) {
  if (m.name == "mlp") return m.mlp.output_dim;
  if (m.name == "cnn") return m.cnn.classes;
  return 0;  // TorchScript: the module decides; labels are not range-checked up front
}

struct DataAndModel {
  std::shared_ptr<const engine::Dataset> train;
  std::shared_ptr<const engine::Dataset> eval;  // may be null
  std::shared_ptr<engine::Model> model;
};

// 2. Data and model, and the checkpoint directory this rank writes to.
DataAndModel LoadDataAndModel(const RankConfig& cfg) {
  // Classification splits need integer labels: bounded by the model's classes
  // when it has a known head, any non-negative label for TorchScript modules.
  int64_t classes = 0;
  if (cfg.training.loss == LossKind::kCrossEntropy) {
    classes = ModelClasses(cfg.model);
    if (classes == 0) classes = int64_t{1} << 30;
  }
  DataAndModel out;
  auto train = LoadDataset(cfg.train, classes);
  if (!train.ok()) FailStatus(ErrorKind::kData, train.status(), kExitConfig);
  out.train = *train;
  if (cfg.eval.has_value()) {
    auto e = LoadDataset(*cfg.eval, classes);
    if (!e.ok()) FailStatus(ErrorKind::kData, e.status(), kExitConfig);
    out.eval = *e;
  }
  auto model = engine::CreateModel(cfg.model);
  if (!model.ok())
    Fail(ErrorKind::kConfig, absl::StrCat("model: ", model.status().message()), kExitConfig);
  out.model = std::move(model).value();
  // Resume point: the coordinator's record, the same on every rank (rank 0
  // reads the file and broadcasts it). Nothing is picked from a directory.
  const CheckpointOptions& ck = cfg.training.checkpoint;
  if (ck.writer && !ck.dir.empty()) {
    absl::Status dir_ok = CheckCheckpointDir(ck.dir);
    if (!dir_ok.ok()) FailStatus(ErrorKind::kConfig, dir_ok, kExitConfig);
  }
  return out;
}

// The host this rank's Gloo device binds to and advertises to its peers.
[[maybe_unused]] std::string GlooBindHost(const rankproto::FlatConfig& flat,
                                          const RunOptions& run) {
  auto it = flat.find(rankproto::run_keys::kAdvertiseHost);
  if (it != flat.end() && !it->second.empty()) return it->second;
  std::string host;
  uint16_t port = 0;
  if (run.rank == 0 || !dist::RendezvousStore::ParseAddress(run.store_address, &host, &port).ok() ||
      host == "127.0.0.1" || host == "localhost" || host == "::1") {
    return "127.0.0.1";
  }
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  return name;
}

[[maybe_unused]] absl::StatusOr<std::string> HexDecode(const std::string& hex) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      char c = hex[i + j];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        return absl::InvalidArgumentError(absl::StrCat("bad hex digit '", std::string(1, c), "'"));
      v = v * 16 + d;
    }
    out.push_back(static_cast<char>(v));
  }
  return out;
}

// 3a. Gloo: rank 0 hosts the store and reports "rendezvous HOST:PORT";
// the others dial run.store_address.
std::shared_ptr<dist::Collectives> ConnectGloo([[maybe_unused]] const rankproto::FlatConfig& flat,
                                               [[maybe_unused]] const RunOptions& run) {
#if TRAINCTL_HAVE_GLOO
  const absl::Duration timeout = absl::Seconds(run.timeout_s);
  auto store =
      run.rank == 0
          ? dist::RendezvousStore::Host(run.advertise_host, static_cast<uint16_t>(run.store_port),
                                        timeout, run.store_secret)
          : dist::RendezvousStore::Connect(run.store_address, timeout, run.store_secret);
  if (!store.ok()) FailStatus(ErrorKind::kRendezvous, store.status(), kExitCollective);
  if (run.rank == 0) rank::DaemonPipe().Send(rankproto::FormatRendezvous((*store)->address()));
  dist::GlooOptions go;
  go.rank = run.rank;
  go.world_size = run.world_size;
  go.bind_host = GlooBindHost(flat, run);
  go.timeout = timeout;
  go.key_prefix = absl::StrCat("trainctl/", run.job_id, "/", run.attempt, "/gloo/");
  // TRAINCTL_SHM=0 in the worker's environment keeps single-host jobs on
  // Gloo's TCP transport (e.g. where /dev/shm is unusable).
  const char* shm_env = std::getenv("TRAINCTL_SHM");
  go.all_ranks_local = run.local_world_size == run.world_size &&
                       !(shm_env != nullptr && std::string(shm_env) == "0");
  auto c = dist::CreateGlooCollectives(go, *store);
  if (!c.ok()) FailStatus(ErrorKind::kRendezvous, c.status(), kExitCollective);
  std::shared_ptr<dist::Collectives> comm = *c;
  if (run.rank == 0) {
    LogLine(absl::StrCat("collectives: ", comm->name(), " (", run.world_size, " ranks",
                         go.all_ranks_local && comm->name() == "gloo"
                             ? "; shared memory unavailable, all-reduce over TCP)"
                             : ")"));
  }
  return comm;
#else
  Fail(ErrorKind::kConfig, "run.backend: gloo, but this trainctl-rank was built without Gloo",
       kExitConfig);
#endif
}

// 3b. NCCL: the communicator from the unique ID the coordinator handed out.
std::shared_ptr<dist::Collectives> ConnectNccl([[maybe_unused]] const RunOptions& run) {
#if TRAINCTL_HAVE_NCCL && TRAINCTL_NCCL_TORCH_CUDA
  auto id = HexDecode(run.nccl_unique_id_hex);
  if (!id.ok() || id->size() != dist::kNcclUniqueIdBytes) {
    Fail(ErrorKind::kConfig,
         absl::StrCat(rankproto::run_keys::kNcclUniqueId, ": not ", dist::kNcclUniqueIdBytes,
                      " hex-encoded bytes"),
         kExitConfig);
  }
  dist::NcclOptions no;
  no.rank = run.rank;
  no.world_size = run.world_size;
  no.device = run.cuda_device;
  no.unique_id = *id;
  no.timeout = absl::Seconds(run.timeout_s);
  auto c = dist::CreateNcclCollectives(no);
  if (!c.ok()) FailStatus(ErrorKind::kRendezvous, c.status(), kExitCollective);
  (*c)->UseCurrentTorchStream();
  return *c;
#else
  Fail(ErrorKind::kConfig,
       "run.backend: nccl, but this trainctl-rank was built without NCCL and LibTorch-CUDA "
       "(TRAINCTL_NCCL_TORCH_CUDA)",
       kExitConfig);
#endif
}

// 3. Rendezvous and communicator (null without a backend: world size 1).
std::shared_ptr<dist::Collectives> ConnectCollectives(const rankproto::FlatConfig& flat,
                                                      const RunOptions& run) {
  if (run.backend == "gloo") return ConnectGloo(flat, run);
  if (run.backend == "nccl") return ConnectNccl(run);
  return nullptr;
}

// The per-step sleep test hook: the environment's, else the config's.
int64_t StepSleepMs(const RunOptions& run) {
  int64_t ms = run.debug_step_sleep_ms;
  if (const char* env = std::getenv(kStepSleepEnv); env != nullptr) {
    int64_t v = 0;
    if (absl::SimpleAtoi(env, &v) && v >= 0 && v <= 60000) ms = v;
  }
  if (ms > 0) LogLine(absl::StrCat("test hook: sleeping ", ms, " ms of compute per step"));
  return ms;
}

// 4a. What the Trainer needs beyond the config's training options.
TrainerSetup MakeTrainerSetup(const RankConfig& cfg, c10::Device device,
                              std::shared_ptr<dist::CollectiveProbe> probe) {
  const RunOptions& run = cfg.run;
  const CheckpointOptions& ck = cfg.training.checkpoint;
  TrainerSetup setup;
  setup.options = cfg.training;
  setup.rank = run.rank;
  setup.world_size = run.world_size;
  setup.device = device;
  setup.manifest.job_id = run.job_id;
  setup.manifest.attempt = run.attempt;
  setup.manifest.spec_hash = ck.spec_hash;
  setup.manifest.writer = ck.writer_tag;
  setup.checkpoint_writer = ck.writer;
  setup.resume_from = ck.resume_from;
  setup.resume_checksum = ck.resume_checksum;
  setup.resume_job_id = ck.resume_job_id;
  if (!ck.resume_from.empty()) {
    LogLine(absl::StrCat("resuming from checkpoint ", ck.resume_from,
                         run.rank == 0 ? "" : " (read by rank 0, received by broadcast)"));
  }
  setup.stop = &rank::g_stop;
  setup.preempt_file = run.preempt_file;
  setup.skip_steps = run.skip_steps;
  if (!run.skip_steps.empty()) {
    LogLine(absl::StrCat("rolled back: skipping step(s) ", absl::StrJoin(run.skip_steps, ", ")));
  }
  setup.debug_step_sleep_ms = StepSleepMs(run);
  setup.probe = std::move(probe);
  // The comm timeline (docs/ddp.md): read once, here; off when unset.
  if (const char* prefix = std::getenv(StepTimeline::kEnv); prefix != nullptr && *prefix != 0) {
    setup.comm_timeline_prefix = prefix;
    LogLine(absl::StrCat("comm timeline: recording every step for ",
                         StepTimeline::PathFor(prefix, run.rank)));
  }
  if (const char* v = std::getenv("TRAINCTL_DDP_LAUNCH_AFTER_BACKWARD");
      v != nullptr && std::string(v) == "1") {
    setup.options.ddp.launch_after_backward = true;
    LogLine("launch_after_backward: every bucket's all-reduce starts after backward");
  }
  return setup;
}

// Rank 0 also writes the job's scalars as TensorBoard event files; null
// elsewhere or without run.tensorboard_dir.
std::shared_ptr<TensorBoardWriter> OpenTensorBoard(const rankproto::FlatConfig& flat,
                                                   const RunOptions& run) {
  const std::string dir = rankproto::GetString(flat, rankproto::run_keys::kTensorBoardDir, "");
  if (run.rank != 0 || dir.empty()) return nullptr;
  auto w = TensorBoardWriter::Open(dir);
  if (!w.ok()) FailStatus(ErrorKind::kConfig, w.status(), kExitConfig);
  LogLine(absl::StrCat("TensorBoard event file ", (*w)->path()));
  return std::move(w).value();
}

// Test hook: TRAINCTL_TEST_SAMPLE_LOG=DIR makes every rank append the
// sample indices of each optimizer step to DIR/<job>.a<attempt>.r<rank>.samples
// ("EPOCH GLOBAL_STEP i,i,..." per line), so end-to-end tests can check
// which samples a run trained on across restarts. Unset in production.
void AddSampleLog(const RunOptions& run, TrainerCallbacks* callbacks) {
  const char* dir = std::getenv("TRAINCTL_TEST_SAMPLE_LOG");
  if (dir == nullptr || *dir == '\0') return;
  auto out = std::make_shared<std::ofstream>(
      absl::StrCat(dir, "/", run.job_id, ".a", run.attempt, ".r", run.rank, ".samples"),
      std::ios::app);
  callbacks->on_step_samples = [out](int64_t epoch, int64_t step, const std::vector<int64_t>& idx) {
    *out << epoch << " " << step << " " << absl::StrJoin(idx, ",") << "\n";
    out->flush();
  };
}

void ReportCheckpoint(const WrittenCheckpoint& w, const TrainingPosition& p) {
  rankproto::CheckpointNote note;
  note.epochs_done = p.epochs_done;
  note.global_step = p.global_step;
  note.epoch_consumed = p.epoch_consumed;
  note.size_bytes = w.size_bytes;
  note.checksum = w.checksum;
  note.path = w.path;
  rank::DaemonPipe().Send(rankproto::FormatCheckpoint(note));
  LogLine(absl::StrCat("checkpoint ", w.path, " (", w.size_bytes, " bytes, ", w.checksum, ")"));
}

// 4b. Metrics, progress, logs and checkpoints go to the daemon's pipe.
TrainerCallbacks MakeCallbacks(const rankproto::FlatConfig& flat, const RunOptions& run,
                               rank::HeartbeatReporter& heartbeat) {
  TrainerCallbacks callbacks;
  std::shared_ptr<TensorBoardWriter> tensorboard = OpenTensorBoard(flat, run);
  callbacks.on_metric = [tensorboard](const rankproto::RankMetric& m) {
    rank::DaemonPipe().Send(rankproto::FormatMetric(m));
    if (tensorboard == nullptr) return;
    // A failed write (disk full) costs the plot, not the training.
    static bool warned = false;
    const int64_t step = int64_t{m.epoch} * m.steps_per_epoch + m.step;
    if (absl::Status s = tensorboard->Write(step, MetricScalars(m)); !s.ok() && !warned) {
      warned = true;
      LogLine(absl::StrCat("TensorBoard: ", s.message(), " (later failures are not logged)"));
    }
  };
  callbacks.on_progress = [&heartbeat](int32_t epoch, int64_t step) {
    heartbeat.Progress(epoch, step);
  };
  callbacks.on_log = [](const std::string& line) { LogLine(line); };
  AddSampleLog(run, &callbacks);
  callbacks.on_checkpoint = ReportCheckpoint;
  return callbacks;
}

// Test hook (run.debug.address_space_limit_mb): caps the address space at
// what the process maps now plus this much, so a test can make a too-large
// batch fail like a memory-limited host would. 0 = no cap.
absl::Status LimitAddressSpace(int64_t extra_mb) {
  if (extra_mb <= 0) return absl::OkStatus();
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr)
    return absl::InternalError("run.debug.address_space_limit_mb: cannot read /proc/self/statm");
  unsigned long pages = 0;
  const int n = std::fscanf(f, "%lu", &pages);
  std::fclose(f);
  if (n != 1) return absl::InternalError("run.debug.address_space_limit_mb: bad /proc/self/statm");
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                       static_cast<rlim_t>(extra_mb) * (1 << 20);
  struct rlimit rl {
    limit, limit
  };
  if (setrlimit(RLIMIT_AS, &rl) != 0) {
    return absl::InternalError(
        absl::StrCat("run.debug.address_space_limit_mb: setrlimit: ", std::strerror(errno)));
  }
  LogLine(absl::StrCat("address space capped at ", limit >> 20,
                       " MiB (run.debug.address_space_limit_mb)"));
  return absl::OkStatus();
}

void ApplyAddressSpaceLimit(const rankproto::FlatConfig& flat) {
  auto limit_mb = rankproto::GetInt(flat, "run.debug.address_space_limit_mb", 0);
  if (!limit_mb.ok()) FailStatus(ErrorKind::kConfig, limit_mb.status(), kExitConfig);
  if (absl::Status s = LimitAddressSpace(*limit_mb); !s.ok())
    FailStatus(ErrorKind::kConfig, s, kExitConfig);
}

// A Trainer error as the rank's error line and exit code. `trainer` (may
// be null) says at which step a NaN happened.
[[noreturn]] void FailTraining(const absl::Status& s, const Trainer* trainer) {
  if (rank::g_stop.load()) {
    Fail(ErrorKind::kExit,
         absl::StrCat("stopped by signal ", rank::g_signal.load(), ": ", s.message()),
         kExitTerminated);
  }
  if (rank::IsOutOfMemoryText(s.message())) rank::FailOutOfMemory(s.message());
  switch (FailureKindOf(s)) {
    case FailureKind::kNan:
      Fail(ErrorKind::kNan, std::string(s.message()), kExitOther,
           trainer != nullptr ? std::max<int64_t>(trainer->nan_step(), 0) : 0);
    case FailureKind::kConfig:
      FailStatus(ErrorKind::kConfig, s, kExitConfig);
    case FailureKind::kCollective:
      FailStatus(ErrorKind::kCollective, s, kExitCollective);
    case FailureKind::kStopped:
      FailStatus(ErrorKind::kExit, s, kExitTerminated);
    case FailureKind::kDiskFull:
      FailStatus(ErrorKind::kDiskFull, s, kExitOther);
    case FailureKind::kResume:
      FailStatus(ErrorKind::kResume, s, kExitConfig);
    case FailureKind::kOther:
      FailStatus(ErrorKind::kExit, s, kExitOther);
  }
  FailStatus(ErrorKind::kExit, s, kExitOther);
}

// 5. Train; on success report the exported model and exit 0.
[[noreturn]] void Train(Trainer& trainer, const RunOptions& run) {
  auto result = trainer.Run();
  if (!result.ok()) FailTraining(result.status(), &trainer);
  if (run.rank == 0 && !result->exported_model.empty()) {
    rank::DaemonPipe().Send(rankproto::FormatModel(result->exported_model));
  }
  LogLine(absl::StrCat("done: ", result->epochs_done, " epochs, ", result->global_step, " steps, ",
                       result->skipped_steps, " skipped"));
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(kExitOk);
}

int Main(int argc, char** argv) {
  rank::InstallStopHandlers();
  const LoadedConfig loaded = ReadConfig(ParseArgs(argc, argv));  // 1
  const RankConfig& cfg = loaded.cfg;
  rank::StopWatcher watcher;
  const c10::Device device = StartTorch(cfg);
  rank::SetRankForErrors(cfg.run.rank);
  const DataAndModel data = LoadDataAndModel(cfg);  // 2

  std::shared_ptr<dist::Collectives> comm = ConnectCollectives(loaded.flat, cfg.run);  // 3
  watcher.set_comm(comm);
  // Every collective is numbered and every wait visible to the heartbeat.
  auto probe = std::make_shared<dist::CollectiveProbe>();
  if (comm != nullptr) comm = std::make_shared<dist::TrackedCollectives>(comm, probe);
  rank::HeartbeatReporter heartbeat(probe);

  // 4. Trainer (loads the checkpoint, broadcasts rank 0's parameters).
  const TrainerSetup setup = MakeTrainerSetup(cfg, device, probe);
  const TrainerCallbacks callbacks = MakeCallbacks(loaded.flat, cfg.run, heartbeat);
  ApplyAddressSpaceLimit(loaded.flat);
  auto trainer = Trainer::Create(setup, data.model, data.train, data.eval, comm, callbacks);
  if (!trainer.ok()) FailTraining(trainer.status(), nullptr);
  LogLine(absl::StrCat("training ", cfg.training.epochs, " epochs of ",
                       (*trainer)->steps_per_epoch(), " steps from epoch ",
                       (*trainer)->start_epoch()));
  rank::DaemonPipe().Send(rankproto::FormatReady());
  Train(**trainer, cfg.run);  // 5
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
    trainctl::trainer::rank::FailOutOfMemory(e.what());
  } catch (const std::exception& e) {
    namespace rank = trainctl::trainer::rank;
    const std::string what = e.what();
    const std::string first_line = what.substr(0, what.find('\n'));
    if (rank::IsOutOfMemoryText(what)) rank::FailOutOfMemory(first_line);
    rank::Fail(trainctl::rankproto::ErrorKind::kExit, first_line, rank::kExitOther);
  }
}

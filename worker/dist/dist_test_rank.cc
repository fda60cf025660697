// One rank of a multi-process test (see multiprocess_test_support.h): connects to its
// peers through the rendezvous store and the Gloo engine, runs one scenario,
// writes what the parent test checks into --dir, and exits 0 when its own
// expectations held (non-zero with a message on stderr otherwise).
//
// Scenarios:
//   collectives  all-reduce/broadcast/barrier results across dtypes
//   peer_exit    rank 1 exits after connecting; rank 0's all-reduce must fail
//   peer_stall   rank 1 stops participating; rank 0 must time out
//   abort        rank 1 stalls; rank 0 aborts its pending all-reduce
//   replicas     all-reduces of inputs whose float sum depends on the order
//                of the ranks; writes every rank's inputs and outputs
//                (--shared=1: the buffers in shared blocks; replicas16 too)
//   shared_mismatch  rank 0 reduces a shared block, the others private
//                memory: every rank must get an error
//   train        DDP training of a small MLP with the GradientBucketer
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/dist/multiprocess_test_support.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/dist/tensor_collectives.h"
#include "worker/torch_compat.h"

namespace td = trainctl::dist;
using Clock = std::chrono::steady_clock;

namespace {

class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) continue;
      auto eq = a.find('=');
      kv_[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
          eq == std::string::npos ? "1" : a.substr(eq + 1);
    }
  }
  std::string Str(const std::string& k, const std::string& def = "") const {
    auto it = kv_.find(k);
    return it == kv_.end() ? def : it->second;
  }
  int64_t Int(const std::string& k, int64_t def) const {
    int64_t v = def;
    auto it = kv_.find(k);
    if (it != kv_.end() && !absl::SimpleAtoi(it->second, &v)) v = def;
    return v;
  }
  double Dbl(const std::string& k, double def) const {
    double v = def;
    auto it = kv_.find(k);
    if (it != kv_.end() && !absl::SimpleAtod(it->second, &v)) v = def;
    return v;
  }

 private:
  std::map<std::string, std::string> kv_;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "FAIL: %s\n", msg.c_str());
  std::fflush(stderr);
  return 1;
}

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Ctx {
  int rank = 0;
  int world = 1;
  std::string dir;
  absl::Duration timeout;
  std::shared_ptr<td::Collectives> comm;
  bool shared = false;  // --shared: replicas' buffers in shared blocks
};

absl::Status Connect(const Args& a, Ctx* ctx) {
  ctx->rank = static_cast<int>(a.Int("rank", 0));
  ctx->world = static_cast<int>(a.Int("world", 1));
  ctx->dir = a.Str("dir");
  ctx->timeout = absl::Milliseconds(a.Int("timeout_ms", 10000));
  ctx->shared = a.Int("shared", 0) != 0;
  // Meeting at the store waits for the slowest process start (LibTorch
  // loads for seconds on a busy machine); only collectives get `timeout`.
  const absl::Duration connect_timeout =
      std::max(ctx->timeout, absl::Milliseconds(a.Int("connect_timeout_ms", 30000)));
  absl::StatusOr<std::shared_ptr<td::RendezvousStore>> store;
  if (ctx->rank == 0) {
    store = td::RendezvousStore::Host("127.0.0.1", 0, connect_timeout, a.Str("store_secret"));
    if (!store.ok()) return store.status();
    // What the coordinator would relay to the other ranks.
    td::testing::WriteFileAtomic(ctx->dir + "/store_address", (*store)->address());
  } else {
    store = td::RendezvousStore::Connect(a.Str("store"), connect_timeout, a.Str("store_secret"));
    if (!store.ok()) return store.status();
  }
  // Every rank is up before the engine's own (short) rendezvous starts.
  if (absl::Status s = (*store)->Set(absl::StrCat("up/", ctx->rank), "1"); !s.ok()) return s;
  for (int r = 0; r < ctx->world; ++r) {
    if (absl::StatusOr<std::string> v = (*store)->Get(absl::StrCat("up/", r)); !v.ok())
      return v.status();
  }
  td::GlooOptions o;
  o.rank = ctx->rank;
  o.world_size = ctx->world;
  o.timeout = ctx->timeout;
  o.key_prefix = "test/attempt0/";
  // Every test rank runs on this host: shared memory unless --shm=0.
  o.all_ranks_local = a.Int("shm", 1) != 0;
  o.shm_slot_bytes = static_cast<size_t>(a.Int("shm_slot_bytes", 8 << 20));
  auto comm = td::CreateGlooCollectives(o, *store);
  if (!comm.ok()) return comm.status();
  ctx->comm = *comm;
  // Shared memory is expected wherever /dev/shm is writable (a machine
  // without it must fall back to TCP, which the check then expects).
  const bool want_shm = ctx->world > 1 && a.Int("shm", 1) != 0 && access("/dev/shm", W_OK) == 0;
  if ((ctx->comm->name() == "gloo+shm") != want_shm) {
    return absl::InternalError(
        absl::StrCat("engine is ", ctx->comm->name(), ", expected shared memory: ", want_shm));
  }
  return absl::OkStatus();
}

// A stalled peer: alive, connected, but issuing nothing until rank 0 releases it.
void StallUntilReleased(const Ctx& ctx, int max_seconds) {
  const auto end = Clock::now() + std::chrono::seconds(max_seconds);
  while (Clock::now() < end && access((ctx.dir + "/release").c_str(), F_OK) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Release(const Ctx& ctx) { td::testing::WriteFileAtomic(ctx.dir + "/release", "1"); }

int RunCollectives(Ctx& ctx) {
  const int w = ctx.world;
  const double expected_sum = w * (w + 1) / 2.0;
  for (auto type : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt,
                    torch::kLong, torch::kByte}) {
    auto t = torch::full({1000}, ctx.rank + 1, torch::TensorOptions().dtype(type));
    auto st = td::AllReduceSum(*ctx.comm, t)->Wait();
    if (!st.ok()) return Fail(st.ToString());
    if (!torch::all(t.to(torch::kDouble) == expected_sum).item<bool>()) {
      return Fail(absl::StrCat("allreduce ", c10::toString(type), " got ", t[0].item<double>(),
                               " want ", expected_sum));
    }
  }
  // Several collectives in flight at once complete in issue order.
  std::vector<torch::Tensor> ts;
  std::vector<std::shared_ptr<td::CollectiveWork>> works;
  for (int i = 0; i < 8; ++i) {
    ts.push_back(torch::arange(1 + i * 5000, torch::kFloat) * (ctx.rank + 1));
    works.push_back(td::AllReduceSum(*ctx.comm, ts.back()));
  }
  for (int i = 0; i < 8; ++i) {
    auto st = works[i]->Wait();
    if (!st.ok()) return Fail(st.ToString());
    auto want = torch::arange(1 + i * 5000, torch::kFloat) * static_cast<float>(expected_sum);
    if (!torch::equal(ts[i], want)) return Fail(absl::StrCat("async allreduce ", i, " wrong"));
  }
  // Waiting for the last of several first: the waiter may run queued work
  // itself (GlooCore::Help), the earlier ones before it, in issue order, so
  // all are done and right when it returns; mixed with a broadcast, which
  // only the engine thread runs.
  {
    std::vector<torch::Tensor> xs;
    std::vector<std::shared_ptr<td::CollectiveWork>> ws;
    for (int i = 0; i < 6; ++i) {
      xs.push_back(torch::full({i % 2 ? 12 : 70000}, ctx.rank + 1.0 + i, torch::kFloat));
      ws.push_back(i == 3 ? td::Broadcast(*ctx.comm, xs.back(), 0)
                          : td::AllReduceSum(*ctx.comm, xs.back()));
    }
    if (auto st = ws.back()->Wait(); !st.ok()) return Fail(st.ToString());
    for (int i = 0; i < 6; ++i) {
      if (auto st = ws[i]->Wait(); !st.ok()) return Fail(st.ToString());
      const double want = i == 3 ? 1.0 + i : expected_sum + w * i;
      if (!torch::all(xs[i] == static_cast<float>(want)).item<bool>()) {
        return Fail(absl::StrCat("waited-last collective ", i, " got ", xs[i][0].item<double>(),
                                 " want ", want));
      }
    }
  }
  // More distinct small shapes than the small-message path keeps rings for
  // (32), twice over, so shapes are evicted and rebuilt on every rank in the
  // same order; float64 too.
  for (int round = 0; round < 2; ++round) {
    for (int n = 1; n <= 40; ++n) {
      auto type = n % 2 ? torch::kFloat : torch::kDouble;
      auto t = torch::arange(n, torch::TensorOptions().dtype(type)) + ctx.rank;
      if (auto st = td::AllReduceSum(*ctx.comm, t)->Wait(); !st.ok()) return Fail(st.ToString());
      auto want = torch::arange(n, torch::TensorOptions().dtype(type)) * w + (w - 1) * w / 2;
      if (!torch::equal(t, want)) return Fail(absl::StrCat("small allreduce of ", n, " wrong"));
    }
  }
  // Broadcast from the last rank.
  auto b = torch::full({37}, ctx.rank * 10.0, torch::kFloat);
  if (auto st = td::Broadcast(*ctx.comm, b, w - 1)->Wait(); !st.ok()) return Fail(st.ToString());
  if (!torch::all(b == (w - 1) * 10.0).item<bool>()) return Fail("broadcast wrong");
  // Coalesced broadcast of mixed types and shapes from rank 0.
  std::vector<torch::Tensor> state = {torch::full({3, 4}, ctx.rank + 0.5),
                                      torch::full({5}, ctx.rank + 7, torch::kLong),
                                      torch::full({2, 2}, ctx.rank + 1.5, torch::kDouble)};
  if (auto st = td::BroadcastCoalesced(*ctx.comm, state, 0); !st.ok()) return Fail(st.ToString());
  if (state[0][0][0].item<float>() != 0.5f || state[1][4].item<int64_t>() != 7 ||
      state[2][1][1].item<double>() != 1.5) {
    return Fail("coalesced broadcast wrong");
  }
  if (auto st = ctx.comm->Barrier(); !st.ok()) return Fail(st.ToString());
  // Bad input is an error value, not a crash.
  auto strided = torch::zeros({4, 4}).t();
  if (td::AllReduceSum(*ctx.comm, strided)->Wait().code() != absl::StatusCode::kInvalidArgument) {
    return Fail("non-contiguous tensor accepted");
  }
  if (ctx.comm->Broadcast(td::CommBuffer{}, w)->Wait().code() !=
      absl::StatusCode::kInvalidArgument) {
    return Fail("bad broadcast root accepted");
  }
  td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/ok_r", ctx.rank), "ok");
  return 0;
}

// The tensors' bytes, back to back.
std::string Bytes(const std::vector<torch::Tensor>& tensors) {
  std::string out;
  for (const auto& t : tensors) {
    auto c = t.detach().contiguous();
    out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  }
  return out;
}

// Rank r's input: magnitudes from 1e8 down to 3e-5 with both signs, so that
// a sum in another order of the ranks rounds differently.
torch::Tensor ReplicaInput(const td::testing::ReplicaCase& c, int rank, int round) {
  static constexpr double kMagnitudes[] = {1e8, 1.0, -1e8, 3e-5, -7.0, 2.5e3, 1e-3};
  auto t = torch::empty({c.count}, torch::kDouble);
  auto* v = t.data_ptr<double>();
  for (int64_t i = 0; i < c.count; ++i) {
    const double m = kMagnitudes[(i * 5 + rank * 3 + round) % 7];
    v[i] = m * (1.0 + static_cast<double>((i * 7919 + rank * 104729 + round * 31) % 1000) / 997.0);
  }
  return t.to(c.type == td::CommDataType::kFloat32 ? torch::kFloat : torch::kDouble);
}

// With --shared=1 (shared memory only): a copy of `t` in a block the engine
// all-reduces in place (Collectives::AllocateShared), 64 bytes into it so
// that an offset is exercised too. Otherwise `t`.
absl::StatusOr<torch::Tensor> MaybeShared(const Ctx& ctx, const torch::Tensor& t) {
  if (!ctx.shared) return t;
  constexpr size_t kOffset = 64;
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  TRAINCTL_ASSIGN_OR_RETURN(std::shared_ptr<void> mem, ctx.comm->AllocateShared(bytes + kOffset));
  if (mem == nullptr) return absl::FailedPreconditionError("the engine gave no shared block");
  auto s = torch::from_blob(
      static_cast<char*>(mem.get()) + kOffset, t.sizes(), [mem](void*) mutable { mem.reset(); },
      t.options());
  s.copy_(t);
  return s;
}

int RunReplicas(Ctx& ctx) {
  for (int round = 0; round < td::testing::kReplicaRounds; ++round) {
    for (const td::testing::ReplicaCase& c : td::testing::kReplicaCases) {
      auto in = MaybeShared(ctx, ReplicaInput(c, ctx.rank, round));
      if (!in.ok()) return Fail(in.status().ToString());
      auto t = *in;
      const std::string tag = absl::StrCat(c.name, "_", round, "_r", ctx.rank);
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/in_", tag, ".bin"), Bytes({t}));
      if (auto st = td::AllReduceSum(*ctx.comm, t)->Wait(); !st.ok()) return Fail(st.ToString());
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/out_", tag, ".bin"), Bytes({t}));
    }
  }
  return 0;
}

// 16-bit all-reduces (the DDP comm hooks' buffers): per type, a large buffer
// (shared memory or Gloo's ring) and a small one, inputs within float16's
// range and differing per rank so that the summation order shows.
int RunReplicas16(Ctx& ctx) {
  static constexpr double kMagnitudes[] = {1.0, -7.0, 3e-3, 250.0, -0.5};
  for (auto type : {torch::kHalf, torch::kBFloat16}) {
    for (int64_t count : {int64_t{100003}, int64_t{1000}}) {
      auto t = torch::empty({count}, torch::kDouble);
      auto* v = t.data_ptr<double>();
      for (int64_t i = 0; i < count; ++i) {
        v[i] = kMagnitudes[(i * 3 + ctx.rank) % 5] *
               (1.0 + static_cast<double>((i * 7919 + ctx.rank * 104729) % 1000) / 997.0);
      }
      auto in = MaybeShared(ctx, t.to(type));
      if (!in.ok()) return Fail(in.status().ToString());
      t = *in;
      const std::string tag = absl::StrCat(c10::toString(type), "_", count, "_r", ctx.rank);
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/in_", tag, ".bin"), Bytes({t}));
      if (auto st = td::AllReduceSum(*ctx.comm, t)->Wait(); !st.ok()) return Fail(st.ToString());
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/out_", tag, ".bin"), Bytes({t}));
    }
  }
  return 0;
}

// Rank 0's view of a failing peer: the collective must fail within the
// timeout (plus slack), and the engine must stay failed afterwards.
int ExpectCollectiveFailure(Ctx& ctx, absl::StatusCode want) {
  auto t = torch::ones({1 << 16});
  const auto start = Clock::now();
  auto st = td::AllReduceSum(*ctx.comm, t)->Wait();
  const double ms = MsSince(start);
  Release(ctx);
  std::printf("rank 0: %s after %.0f ms\n", st.ToString().c_str(), ms);
  td::testing::WriteFileAtomic(ctx.dir + "/result",
                               absl::StrCat(absl::StatusCodeToString(st.code()), " ", ms));
  if (st.ok()) return Fail("allreduce with a dead peer succeeded");
  if (want != absl::StatusCode::kOk && st.code() != want) {
    return Fail(absl::StrCat("want ", absl::StatusCodeToString(want), ", got ", st.ToString()));
  }
  if (ms > absl::ToDoubleMilliseconds(ctx.timeout) + 3000)
    return Fail("took longer than the timeout");
  if (td::AllReduceSum(*ctx.comm, t)->Wait().ok()) return Fail("broken engine accepted more work");
  return 0;
}

// Rank 0 reduces a buffer in a shared block, the others the same count in
// private memory: every rank must fail with Internal, none may return a sum
// mixed from the two kinds of buffer, and the engine stays broken.
int RunSharedMismatch(Ctx& ctx) {
  auto t = torch::ones({5000});
  std::shared_ptr<void> mem;
  if (auto m = ctx.comm->AllocateShared(5000 * sizeof(float)); m.ok() && *m != nullptr) {
    mem = *m;
  } else {
    return Fail("no shared block");
  }
  if (ctx.rank == 0) {
    t = torch::from_blob(mem.get(), {5000}, torch::kFloat);
    t.fill_(1.0f);
  }
  auto st = td::AllReduceSum(*ctx.comm, t)->Wait();
  std::printf("rank %d: %s\n", ctx.rank, st.ToString().c_str());
  if (st.code() != absl::StatusCode::kInternal) {
    return Fail(absl::StrCat("mismatched buffers: want INTERNAL, got ", st.ToString()));
  }
  if (!torch::all(t == 1.0f).item<bool>()) return Fail("a mismatched all-reduce wrote a sum");
  if (td::AllReduceSum(*ctx.comm, t)->Wait().ok()) return Fail("broken engine accepted more work");
  td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/ok_r", ctx.rank), "ok");
  return 0;
}

int RunPeerExit(Ctx& ctx) {
  if (ctx.rank == 1) _exit(3);  // a crash: no clean shutdown
  return ExpectCollectiveFailure(ctx, absl::StatusCode::kOk);
}

int RunPeerStall(Ctx& ctx) {
  if (ctx.rank == 1) {
    StallUntilReleased(ctx, 30);
    return 0;
  }
  return ExpectCollectiveFailure(ctx, absl::StatusCode::kDeadlineExceeded);
}

int RunAbort(Ctx& ctx) {
  if (ctx.rank == 1) {
    StallUntilReleased(ctx, 30);
    return 0;
  }
  auto t = torch::ones({1 << 16});
  auto work = td::AllReduceSum(*ctx.comm, t);
  auto queued = td::AllReduceSum(*ctx.comm, t.clone());
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ctx.comm->Abort();
  });
  const auto start = Clock::now();
  auto st = work->Wait();
  const double wait_ms = MsSince(start);
  aborter.join();
  auto st2 = queued->Wait();
  const auto destroy_start = Clock::now();
  ctx.comm.reset();
  const double destroy_ms = MsSince(destroy_start);
  Release(ctx);
  std::printf("abort: %s after %.0f ms; queued: %s; engine destroyed in %.0f ms\n",
              st.ToString().c_str(), wait_ms, st2.ToString().c_str(), destroy_ms);
  td::testing::WriteFileAtomic(ctx.dir + "/result", absl::StrCat(wait_ms, " ", destroy_ms));
  if (st.code() != absl::StatusCode::kAborted) return Fail("in-flight work not aborted");
  if (st2.code() != absl::StatusCode::kAborted) return Fail("queued work not aborted");
  if (wait_ms > 3000) return Fail("Abort did not end the wait promptly");
  return 0;
}

// ---- DDP training ----

struct NetImpl : torch::nn::Module {
  NetImpl(int in, int hidden, int depth, int out, bool bn, bool extra) {
    for (int i = 0; i < depth; ++i) {
      layers.push_back(
          register_module(absl::StrCat("fc", i), torch::nn::Linear(i == 0 ? in : hidden, hidden)));
    }
    if (bn) norm = register_module("bn", torch::nn::BatchNorm1d(hidden));
    head = register_module("head", torch::nn::Linear(hidden, out));
    if (extra) side = register_module("extra", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = torch::relu(layers[i]->forward(x));
      if (i == 0 && norm) x = norm->forward(x);
    }
    auto y = head->forward(x);
    if (use_extra && side) y = y + side->forward(x);
    return y;
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::BatchNorm1d norm{nullptr};
  torch::nn::Linear head{nullptr};
  torch::nn::Linear side{nullptr};
};
TORCH_MODULE(Net);

// Parameters only: buffers (batch-norm statistics) are updated locally by
// each rank's forward and re-synchronised before the next one, as in DDP.
std::string StateBytes(Net& net) { return Bytes(net->parameters()); }

// RunTrain's arguments.
struct TrainArgs {
  static constexpr int kIn = 16, kOut = 4;
  int hidden, depth, steps, batch, micro;
  int state_every;  // parameters written after steps 0, k, 2k, ... and the last
  bool bn;
  std::string unused;  // none | all | rank0
  int die_step, die_rank;
  std::string die_mode;  // exit | stall
  bool expect_error;

  explicit TrainArgs(const Args& a)
      : hidden(static_cast<int>(a.Int("hidden", 32))),
        depth(static_cast<int>(a.Int("depth", 2))),
        steps(static_cast<int>(a.Int("steps", 3))),
        batch(static_cast<int>(a.Int("batch", 8))),
        micro(static_cast<int>(a.Int("micro", 1))),
        state_every(static_cast<int>(std::max<int64_t>(1, a.Int("state_every", 1)))),
        bn(a.Int("bn", 0) != 0),
        unused(a.Str("unused", "none")),
        die_step(static_cast<int>(a.Int("die_at_step", -1))),
        die_rank(static_cast<int>(a.Int("die_rank", -1))),
        die_mode(a.Str("die_mode", "exit")),
        expect_error(a.Int("expect_error", 0) != 0) {}
};

void WriteStepStats(std::ofstream& stats, int s, const td::StepCommStats& ss,
                    Clock::time_point backward_returned) {
  stats << "step " << s << " launches " << ss.launches.size() << " first_from_hook "
        << ss.launches[0].from_hook << " first_grads_ready " << ss.launches[0].grads_ready
        << " num_params " << ss.num_params << " first_before_backward_return_us "
        << std::chrono::duration_cast<std::chrono::microseconds>(backward_returned -
                                                                 ss.launches[0].time)
               .count()
        << " last_from_hook " << ss.launches.back().from_hook << " exposed_comm_us "
        << absl::ToInt64Microseconds(ss.exposed_comm) << " unused " << ss.unused_params
        << " powersgd " << ss.powersgd << "\n";
}

// Step s's micro-batches over this rank's shard of the global batch (x, y):
// rank r's rows are [r*micro*batch, (r+1)*micro*batch). Returns the
// bucketer's error, if any; a broken expectation goes to *broken.
absl::Status StepMicroBatches(const TrainArgs& t, const Ctx& ctx, Net& net,
                              td::GradientBucketer& ddp, int s, const torch::Tensor& x,
                              const torch::Tensor& y, std::ofstream& stats, std::string* broken) {
  for (int m = 0; m < t.micro; ++m) {
    const bool last = m == t.micro - 1;
    std::optional<td::GradientBucketer::NoSyncGuard> no_sync;
    if (!last) no_sync.emplace(&ddp);
    TRAINCTL_RETURN_IF_ERROR(ddp.PrepareForward());
    if (m == 0) {
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/buffers_r", ctx.rank, "_s", s, ".bin"),
                                   Bytes(net->buffers()));
    }
    const int64_t row0 = (static_cast<int64_t>(ctx.rank) * t.micro + m) * t.batch;
    const bool use_extra = t.unused == "rank0" && ctx.rank != 0;
    auto pred = net->forward(x.narrow(0, row0, t.batch), use_extra);
    auto loss = torch::mse_loss(pred, y.narrow(0, row0, t.batch)) / t.micro;
    TRAINCTL_RETURN_IF_ERROR(ddp.PrepareForBackward({loss}));
    loss.backward();
    const auto backward_returned = Clock::now();
    TRAINCTL_RETURN_IF_ERROR(ddp.FinalizeBackward());
    const auto ss = ddp.last_step_stats();
    if (!last) {
      if (ss.synced || !ss.launches.empty()) {
        *broken = "no_sync micro-step communicated";
        return absl::OkStatus();
      }
      continue;
    }
    if (!ss.synced || ss.launches.size() != ddp.buckets().size()) {
      *broken = "synced step did not launch every bucket";
      return absl::OkStatus();
    }
    WriteStepStats(stats, s, ss, backward_returned);
  }
  return absl::OkStatus();
}

// A step's collective error: recorded for the test (error_r<rank>), then
// success when the test expected it.
int StepFailed(const TrainArgs& t, Ctx& ctx, int s, const absl::Status& st,
               Clock::time_point step_start) {
  const double ms = MsSince(step_start);
  Release(ctx);
  td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/error_r", ctx.rank),
                               absl::StrCat(ms, "\n", st.ToString()));
  std::printf("rank %d step %d: %s after %.0f ms\n", ctx.rank, s, st.ToString().c_str(), ms);
  return t.expect_error ? 0 : Fail(st.ToString());
}

// The loss of the current parameters on a held-out batch, to
// loss_<tag>_r<rank>.txt (eval mode: batch norm uses its running statistics).
void WriteHeldOutLoss(const Ctx& ctx, Net& net, bool linear, const torch::Tensor& w_true,
                      const char* tag) {
  torch::NoGradGuard no_grad;
  const bool was_training = net->is_training();
  net->eval();
  torch::manual_seed(999);
  auto x = torch::randn({256, TrainArgs::kIn});
  auto y = linear ? x.mm(w_true) : torch::randn({256, TrainArgs::kOut});
  const double loss = torch::mse_loss(net->forward(x, false), y).item<double>();
  td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/loss_", tag, "_r", ctx.rank, ".txt"),
                               absl::StrCat(loss, "\n"));
  net->train(was_training);
}

int RunTrain(const Args& a, Ctx& ctx) {
  const TrainArgs t(a);
  // Ranks other than 0 start from different weights: the constructor's
  // broadcast must make them equal.
  torch::manual_seed(a.Int("init_seed", 1) + 1000 * ctx.rank);
  Net net(TrainArgs::kIn, t.hidden, t.depth, TrainArgs::kOut, t.bn, t.unused != "none");

  td::GradientBucketerOptions opts;
  opts.bucket_cap_mb = a.Dbl("bucket_cap_mb", 25.0);
  opts.first_bucket_bytes = static_cast<size_t>(a.Int("first_bucket_bytes", 1 << 20));
  opts.find_unused_parameters = a.Int("find_unused", 0) != 0;
  opts.broadcast_buffers = a.Int("broadcast_buffers", 1) != 0;
  opts.gradient_as_bucket_view = a.Int("bucket_view", 0) != 0;
  opts.launch_after_backward = a.Int("launch_after_backward", 0) != 0;
  auto hook = td::ParseCommHook(a.Str("comm_hook", "none"));
  if (!hook.ok()) return Fail(hook.status().ToString());
  opts.comm_hook = *hook;
  opts.powersgd.rank = a.Int("powersgd_rank", 1);
  opts.powersgd.start_iter = a.Int("powersgd_start_iter", 1000);
  opts.powersgd.min_compression_rate = a.Dbl("powersgd_min_rate", 2.0);
  opts.powersgd.use_error_feedback = a.Int("powersgd_error_feedback", 1) != 0;
  opts.powersgd.warm_start = a.Int("powersgd_warm_start", 1) != 0;
  auto ddp_or = td::GradientBucketer::Create(*net, ctx.comm, opts);
  if (!ddp_or.ok()) return Fail(ddp_or.status().ToString());
  auto& ddp = *ddp_or;
  // Over shared memory every bucket lives in a shared block, which the
  // engine reduces in place; over TCP none does.
  const bool want_shared = ctx.comm->name() == "gloo+shm";
  for (size_t b = 0; b < ddp->buckets().size(); ++b) {
    if (ddp->buckets()[b].shared != want_shared) {
      return Fail(absl::StrCat("bucket ", b, " shared: ", ddp->buckets()[b].shared, ", engine ",
                               ctx.comm->name()));
    }
  }
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(a.Dbl("lr", 0.1)));
  td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/state_r", ctx.rank, "_init.bin"),
                               StateBytes(net));

  std::ofstream stats(absl::StrCat(ctx.dir, "/stats_r", ctx.rank, ".txt"));
  stats << "num_buckets " << ddp->buckets().size() << " num_params "
        << ddp->parameter_names().size() << "\n";
  // task=linear: targets are a fixed linear map of the inputs, so the loss
  // falls and a final loss means something; the default targets are noise.
  const bool linear = a.Str("task", "noise") == "linear";
  torch::manual_seed(4242);
  const auto w_true = torch::randn({TrainArgs::kIn, TrainArgs::kOut});
  WriteHeldOutLoss(ctx, net, linear, w_true, "init");
  for (int s = 0; s < t.steps; ++s) {
    if (s == t.die_step && ctx.rank == t.die_rank) {
      if (t.die_mode == "exit") _exit(3);
      StallUntilReleased(ctx, 30);
      return 0;
    }
    const auto step_start = Clock::now();
    torch::manual_seed(a.Int("data_seed", 7) * 1000 + s);
    const int64_t rows = static_cast<int64_t>(ctx.world) * t.micro * t.batch;
    auto x = torch::randn({rows, TrainArgs::kIn});
    auto y = linear ? x.mm(w_true) : torch::randn({rows, TrainArgs::kOut});
    std::string broken;
    const absl::Status st = StepMicroBatches(t, ctx, net, *ddp, s, x, y, stats, &broken);
    if (!broken.empty()) return Fail(broken);
    if (!st.ok()) return StepFailed(t, ctx, s, st, step_start);
    if (t.unused != "none" && opts.find_unused_parameters) {
      // The extra layer: untouched (undefined) when no rank used it, the
      // average when some rank did.
      const bool defined = net->side->weight.grad().defined();
      if (defined != (t.unused == "rank0")) return Fail("unused parameter's gradient state wrong");
    }
    sgd.step();
    if (opts.gradient_as_bucket_view) {
      trainctl::torch_compat::ZeroGradInPlace(sgd);  // the bucket slices stay the gradients
    } else {
      sgd.zero_grad();
    }
    if (s % t.state_every == 0 || s == t.steps - 1) {
      td::testing::WriteFileAtomic(absl::StrCat(ctx.dir, "/state_r", ctx.rank, "_s", s, ".bin"),
                                   StateBytes(net));
    }
  }
  stats.flush();
  WriteHeldOutLoss(ctx, net, linear, w_true, "final");
  if (t.expect_error) return Fail("expected an error, training succeeded");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // As trainctl-rank does: a write to a dead peer's socket is an error the
  // engine reports, not a SIGPIPE that kills this rank (seen as exit -13 in
  // peer_exit under load).
  ::signal(SIGPIPE, SIG_IGN);
  Args a(argc, argv);
  torch::set_num_threads(1);
  Ctx ctx;
  if (auto st = Connect(a, &ctx); !st.ok()) return Fail("connect: " + st.ToString());
  const std::string scenario = a.Str("scenario");
  int rc;
  if (scenario == "collectives") {
    rc = RunCollectives(ctx);
  } else if (scenario == "peer_exit") {
    rc = RunPeerExit(ctx);
  } else if (scenario == "peer_stall") {
    rc = RunPeerStall(ctx);
  } else if (scenario == "abort") {
    rc = RunAbort(ctx);
  } else if (scenario == "shared_mismatch") {
    return RunSharedMismatch(ctx);
  } else if (scenario == "replicas") {
    rc = RunReplicas(ctx);
  } else if (scenario == "replicas16") {
    rc = RunReplicas16(ctx);
  } else if (scenario == "train") {
    rc = RunTrain(a, ctx);
  } else {
    rc = Fail("unknown scenario " + scenario);
  }
  std::fflush(stdout);
  // A healthy engine shuts down cleanly; a broken one may be stuck in Gloo.
  if (rc == 0 && scenario != "peer_exit" && scenario != "peer_stall" && scenario != "abort") {
    ctx.comm.reset();
  }
  // Skip static destructors of a possibly broken engine; the test only
  // needs the exit code and the files.
  _exit(rc);
}

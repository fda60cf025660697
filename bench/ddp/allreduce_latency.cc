// bench/ddp/allreduce_latency: where the time of a tiny Gloo all-reduce goes.
//
//   trainctl-bench-allreduce [--iters N] [--floats N] [--compute-us US] [--modes a,b,...]
//
// Starts itself a second time as rank 1 (rank 0 hosts the rendezvous store,
// as in a real job), then, for each mode, times N all-reduces of --floats
// floats, each after --compute-us microseconds of busy work (the forward and
// backward of a small model; 0 = back-to-back). Prints one line per mode
// with p50/p90/p99 of the all-reduce alone and the loop's time per iteration.
//
// Modes:
//   engine     trainctl's Gloo engine: AllReduceSum() then Wait() (queue thread
//              + the small-message sync mesh or gloo::allreduce), as for ranks
//              on several hosts
//   engine_shm the engine with every rank on this host (shared memory), the
//              buffer in private memory (copied through the slots)
//   engine_shm_block  the same with the buffer in a shared block the engine
//              reduces in place, as the trainer's DDP buckets are
//   direct     gloo::allreduce on the calling thread (device thread still
//              receives and hands over)
//   sync       gloo::AllreduceRing over pairs in sync mode: the calling thread
//              reads the socket itself (blocking recv)
//   sync_busy  the same, spinning on the socket instead of blocking
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/context.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <cstdlib>
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/rendezvous_store.h"

namespace td = trainctl::dist;
using SteadyClock = std::chrono::steady_clock;

namespace {

struct Flags {
  int rank = 0;
  std::string store;
  int iters = 3000;
  int floats = 12;
  int compute_us = 300;
  std::vector<std::string> modes = {"engine_shm", "engine", "direct", "sync", "sync_busy"};
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string k = a.substr(0, eq);
    std::string v = eq == std::string::npos ? (i + 1 < argc ? argv[++i] : "") : a.substr(eq + 1);
    bool ok = true;
    if (k == "--rank")
      ok = absl::SimpleAtoi(v, &f->rank);
    else if (k == "--store")
      f->store = v;
    else if (k == "--iters")
      ok = absl::SimpleAtoi(v, &f->iters) && f->iters > 0;
    else if (k == "--floats")
      ok = absl::SimpleAtoi(v, &f->floats) && f->floats > 0;
    else if (k == "--compute-us")
      ok = absl::SimpleAtoi(v, &f->compute_us) && f->compute_us >= 0;
    else if (k == "--modes")
      f->modes = absl::StrSplit(v, ',', absl::SkipEmpty());
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "bad flag %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

void Spin(int us) {
  const auto end = SteadyClock::now() + std::chrono::microseconds(us);
  volatile double x = 1.0;
  while (SteadyClock::now() < end) x = x * 1.0000001;
}

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void SumFloats(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

int Run(const Flags& f) {
  const absl::Duration timeout = absl::Seconds(30);
  // Rank 1 is this process's fork and gets the store's secret through its
  // environment.
  const char* env_secret = std::getenv("TRAINCTL_BENCH_STORE_SECRET");
  const std::string secret = f.rank == 0 ? td::NewRendezvousSecret()
                                         : std::string(env_secret != nullptr ? env_secret : "");
  absl::StatusOr<std::shared_ptr<td::RendezvousStore>> store =
      f.rank == 0 ? td::RendezvousStore::Host("127.0.0.1", 0, timeout, secret)
                  : td::RendezvousStore::Connect(f.store, timeout, secret);
  if (!store.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", f.rank, store.status().ToString().c_str());
    return 1;
  }
  trainctl::Subprocess child;
  if (f.rank == 0) {
    char self[4096] = {0};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    trainctl::SpawnOptions o;
    o.argv = {n > 0 ? std::string(self, static_cast<size_t>(n)) : "/proc/self/exe",
              "--rank=1",
              "--store=" + (*store)->address(),
              absl::StrCat("--iters=", f.iters),
              absl::StrCat("--floats=", f.floats),
              absl::StrCat("--compute-us=", f.compute_us),
              "--modes=" + absl::StrJoin(f.modes, ",")};
    o.env = {"TRAINCTL_BENCH_STORE_SECRET=" + secret};
    o.parent_death_signal = SIGKILL;
    absl::StatusOr<trainctl::Subprocess> c = trainctl::Subprocess::Spawn(o);
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 1;
    child = std::move(*c);
  }
  std::vector<float> data(static_cast<size_t>(f.floats), 1.0f);
  for (const std::string& mode : f.modes) {
    td::GlooOptions o;
    o.rank = f.rank;
    o.world_size = 2;
    o.timeout = timeout;
    o.key_prefix = "bench/" + mode + "/";
    std::shared_ptr<td::Collectives> engine;
    std::shared_ptr<gloo::Context> ctx;
    std::unique_ptr<gloo::AllreduceRing<float>> ring;
    float* buf = data.data();
    std::shared_ptr<void> block;
    if (mode == "engine" || mode == "engine_shm" || mode == "engine_shm_block") {
      o.all_ranks_local = mode != "engine";
      auto c = td::CreateGlooCollectives(o, *store);
      if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 1;
      engine = *c;
      if (mode == "engine_shm_block") {
        auto b = engine->AllocateShared(data.size() * sizeof(float));
        if (!b.ok() || *b == nullptr) return std::fprintf(stderr, "no shared block\n"), 1;
        block = *b;
        buf = static_cast<float*>(block.get());
        std::fill(buf, buf + data.size(), 1.0f);
      }
    } else {
      const bool sync = mode == "sync" || mode == "sync_busy";
      auto c = td::ConnectGlooContext(o, **store, sync, mode == "sync_busy");
      if (!c.ok()) return std::fprintf(stderr, "%s\n", c.status().ToString().c_str()), 1;
      ctx = *c;
      if (sync)
        ring = std::make_unique<gloo::AllreduceRing<float>>(ctx, std::vector<float*>{data.data()},
                                                            f.floats);
      else if (mode != "direct")
        return std::fprintf(stderr, "unknown mode %s\n", mode.c_str()), 2;
    }
    uint32_t tag = 0;
    auto once = [&] {
      if (engine) {
        td::CommBuffer b;
        b.data = buf;
        b.count = data.size();
        if (auto st = engine->AllReduceSum(b)->Wait(); !st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          std::exit(1);
        }
      } else if (ring) {
        ring->run();
      } else {
        gloo::AllreduceOptions opts(ctx);
        opts.setOutput<float>(data.data(), data.size());
        opts.setReduceFunction(&SumFloats);
        opts.setTag(tag++);
        gloo::allreduce(opts);
      }
      std::fill(buf, buf + data.size(), 1.0f);
    };
    for (int i = 0; i < 200; ++i) once();  // warm-up
    std::vector<double> lat;
    lat.reserve(static_cast<size_t>(f.iters));
    const auto start = SteadyClock::now();
    for (int i = 0; i < f.iters; ++i) {
      Spin(f.compute_us);
      const auto t0 = SteadyClock::now();
      once();
      lat.push_back(Ms(SteadyClock::now() - t0));
    }
    const double per_iter = Ms(SteadyClock::now() - start) / f.iters;
    if (f.rank == 0) {
      std::printf(
          "mode=%s floats=%d compute_us=%d iters=%d allreduce_p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f "
          "iter_ms=%.3f\n",
          mode.c_str(), f.floats, f.compute_us, f.iters, Pct(lat, 0.5), Pct(lat, 0.9),
          Pct(lat, 0.99), per_iter);
      std::fflush(stdout);
    }
  }
  if (child.running()) {
    const trainctl::ExitStatus status = child.Wait();
    return status.exited() ? status.code : 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  return Run(f);
}

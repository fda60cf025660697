// GradientBucketer: bucket layout and step bookkeeping in-process (one rank),
// and DDP semantics across real rank processes on loopback (Gloo).
#include "worker/dist/gradient_bucketer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/multiprocess_test_support.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/dist/single_rank_gloo.h"
#include "worker/torch_compat.h"

namespace trainctl::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::RankRun;
using testing::ReadFile;
using testing::RunRanks;
using testing::SingleRankGloo;

// ---------------------------------------------------------------------------
// One rank, in process.

struct ThreeLayers : torch::nn::Module {
  ThreeLayers() {
    fc0 = register_module("fc0", torch::nn::Linear(256, 256));
    fc1 = register_module("fc1", torch::nn::Linear(256, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 256));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2->forward(torch::relu(fc1->forward(torch::relu(fc0->forward(x)))));
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};

TEST(GradientBucketerTest, BucketsInReverseRegistrationOrderWithSmallFirstBucket) {
  ThreeLayers net;
  GradientBucketerOptions o;
  o.first_bucket_bytes = 100000;
  o.bucket_cap_mb = 0.3;  // 314572 bytes
  auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  const auto& names = (*ddp)->parameter_names();
  EXPECT_THAT(names, ElementsAre("fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias", "fc2.weight",
                                 "fc2.bias"));
  const auto& b = (*ddp)->buckets();
  ASSERT_EQ(b.size(), 2u);
  // First bucket: the last layer (first gradients to arrive), closed once it
  // reached 100000 bytes.
  EXPECT_THAT(b[0].params, ElementsAre(5, 4));
  EXPECT_EQ(b[0].size_limit, 100000u);
  EXPECT_EQ(b[0].bytes, (256u * 256 + 256) * 4);
  EXPECT_THAT(b[1].params, ElementsAre(3, 2, 1, 0));
  EXPECT_EQ(b[1].size_limit, 314572u);
}

TEST(GradientBucketerTest, DefaultsMatchPyTorch) {
  GradientBucketerOptions o;
  EXPECT_EQ(o.bucket_cap_mb, 25.0);
  EXPECT_EQ(o.first_bucket_bytes, 1u << 20);
  EXPECT_FALSE(o.find_unused_parameters);
  EXPECT_TRUE(o.broadcast_buffers);
}

TEST(GradientBucketerTest, InvalidOptions) {
  ThreeLayers net;
  auto comm = SingleRankGloo();
  GradientBucketerOptions o;
  o.bucket_cap_mb = 0;
  EXPECT_EQ(GradientBucketer::Create(net, comm, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GradientBucketer::Create(net, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradientBucketerTest, NoSyncAccumulatesLocallyWithoutCommunication) {
  torch::manual_seed(0);
  ThreeLayers net;
  auto ddp_or = GradientBucketer::Create(net, SingleRankGloo());
  ASSERT_TRUE(ddp_or.ok()) << ddp_or.status();
  auto& ddp = *ddp_or;
  auto x = torch::randn({4, 256});
  {
    auto guard = ddp->NoSync();
    ASSERT_TRUE(ddp->PrepareForward().ok());
    net.forward(x).sum().backward();
    ASSERT_TRUE(ddp->FinalizeBackward().ok());
    auto s = ddp->last_step_stats();
    EXPECT_FALSE(s.synced);
    EXPECT_TRUE(s.launches.empty());
  }
  auto micro_grad = net.fc0->weight.grad().clone();
  ASSERT_TRUE(ddp->PrepareForward().ok());
  net.forward(x).sum().backward();
  ASSERT_TRUE(ddp->FinalizeBackward().ok());
  auto s = ddp->last_step_stats();
  EXPECT_TRUE(s.synced);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.launches.size(), ddp->buckets().size());
  EXPECT_EQ(s.grads_from_hooks, 6u);
  // World size 1: the synced gradient is the accumulated sum of both passes.
  EXPECT_TRUE(torch::allclose(net.fc0->weight.grad(), 2 * micro_grad));
}

TEST(GradientBucketerTest, UnfinalizedBackwardIsReportedAtNextForward) {
  ThreeLayers net;
  auto ddp = GradientBucketer::Create(net, SingleRankGloo());
  ASSERT_TRUE(ddp.ok());
  net.forward(torch::randn({2, 256})).sum().backward();
  auto st = (*ddp)->PrepareForward();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("FinalizeBackward"));
}

TEST(GradientBucketerTest, NoGradientAtAllIsAnError) {
  ThreeLayers net;
  auto ddp = GradientBucketer::Create(net, SingleRankGloo());
  ASSERT_TRUE(ddp.ok());
  auto st = (*ddp)->FinalizeBackward();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("fc0.weight"));
}

// The comm timeline: per bucket, in the order things happen to it, and the
// engine's own stamps; nothing recorded when it is off.
TEST(GradientBucketerTest, TimelineRecordsEveryBucketInOrderOnlyWhenAskedTo) {
  using Clock = std::chrono::steady_clock;
  for (bool on : {false, true}) {
    SCOPED_TRACE(on ? "record_timeline" : "off");
    ThreeLayers net;
    GradientBucketerOptions o;
    o.first_bucket_bytes = 100000;
    o.bucket_cap_mb = 0.3;  // two buckets (see the layout test above)
    o.record_timeline = on;
    auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE((*ddp)->PrepareForward().ok());
      const auto before = Clock::now();
      net.forward(torch::randn({4, 256})).sum().backward();
      ASSERT_TRUE((*ddp)->FinalizeBackward().ok());
      const auto after = Clock::now();
      const StepCommStats s = (*ddp)->last_step_stats();
      if (!on) {
        EXPECT_TRUE(s.timeline.empty());
        EXPECT_EQ(s.wait_start, Clock::time_point{});
        continue;
      }
      ASSERT_EQ(s.timeline.size(), 2u);
      EXPECT_LE(before, s.timeline[0].ready);
      EXPECT_LE(s.backward_end, s.wait_start);
      for (size_t i = 0; i < s.timeline.size(); ++i) {
        SCOPED_TRACE(i);
        const BucketTimeline& b = s.timeline[i];
        ASSERT_TRUE(b.ran.has_value());  // Gloo stamps its work when asked
        EXPECT_LE(b.ready, b.issued);
        EXPECT_LE(b.issued, s.launches[i].time);
        EXPECT_LE(b.issued, b.ran->started);
        EXPECT_LE(b.ran->started, b.ran->finished);
        EXPECT_LE(b.ran->finished, b.waited);
        EXPECT_LE(s.wait_start, b.waited);
        EXPECT_LE(b.waited, s.wait_end);
        if (i > 0) {
          EXPECT_LE(s.timeline[i - 1].ran->finished, b.ran->started);
        }
      }
      EXPECT_LE(s.wait_end, after);
    }
  }
}

// gradient_as_bucket_view, with each comm hook: the gradients become slices
// of the buckets (the parameters of one bucket share its storage), stay
// there across steps when zeroed in place (no copy either way), and training
// gives the bytes the copying path gives.
TEST(GradientBucketerTest, GradientAsBucketViewTrainsToTheSameBytesWithEveryHook) {
  for (CommHook hook :
       {CommHook::kNone, CommHook::kFp16Compress, CommHook::kBf16Compress, CommHook::kPowerSgd}) {
    std::vector<std::vector<at::Tensor>> finals;
    for (bool as_view : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(CommHookName(hook), as_view ? " gradient_as_bucket_view" : " copy"));
      torch::manual_seed(0);
      ThreeLayers net;
      GradientBucketerOptions o;
      o.first_bucket_bytes = 100000;
      o.bucket_cap_mb = 0.3;  // buckets {fc2}, {fc1, fc0}
      o.gradient_as_bucket_view = as_view;
      o.comm_hook = hook;
      o.powersgd.start_iter = 1;  // a plain step, then PowerSGD's
      auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
      ASSERT_TRUE(ddp.ok()) << ddp.status();
      torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      const void* slot = nullptr;  // fc0.weight's gradient after the first step
      for (int step = 0; step < 4; ++step) {
        SCOPED_TRACE(step);
        torch::manual_seed(100 + step);
        ASSERT_TRUE((*ddp)->PrepareForward().ok());
        net.forward(torch::randn({4, 256})).pow(2).sum().backward();
        ASSERT_TRUE((*ddp)->FinalizeBackward().ok());
        EXPECT_EQ((*ddp)->last_step_stats().powersgd, hook == CommHook::kPowerSgd && step >= 1);
        const at::Tensor& g = net.fc0->weight.grad();
        EXPECT_EQ(g.storage().is_alias_of(net.fc1->weight.grad().storage()), as_view);
        EXPECT_FALSE(g.storage().is_alias_of(net.fc2->weight.grad().storage()));
        if (step == 0) slot = g.data_ptr();
        // Zeroed in place, the slice stays: backward accumulates into it.
        if (as_view) EXPECT_EQ(g.data_ptr(), slot);
        sgd.step();
        ASSERT_NO_THROW(torch_compat::ZeroGradInPlace(sgd));
      }
      std::vector<at::Tensor> params;
      for (const auto& p : net.parameters()) params.push_back(p.detach().clone());
      finals.push_back(std::move(params));
    }
    ASSERT_EQ(finals[0].size(), finals[1].size());
    for (size_t i = 0; i < finals[0].size(); ++i)
      EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i])) << CommHookName(hook) << " " << i;
  }
}

TEST(GradientBucketerTest, LaunchAfterBackwardLaunchesEveryBucketAtFinalize) {
  ThreeLayers net;
  GradientBucketerOptions o;
  o.first_bucket_bytes = 100000;
  o.bucket_cap_mb = 0.3;  // two buckets
  o.launch_after_backward = true;
  auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  ASSERT_TRUE((*ddp)->PrepareForward().ok());
  net.forward(torch::randn({4, 256})).sum().backward();
  ASSERT_TRUE((*ddp)->FinalizeBackward().ok());
  const StepCommStats s = (*ddp)->last_step_stats();
  ASSERT_EQ(s.launches.size(), 2u);
  for (size_t i = 0; i < s.launches.size(); ++i) {
    EXPECT_EQ(s.launches[i].bucket, i);
    EXPECT_FALSE(s.launches[i].from_hook);
    EXPECT_GE(s.launches[i].time, s.backward_end);
  }
}

TEST(GradientBucketerTest, HooksAreRemovedWithTheBucketer) {
  ThreeLayers net;
  {
    auto ddp = GradientBucketer::Create(net, SingleRankGloo());
    ASSERT_TRUE(ddp.ok());
  }
  // A backward after the bucketer is gone must not call into it.
  net.forward(torch::randn({2, 256})).sum().backward();
  EXPECT_TRUE(net.fc0->weight.grad().defined());
}

// The compress step is PyTorch's fp16_compress_hook / bf16_compress_hook:
// cast, then divide in the 16-bit type; decompress casts back.
TEST(CommHookTest, CompressCastsThenDividesInSixteenBits) {
  // 1 + 2^-11 rounds to 1 in float16 (10-bit mantissa) before the division,
  // 1 + 2^-8 to 1 in bfloat16 (7 bits): dividing first would keep more.
  const std::vector<float> values = {1.0f + 0x1p-11f, 1.0f + 0x1p-8f, -3.0f, 1e-3f, 0.0f, 65504.0f};
  const auto flat = torch::tensor(values);
  for (CommHook hook : {CommHook::kFp16Compress, CommHook::kBf16Compress}) {
    SCOPED_TRACE(CommHookName(hook));
    at::Tensor c = NewCompressedBuffer(flat, hook);
    EXPECT_EQ(c.scalar_type(), hook == CommHook::kFp16Compress ? at::kHalf : at::kBFloat16);
    EXPECT_EQ(c.numel(), flat.numel());
    CompressBucket(flat, 2, c);
    EXPECT_TRUE(torch::equal(c, flat.to(c.scalar_type()).div_(2)));
    at::Tensor back = torch::full_like(flat, 42.0f);
    DecompressBucket(c, back);
    EXPECT_EQ(back.scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::equal(back, c.to(at::kFloat)));
    EXPECT_EQ(back[2].item<float>(), -1.5f);  // exact in both types
    EXPECT_EQ(back[4].item<float>(), 0.0f);
  }
  // The rounding the hooks accept: 1 + 2^-11 is 0.5 after fp16, not 0.50024.
  at::Tensor c = NewCompressedBuffer(flat, CommHook::kFp16Compress);
  CompressBucket(flat, 2, c);
  EXPECT_EQ(c[0].item<float>(), 0.5f);
  EXPECT_EQ(c[1].item<float>(), (1.0f + 0x1p-8f) / 2);  // exact in fp16
  // 65504 (fp16's largest) / 2 stays finite: the cast comes first and fits.
  EXPECT_EQ(c[5].item<float>(), 32752.0f);
  at::Tensor b = NewCompressedBuffer(flat, CommHook::kBf16Compress);
  CompressBucket(flat, 2, b);
  EXPECT_EQ(b[1].item<float>(), 0.5f);
}

TEST(CommHookTest, Names) {
  for (CommHook hook :
       {CommHook::kNone, CommHook::kFp16Compress, CommHook::kBf16Compress, CommHook::kPowerSgd}) {
    auto parsed = ParseCommHook(CommHookName(hook));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, hook);
  }
  auto bad = ParseCommHook("topk");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("fp16_compress"));
  EXPECT_FALSE(Compresses(CommHook::kNone));
  EXPECT_EQ(GradientBucketerOptions{}.comm_hook, CommHook::kNone);
}

// One rank: the synchronised gradient is the local one after the hook's
// round trip through 16 bits (divided by world size 1).
TEST(CommHookTest, BucketerAppliesTheHookToEveryGradient) {
  for (CommHook hook : {CommHook::kNone, CommHook::kFp16Compress, CommHook::kBf16Compress}) {
    SCOPED_TRACE(CommHookName(hook));
    torch::manual_seed(3);
    ThreeLayers net;
    auto x = torch::randn({4, 256});
    net.forward(x).sum().backward();
    std::vector<at::Tensor> local;
    for (const auto& p : net.parameters()) local.push_back(p.grad().clone());
    net.zero_grad();
    GradientBucketerOptions o;
    o.comm_hook = hook;
    o.first_bucket_bytes = 4096;
    o.bucket_cap_mb = 0.1;
    auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
    ASSERT_TRUE(ddp.ok()) << ddp.status();
    ASSERT_GT((*ddp)->buckets().size(), 1u);
    ASSERT_TRUE((*ddp)->PrepareForward().ok());
    net.forward(x).sum().backward();
    ASSERT_TRUE((*ddp)->FinalizeBackward().ok());
    const auto params = net.parameters();
    bool any_rounded = false;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      ASSERT_EQ(g.scalar_type(), at::kFloat);
      if (hook == CommHook::kNone) {
        EXPECT_TRUE(torch::equal(g, local[i])) << i;
        continue;
      }
      const auto type = hook == CommHook::kFp16Compress ? at::kHalf : at::kBFloat16;
      EXPECT_TRUE(torch::equal(g, local[i].to(type).to(at::kFloat))) << i;
      any_rounded = any_rounded || !torch::equal(g, local[i]);
    }
    if (hook != CommHook::kNone) {
      EXPECT_TRUE(any_rounded) << "no gradient went through 16 bits";
    }
  }
}

// ---------------------------------------------------------------------------
// Real rank processes.

std::string Logs(const RankRun& run) {
  std::string s = "dir: " + run.dir + "\n";
  for (size_t r = 0; r < run.logs.size(); ++r) {
    s += "---- rank " + std::to_string(r) + " (exit " + std::to_string(run.exit_codes[r]) +
         ") ----\n" + run.logs[r];
  }
  return s;
}

void ExpectAllExitedCleanly(const RankRun& run) {
  for (size_t r = 0; r < run.exit_codes.size(); ++r) {
    EXPECT_EQ(run.exit_codes[r], 0) << Logs(run);
  }
}

void Cleanup(const RankRun& run) {
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(run.dir);
}

std::string State(const RankRun& run, int rank, const std::string& step,
                  const std::string& kind = "state") {
  auto s = ReadFile(absl::StrCat(run.dir, "/", kind, "_r", rank, "_", step, ".bin"));
  EXPECT_TRUE(s.ok()) << s.status() << "\n" << Logs(run);
  return s.ok() ? *s : "";
}

// Bitwise equality, reported without dumping binary blobs.
::testing::AssertionResult SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      return ::testing::AssertionFailure()
             << "first difference at byte " << i << " of " << a.size();
    }
  }
  return ::testing::AssertionSuccess();
}

// ||a - b|| / ||b|| over the float32 states (parameters only: no BN here).
double RelativeDifference(const std::string& a, const std::string& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.size() % 4, 0u);
  const size_t n = std::min(a.size(), b.size()) / 4;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    float x, y;
    std::memcpy(&x, a.data() + 4 * i, 4);
    std::memcpy(&y, b.data() + 4 * i, 4);
    diff += (double(x) - y) * (double(x) - y);
    norm += double(y) * y;
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

const absl::Duration kRunTimeout = absl::Seconds(40);

TEST(GradientBucketerMultiProcessTest, EveryRankHoldsBitwiseIdenticalParametersAfterEveryStep) {
  const int steps = 4;
  auto run = RunRanks("train", 2,
                      {{"steps", std::to_string(steps)},
                       {"bn", "1"},
                       {"depth", "3"},
                       {"hidden", "64"},
                       {"bucket_cap_mb", "0.01"},
                       {"first_bucket_bytes", "4096"}},
                      kRunTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectAllExitedCleanly(*run);
  // Ranks start from different random weights; the constructor's broadcast
  // made them rank 0's.
  EXPECT_TRUE(SameBytes(State(*run, 0, "init"), State(*run, 1, "init")));
  std::string prev = State(*run, 0, "init");
  for (int s = 0; s < steps; ++s) {
    const std::string step = absl::StrCat("s", s);
    const std::string r0 = State(*run, 0, step);
    EXPECT_FALSE(r0.empty());
    EXPECT_TRUE(SameBytes(r0, State(*run, 1, step))) << "parameters diverged at step " << s;
    EXPECT_FALSE(SameBytes(r0, prev)) << "step " << s << " changed nothing";
    prev = r0;
    // broadcast_buffers: the batch-norm statistics each rank updated in its
    // own forward are rank 0's again before the next forward.
    const std::string b0 = State(*run, 0, step, "buffers");
    EXPECT_FALSE(b0.empty());
    EXPECT_TRUE(SameBytes(b0, State(*run, 1, step, "buffers"))) << "buffers differ at step " << s;
  }
  Cleanup(*run);
}

// Issue #47: at 3 and 4 ranks over TCP (ranks on several hosts) the
// replicas stay bit-identical for a few hundred steps, with buckets on both
// of Gloo's paths: above 64 KiB (Gloo's ring) and below (the small-message
// mesh, whose ring all-reduce once summed in a different order on each rank
// and let the replicas drift apart by ~1e-7).
class GradientBucketerReplicaTest : public ::testing::TestWithParam<int> {};

TEST_P(GradientBucketerReplicaTest, ReplicasStayBitIdenticalOverTcp) {
  const int world = GetParam();
  const int steps = 200, every = 50;
  // Buckets, in reverse registration order: head, batch norm and fc2's bias
  // (4.5 KB, small), fc2's weight (100 KB), fc1 (~103 KB), fc0 (~11 KB, small).
  auto run = RunRanks("train", world,
                      {{"shm", "0"},
                       {"steps", std::to_string(steps)},
                       {"state_every", std::to_string(every)},
                       {"bn", "1"},
                       {"depth", "3"},
                       {"hidden", "160"},
                       {"lr", "0.01"},
                       {"bucket_cap_mb", "0.05"},
                       {"first_bucket_bytes", "4096"},
                       {"timeout_ms", "20000"}},
                      absl::Seconds(120));
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectAllExitedCleanly(*run);
  auto stats = ReadFile(run->dir + "/stats_r0.txt");
  ASSERT_TRUE(stats.ok());
  EXPECT_THAT(*stats, HasSubstr("num_buckets 4 "))
      << "the bucket layout this test relies on changed";
  std::string prev = State(*run, 0, "init");
  std::vector<int> written;  // the steps after which the ranks wrote their parameters
  for (int s = 0; s < steps; s += every) written.push_back(s);
  if (written.back() != steps - 1) written.push_back(steps - 1);
  for (int s : written) {
    const std::string step = absl::StrCat("s", s);
    const std::string r0 = State(*run, 0, step);
    ASSERT_FALSE(r0.empty());
    for (int r = 1; r < world; ++r) {
      EXPECT_TRUE(SameBytes(r0, State(*run, r, step)))
          << "rank " << r << " diverged from rank 0 by step " << s;
    }
    EXPECT_FALSE(SameBytes(r0, prev)) << "no change by step " << s;
    prev = r0;
  }
  Cleanup(*run);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GradientBucketerReplicaTest, ::testing::Values(3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return absl::StrCat(i.param, "Ranks");
                         });

// gradient_as_bucket_view over shared memory, with no_sync micro-steps
// accumulating into the buckets, and every bucket launched after backward,
// without a comm hook and with a 16-bit one and PowerSGD (from step 2): the
// replicas agree bit for bit after every step, and with the default path's
// parameters.
TEST(GradientBucketerMultiProcessTest, GradientAsBucketViewKeepsReplicasAndBytes) {
  const int steps = 4;
  for (const char* hook : {"none", "fp16_compress", "powersgd"}) {
    SCOPED_TRACE(hook);
    std::map<std::string, std::string> args = {{"steps", std::to_string(steps)},
                                               {"micro", "2"},
                                               {"bn", "1"},
                                               {"depth", "3"},
                                               {"hidden", "64"},
                                               {"bucket_cap_mb", "0.01"},
                                               {"first_bucket_bytes", "4096"},
                                               {"comm_hook", hook},
                                               {"powersgd_start_iter", "2"}};
    auto copy_run = RunRanks("train", 2, args, kRunTimeout);
    args["bucket_view"] = "1";
    args["launch_after_backward"] = "1";  // the same bytes without overlap too
    auto view_run = RunRanks("train", 2, args, kRunTimeout);
    ASSERT_TRUE(copy_run.ok() && view_run.ok());
    ExpectAllExitedCleanly(*copy_run);
    ExpectAllExitedCleanly(*view_run);
    for (int s = 0; s < steps; ++s) {
      const std::string step = absl::StrCat("s", s);
      const std::string v0 = State(*view_run, 0, step);
      EXPECT_FALSE(v0.empty());
      EXPECT_TRUE(SameBytes(v0, State(*view_run, 1, step))) << "replicas differ at step " << s;
      EXPECT_TRUE(SameBytes(v0, State(*copy_run, 0, step))) << "differs from copying at step " << s;
    }
    Cleanup(*copy_run);
    Cleanup(*view_run);
  }
}

TEST(GradientBucketerMultiProcessTest, TwoRanksOfBatchBEqualOneRankOfBatch2B) {
  const std::map<std::string, std::string> common = {{"steps", "3"},
                                                     {"depth", "2"},
                                                     {"hidden", "32"},
                                                     {"bucket_cap_mb", "0.005"},
                                                     {"first_bucket_bytes", "1024"}};
  auto two = common;
  two["batch"] = "8";
  auto one = common;
  one["batch"] = "16";
  auto dist_run = RunRanks("train", 2, two, kRunTimeout);
  auto ref_run = RunRanks("train", 1, one, kRunTimeout);
  ASSERT_TRUE(dist_run.ok() && ref_run.ok());
  ExpectAllExitedCleanly(*dist_run);
  ExpectAllExitedCleanly(*ref_run);
  for (int s = 0; s < 3; ++s) {
    const std::string step = absl::StrCat("s", s);
    const double rel = RelativeDifference(State(*dist_run, 0, step), State(*ref_run, 0, step));
    EXPECT_LE(rel, 1e-5) << "step " << s;
    std::cout << "step " << s << ": relative difference 2x8 vs 1x16 = " << rel << "\n";
  }
  Cleanup(*dist_run);
  Cleanup(*ref_run);
}

TEST(GradientBucketerMultiProcessTest, NoSyncAccumulationOfKMicroBatchesEqualsBatchKB) {
  const std::map<std::string, std::string> common = {{"steps", "2"},
                                                     {"depth", "2"},
                                                     {"hidden", "32"},
                                                     {"bucket_cap_mb", "0.005"},
                                                     {"first_bucket_bytes", "1024"}};
  auto accum = common;
  accum["batch"] = "4";
  accum["micro"] = "4";  // 4 micro-batches of 4, the first 3 under no_sync
  auto big = common;
  big["batch"] = "16";
  auto accum_run = RunRanks("train", 2, accum, kRunTimeout);
  auto big_run = RunRanks("train", 2, big, kRunTimeout);
  ASSERT_TRUE(accum_run.ok() && big_run.ok());
  ExpectAllExitedCleanly(*accum_run);
  ExpectAllExitedCleanly(*big_run);
  for (int s = 0; s < 2; ++s) {
    const std::string step = absl::StrCat("s", s);
    const double rel = RelativeDifference(State(*accum_run, 0, step), State(*big_run, 0, step));
    EXPECT_LE(rel, 1e-5) << "step " << s;
    std::cout << "step " << s << ": relative difference 4x4 accumulated vs 16 = " << rel << "\n";
    EXPECT_TRUE(SameBytes(State(*accum_run, 0, step), State(*accum_run, 1, step)));
  }
  Cleanup(*accum_run);
  Cleanup(*big_run);
}

// Parses "key value key value ..." lines of stats_r<rank>.txt.
std::vector<std::map<std::string, int64_t>> StatsLines(const RankRun& run, int rank) {
  std::vector<std::map<std::string, int64_t>> out;
  auto text = ReadFile(absl::StrCat(run.dir, "/stats_r", rank, ".txt"));
  EXPECT_TRUE(text.ok()) << Logs(run);
  if (!text.ok()) return out;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> tok = absl::StrSplit(line, ' ', absl::SkipEmpty());
    std::map<std::string, int64_t> m;
    for (size_t i = 0; i + 1 < tok.size(); i += 2) {
      int64_t v = 0;
      if (absl::SimpleAtoi(tok[i + 1], &v)) m[tok[i]] = v;
    }
    out.push_back(std::move(m));
  }
  return out;
}

TEST(GradientBucketerMultiProcessTest, FirstBucketLaunchesWhileBackwardIsStillRunning) {
  auto run = RunRanks("train", 2,
                      {{"steps", "3"},
                       {"depth", "4"},
                       {"hidden", "128"},
                       {"bucket_cap_mb", "0.07"},
                       {"first_bucket_bytes", "16384"}},
                      kRunTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectAllExitedCleanly(*run);
  for (int r = 0; r < 2; ++r) {
    auto lines = StatsLines(*run, r);
    ASSERT_EQ(lines.size(), 4u) << Logs(*run);
    EXPECT_GE(lines[0]["num_buckets"], 2);
    for (size_t i = 1; i < lines.size(); ++i) {
      auto& l = lines[i];
      EXPECT_EQ(l["launches"], lines[0]["num_buckets"]);
      // Recorded by the hook itself: launched from inside backward, before
      // every gradient existed, and before loss.backward() returned.
      EXPECT_EQ(l["first_from_hook"], 1);
      EXPECT_LT(l["first_grads_ready"], l["num_params"]);
      EXPECT_GT(l["first_before_backward_return_us"], 0);
      std::cout << "rank " << r << " step " << l["step"] << ": " << l["launches"]
                << " buckets, first launched " << l["first_before_backward_return_us"]
                << " us before backward returned with " << l["first_grads_ready"] << "/"
                << l["num_params"] << " grads ready; exposed comm " << l["exposed_comm_us"]
                << " us\n";
    }
  }
  Cleanup(*run);
}

TEST(GradientBucketerMultiProcessTest, DeadPeerFailsTheStepWithinTheTimeout) {
  auto run = RunRanks("train", 2,
                      {{"steps", "3"},
                       {"timeout_ms", "4000"},
                       {"die_rank", "1"},
                       {"die_at_step", "1"},
                       {"die_mode", "exit"},
                       {"expect_error", "1"}},
                      kRunTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[1], 3) << Logs(*run);
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  auto err = ReadFile(run->dir + "/error_r0");
  ASSERT_TRUE(err.ok()) << Logs(*run);
  std::vector<std::string> parts = absl::StrSplit(*err, absl::MaxSplits('\n', 1));
  double ms = 1e9;
  ASSERT_TRUE(absl::SimpleAtod(parts[0], &ms));
  EXPECT_LT(ms, 4000 + 3000) << *err;
  std::cout << "rank 0 after its peer died: " << *err << "\n";
  Cleanup(*run);
}

TEST(GradientBucketerMultiProcessTest, StalledPeerFailsTheStepWithDeadlineExceeded) {
  auto run = RunRanks("train", 2,
                      {{"steps", "3"},
                       {"timeout_ms", "2000"},
                       {"die_rank", "1"},
                       {"die_at_step", "1"},
                       {"die_mode", "stall"},
                       {"expect_error", "1"}},
                      kRunTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_codes[0], 0) << Logs(*run);
  auto err = ReadFile(run->dir + "/error_r0");
  ASSERT_TRUE(err.ok()) << Logs(*run);
  EXPECT_THAT(*err, HasSubstr("DEADLINE_EXCEEDED"));
  std::vector<std::string> parts = absl::StrSplit(*err, absl::MaxSplits('\n', 1));
  double ms = 1e9;
  ASSERT_TRUE(absl::SimpleAtod(parts[0], &ms));
  EXPECT_LT(ms, 2000 + 3000) << *err;
  Cleanup(*run);
}

TEST(GradientBucketerMultiProcessTest, UnusedParameterWithoutFindUnusedIsAClearError) {
  auto run = RunRanks("train", 2,
                      {{"steps", "2"},
                       {"unused", "all"},
                       {"find_unused", "0"},
                       {"expect_error", "1"},
                       {"timeout_ms", "5000"}},
                      kRunTimeout);
  ASSERT_TRUE(run.ok()) << run.status();
  ExpectAllExitedCleanly(*run);
  for (int r = 0; r < 2; ++r) {
    auto err = ReadFile(absl::StrCat(run->dir, "/error_r", r));
    ASSERT_TRUE(err.ok()) << Logs(*run);
    EXPECT_THAT(*err, HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(*err, HasSubstr("received no gradient"));
    EXPECT_THAT(*err, HasSubstr("extra.weight"));
    EXPECT_THAT(*err, HasSubstr("find_unused_parameters"));
  }
  Cleanup(*run);
}

TEST(GradientBucketerMultiProcessTest, FindUnusedParametersKeepsRanksInStep) {
  // "all": no rank uses the extra layer; "rank0": rank 0 does not, rank 1 does.
  for (const char* mode : {"all", "rank0"}) {
    SCOPED_TRACE(mode);
    auto run = RunRanks("train", 2,
                        {{"steps", "3"},
                         {"unused", mode},
                         {"find_unused", "1"},
                         {"bucket_cap_mb", "0.002"},
                         {"first_bucket_bytes", "512"}},
                        kRunTimeout);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectAllExitedCleanly(*run);
    for (int s = 0; s < 3; ++s) {
      const std::string step = absl::StrCat("s", s);
      EXPECT_TRUE(SameBytes(State(*run, 0, step), State(*run, 1, step))) << "step " << s;
    }
    Cleanup(*run);
  }
}

// DDP comm hooks on 2 ranks, over shared memory (16-bit sums in float,
// rounded once) and over Gloo's TCP ring (16-bit sums): replicas stay
// bit-identical, and the final loss on a held-out batch is within 5% of the
// run without a hook (docs/ddp.md states this bound).
class CommHookTrainingTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

double HeldOutLoss(const RankRun& run, int rank, const char* tag = "final") {
  auto text = ReadFile(absl::StrCat(run.dir, "/loss_", tag, "_r", rank, ".txt"));
  EXPECT_TRUE(text.ok()) << text.status() << "\n" << Logs(run);
  double v = -1;
  EXPECT_TRUE(text.ok() && absl::SimpleAtod(absl::StripAsciiWhitespace(*text), &v)) << *text;
  return v;
}

TEST_P(CommHookTrainingTest, ReplicasIdenticalAndLossCloseToNoHook) {
  const auto& [hook, shm] = GetParam();
  const int steps = 60;
  const std::map<std::string, std::string> common = {{"shm", std::to_string(shm)},
                                                     {"task", "linear"},
                                                     {"steps", std::to_string(steps)},
                                                     {"state_every", std::to_string(steps)},
                                                     {"depth", "2"},
                                                     {"hidden", "64"},
                                                     {"lr", "0.05"},
                                                     {"bucket_cap_mb", "0.01"},
                                                     {"first_bucket_bytes", "4096"}};
  auto with_hook = common;
  with_hook["comm_hook"] = hook;
  auto none = common;
  none["comm_hook"] = "none";
  auto hook_run = RunRanks("train", 2, with_hook, absl::Seconds(90));
  auto none_run = RunRanks("train", 2, none, absl::Seconds(90));
  ASSERT_TRUE(hook_run.ok() && none_run.ok());
  ExpectAllExitedCleanly(*hook_run);
  ExpectAllExitedCleanly(*none_run);
  auto stats = ReadFile(hook_run->dir + "/stats_r0.txt");
  ASSERT_TRUE(stats.ok());
  // The head and the last hidden layer (4 KiB first bucket), then the rest.
  EXPECT_THAT(*stats, HasSubstr("num_buckets 2 "))
      << "the bucket layout this test relies on changed";

  const std::string last = absl::StrCat("s", steps - 1);
  const std::string r0 = State(*hook_run, 0, last);
  ASSERT_FALSE(r0.empty());
  EXPECT_TRUE(SameBytes(r0, State(*hook_run, 1, last))) << "replicas differ after training";
  // The hook changed the arithmetic (else it was never applied).
  EXPECT_FALSE(SameBytes(r0, State(*none_run, 0, last)));

  const double loss = HeldOutLoss(*hook_run, 0), ref = HeldOutLoss(*none_run, 0);
  EXPECT_EQ(loss, HeldOutLoss(*hook_run, 1));
  // Training happened: the loss fell well below the untrained model's.
  const double init = HeldOutLoss(*none_run, 0, "init");
  EXPECT_LT(ref, 0.5 * init) << "no-hook run did not learn: " << init << " -> " << ref;
  EXPECT_LE(std::abs(loss - ref), 0.05 * ref) << hook << ": " << loss << " vs no hook " << ref;
  std::cout << hook << " shm=" << shm << ": held-out loss " << init << " -> " << loss
            << ", no hook " << ref << "\n";
  Cleanup(*hook_run);
  Cleanup(*none_run);
}

// One rank, comm_hook powersgd from step 2: the first two steps are the plain
// all-reduce (the local gradients exactly, world size 1); from then on the
// weight matrices arrive as rank-1 approximations and the biases (1-D,
// never compressed) exactly.
TEST(CommHookTest, PowerSgdWarmsUpWithThePlainAllReduceThenSendsLowRank) {
  torch::manual_seed(6);
  ThreeLayers net;
  GradientBucketerOptions o;
  o.comm_hook = CommHook::kPowerSgd;
  o.powersgd.start_iter = 2;
  o.first_bucket_bytes = 4096;
  auto ddp = GradientBucketer::Create(net, SingleRankGloo(), o);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  // The three 256x256 weights go as 512 values each, the biases as they are.
  const auto plan = (*ddp)->powersgd_plan();
  EXPECT_EQ(plan.compressed_tensors, 3u);
  EXPECT_EQ(plan.tensors, 6u);
  EXPECT_EQ(plan.bucket_numel, 3 * 256 * 256 + 3 * 256);
  EXPECT_EQ(plan.wire_numel, 3 * 512 + 3 * 256);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    auto x = torch::randn({8, 256});
    net.zero_grad();
    {
      auto local_only = (*ddp)->NoSync();
      net.forward(x).sum().backward();
    }
    std::vector<at::Tensor> local;
    for (const auto& p : net.parameters()) local.push_back(p.grad().clone());
    net.zero_grad();
    ASSERT_TRUE((*ddp)->PrepareForward().ok());
    net.forward(x).sum().backward();
    ASSERT_TRUE((*ddp)->FinalizeBackward().ok());
    EXPECT_EQ((*ddp)->last_step_stats().powersgd, step >= 2);
    const auto params = net.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      if (step < 2 || g.dim() == 1) {
        EXPECT_TRUE(torch::equal(g, local[i])) << i;
        continue;
      }
      EXPECT_FALSE(torch::equal(g, local[i])) << i;
      const at::Tensor sv = torch::linalg_svdvals(g);
      EXPECT_LT(sv[1].item<float>(), 1e-5f * sv[0].item<float>()) << i << ": not rank 1";
    }
  }
}

TEST(CommHookTest, PowerSgdSettingsAreChecked) {
  ThreeLayers net;
  auto comm = SingleRankGloo();
  auto refused = [&](auto set, const std::string& what) {
    GradientBucketerOptions o;
    o.comm_hook = CommHook::kPowerSgd;
    set(o.powersgd);
    auto ddp = GradientBucketer::Create(net, comm, o);
    EXPECT_EQ(ddp.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(ddp.status().message()), HasSubstr(what));
  };
  refused([](PowerSgdOptions& p) { p.rank = 0; }, "rank must be >= 1");
  refused([](PowerSgdOptions& p) { p.start_iter = -1; }, "start_iter must be >= 0");
  refused([](PowerSgdOptions& p) { p.min_compression_rate = 0.5; }, "min_compression_rate");
  refused([](PowerSgdOptions& p) { p.min_compression_rate = NAN; }, "min_compression_rate");
}

// PowerSGD on 2 ranks over Gloo's TCP ring (and once over shared memory):
// replicas stay bit-identical;
// at rank 4 (the rank of the task's map) the held-out loss stays within 10%
// of the run without a hook (docs/ddp.md states this bound for this
// setting); at rank 1 error feedback at least halves the loss of the run
// without it; and the warm-up steps before start_iter are the plain
// all-reduce: a run that never reaches start_iter ends bit-identical to the
// run without a hook.
TEST(PowerSgdTrainingTest, ReplicasIdenticalWarmUpIsPlainAndLossCloseToNoHook) {
  const int steps = 60;
  const std::map<std::string, std::string> common = {{"shm", "0"},
                                                     {"task", "linear"},
                                                     {"steps", std::to_string(steps)},
                                                     {"state_every", "5"},
                                                     {"depth", "2"},
                                                     {"hidden", "64"},
                                                     {"lr", "0.05"},
                                                     {"bucket_cap_mb", "0.01"},
                                                     {"first_bucket_bytes", "4096"}};
  auto psgd = common;
  psgd["comm_hook"] = "powersgd";
  psgd["powersgd_start_iter"] = "5";
  psgd["powersgd_rank"] = "4";  // the rank of the task's linear map
  auto warm_only = psgd;
  warm_only["powersgd_start_iter"] = "1000";
  auto rank1 = psgd;
  rank1["powersgd_rank"] = "1";
  auto rank1_no_feedback = rank1;
  rank1_no_feedback["powersgd_error_feedback"] = "0";
  auto none = common;
  none["comm_hook"] = "none";
  auto psgd_run = RunRanks("train", 2, psgd, absl::Seconds(90));
  auto warm_run = RunRanks("train", 2, warm_only, absl::Seconds(90));
  auto none_run = RunRanks("train", 2, none, absl::Seconds(90));
  auto r1_run = RunRanks("train", 2, rank1, absl::Seconds(90));
  auto r1_nf_run = RunRanks("train", 2, rank1_no_feedback, absl::Seconds(90));
  auto shm = psgd;  // the same over the shared-memory all-reduce
  shm["shm"] = "1";
  auto shm_run = RunRanks("train", 2, shm, absl::Seconds(90));
  ASSERT_TRUE(psgd_run.ok() && warm_run.ok() && none_run.ok() && r1_run.ok() && r1_nf_run.ok() &&
              shm_run.ok());
  for (const RankRun* run :
       {&*psgd_run, &*warm_run, &*none_run, &*r1_run, &*r1_nf_run, &*shm_run}) {
    ExpectAllExitedCleanly(*run);
  }

  auto stats = ReadFile(psgd_run->dir + "/stats_r0.txt");
  ASSERT_TRUE(stats.ok());
  EXPECT_THAT(*stats, HasSubstr("step 4 launches 2 "));
  for (absl::string_view piece : absl::StrSplit(*stats, '\n')) {
    const std::string line(piece);
    if (!absl::StartsWith(line, "step ")) continue;
    const int step = std::stoi(line.substr(5));
    EXPECT_THAT(line, HasSubstr(step < 5 ? " powersgd 0" : " powersgd 1")) << line;
  }
  // Before start_iter: the same bits as without a hook (the hook divides the
  // raw bucket by 2 where no hook multiplies by 0.5: equal at world size 2).
  EXPECT_TRUE(SameBytes(State(*psgd_run, 0, "s0"), State(*none_run, 0, "s0")));
  const std::string last = absl::StrCat("s", steps - 1);
  EXPECT_TRUE(SameBytes(State(*warm_run, 0, last), State(*none_run, 0, last)));
  EXPECT_TRUE(SameBytes(State(*warm_run, 1, last), State(*none_run, 1, last)));

  const std::string r0 = State(*psgd_run, 0, last);
  ASSERT_FALSE(r0.empty());
  for (const std::string step : {"s5", "s30", last.c_str()}) {
    EXPECT_TRUE(SameBytes(State(*psgd_run, 0, step), State(*psgd_run, 1, step))) << step;
  }
  EXPECT_FALSE(SameBytes(r0, State(*none_run, 0, last)));
  const double loss = HeldOutLoss(*psgd_run, 0), ref = HeldOutLoss(*none_run, 0);
  EXPECT_EQ(loss, HeldOutLoss(*psgd_run, 1));
  const double init = HeldOutLoss(*none_run, 0, "init");
  EXPECT_LT(ref, 0.5 * init) << "no-hook run did not learn: " << init << " -> " << ref;
  EXPECT_LE(std::abs(loss - ref), 0.10 * ref) << loss << " vs no hook " << ref;
  // Rank 1 loses more, and error feedback recovers much of it.
  const double r1 = HeldOutLoss(*r1_run, 0), r1_nf = HeldOutLoss(*r1_nf_run, 0);
  EXPECT_TRUE(SameBytes(State(*r1_run, 0, last), State(*r1_run, 1, last)));
  EXPECT_TRUE(SameBytes(State(*r1_nf_run, 0, last), State(*r1_nf_run, 1, last)));
  EXPECT_LT(r1, 0.5 * r1_nf) << "error feedback did not help: " << r1 << " vs " << r1_nf;
  EXPECT_TRUE(SameBytes(State(*shm_run, 0, last), State(*shm_run, 1, last)));
  EXPECT_LE(std::abs(HeldOutLoss(*shm_run, 0) - ref), 0.10 * ref);
  std::cout << "powersgd: held-out loss " << init << " -> rank 4: " << loss << ", rank 1: " << r1
            << ", rank 1 without error feedback: " << r1_nf << ", no hook " << ref << "\n";
  for (const RankRun* run :
       {&*psgd_run, &*warm_run, &*none_run, &*r1_run, &*r1_nf_run, &*shm_run}) {
    Cleanup(*run);
  }
}

INSTANTIATE_TEST_SUITE_P(Hooks, CommHookTrainingTest,
                         ::testing::Combine(::testing::Values("fp16_compress", "bf16_compress"),
                                            ::testing::Values(1, 0)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           return absl::StrCat(std::get<0>(i.param),
                                               std::get<1>(i.param) ? "_Shm" : "_TcpRing");
                         });

}  // namespace
}  // namespace trainctl::dist

// GradientBucketer's PowerSGD state for checkpoints (SavePowerSgdState,
// RestorePowerSgdState), on one rank in process: a save and restore into a
// fresh bucketer continues bit for bit as if nothing happened, each part of
// the state matters, and a state that does not fit (another world size,
// another bucket layout, a garbled generator) is restored as far as it fits
// and says why. The 2-rank path through checkpoint files is in
// worker/trainer/powersgd_resume_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/dist/gloo_collectives.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/dist/single_rank_gloo.h"

namespace trainctl::dist {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::SingleRankGloo;

struct Net : torch::nn::Module {
  explicit Net(int64_t width = 48) {
    torch::manual_seed(0);  // every Net of one width starts alike
    fc0 = register_module("fc0", torch::nn::Linear(width, width));
    fc1 = register_module("fc1", torch::nn::Linear(width, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc2->forward(torch::relu(fc1->forward(torch::relu(fc0->forward(x)))));
  }
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
};

constexpr int kSteps = 10;

class PowerSgdStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = SingleRankGloo();
    torch::manual_seed(1);
    for (int i = 0; i < kSteps; ++i) {
      xs_.push_back(torch::randn({8, 48}));
      ys_.push_back(torch::randn({8, 4}));
    }
  }

  // PowerSGD from step 2 at rank 1, several buckets.
  static GradientBucketerOptions Options(int64_t rank = 1) {
    GradientBucketerOptions o;
    o.comm_hook = CommHook::kPowerSgd;
    o.powersgd.start_iter = 2;
    o.powersgd.rank = rank;
    o.first_bucket_bytes = 4096;
    o.bucket_cap_mb = 0.005;
    return o;
  }

  std::unique_ptr<GradientBucketer> Bucketer(Net& net, const GradientBucketerOptions& o) {
    auto b = GradientBucketer::Create(net, comm_, o);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  // Steps [from, to) of SGD on the fixed batches.
  void Train(Net& net, GradientBucketer& ddp, int from, int to) {
    for (int s = from; s < to; ++s) {
      net.zero_grad();
      ASSERT_TRUE(ddp.PrepareForward().ok());
      (net.forward(xs_[s]) - ys_[s]).pow(2).mean().backward();
      ASSERT_TRUE(ddp.FinalizeBackward().ok());
      torch::NoGradGuard no_grad;
      for (auto& p : net.parameters()) p.sub_(p.grad() * 0.1);
    }
  }

  // The parameters after kSteps steps with a restart after `at` steps
  // that hands the saved state, changed by `edit` (nullptr: no restore),
  // to the new bucketer; `line` gets what the restore said.
  std::vector<at::Tensor> Resumed(int at, void (*edit)(PowerSgdState&), bool restore = true,
                                  std::string* line = nullptr) {
    Net net;
    PowerSgdState state;
    {
      auto ddp = Bucketer(net, Options());
      Train(net, *ddp, 0, at);
      auto s = ddp->SavePowerSgdState(/*keep_errors=*/true);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) return {};
      state = *s;
    }  // the attempt ends: its bucketer (and hooks) go
    if (edit != nullptr) edit(state);
    auto ddp = Bucketer(net, Options());
    if (restore) {
      std::string said = ddp->RestorePowerSgdState(state);
      if (line != nullptr) *line = said;
    }
    Train(net, *ddp, at, kSteps);
    return Params(net);
  }

  std::vector<at::Tensor> Uninterrupted() {
    Net net;
    auto ddp = Bucketer(net, Options());
    Train(net, *ddp, 0, kSteps);
    return Params(net);
  }

  static std::vector<at::Tensor> Params(Net& net) {
    std::vector<at::Tensor> out;
    for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
    return out;
  }

  static bool Same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      // Bytes, not values: -0.0 and +0.0 or two NaNs must not pass as equal.
      if (a[i].sizes() != b[i].sizes() ||
          std::memcmp(a[i].data_ptr(), b[i].data_ptr(), a[i].nbytes()) != 0) {
        return false;
      }
    }
    return true;
  }

  std::shared_ptr<Collectives> comm_;
  std::vector<at::Tensor> xs_, ys_;
};

TEST_F(PowerSgdStateTest, SaveAndRestoreContinuesBitwise) {
  const auto want = Uninterrupted();
  std::string line;
  EXPECT_TRUE(Same(Resumed(5, nullptr, true, &line), want));
  EXPECT_EQ(line,
            "powersgd: resumed at step 5 (warm-up over), Q restored with this rank's error "
            "feedback");
  // Saved during the warm-up: only the count (and the generator) matter.
  EXPECT_TRUE(Same(Resumed(1, nullptr, true, &line), want));
  EXPECT_EQ(line, "powersgd: resumed at step 1 (warm-up until step 2)");
}

TEST_F(PowerSgdStateTest, EveryPartOfTheStateMatters) {
  const auto want = Uninterrupted();
  EXPECT_FALSE(Same(Resumed(5, nullptr, /*restore=*/false), want)) << "nothing restored";
  EXPECT_FALSE(Same(Resumed(5,
                            [](PowerSgdState& s) {
                              for (auto& row : s.errors)
                                for (auto& e : row) e.zero_();
                            }),
                    want))
      << "error feedback zeroed";
  EXPECT_FALSE(Same(Resumed(5, [](PowerSgdState& s) { s.has_q = false; }), want))
      << "no warm-start Q";
  EXPECT_FALSE(Same(Resumed(5, [](PowerSgdState& s) { s.iter = 0; }), want)) << "count reset";
}

TEST_F(PowerSgdStateTest, SavedStateHoldsTheCountGeneratorQAndEveryRanksError) {
  Net net;
  auto ddp = Bucketer(net, Options());
  auto before = ddp->SavePowerSgdState(true);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->iter, 0);
  EXPECT_TRUE(before->q.empty());
  EXPECT_TRUE(before->errors.empty());
  Train(net, *ddp, 0, 4);
  auto s = ddp->SavePowerSgdState(true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->iter, 4);
  EXPECT_EQ(s->world_size, 1);
  EXPECT_TRUE(s->has_q);
  EXPECT_FALSE(s->rng.empty());
  EXPECT_NE(s->layout.find("48x48@1"), std::string::npos) << s->layout;
  ASSERT_EQ(s->errors.size(), 1u);
  ASSERT_EQ(s->errors[0].size(), s->q.size());
  double error_norm = 0;
  for (const auto& e : s->errors[0]) error_norm += e.norm().item<double>();
  EXPECT_GT(error_norm, 0) << "rank-1 compression leaves an error";
  // A rank that does not write takes part but keeps no errors.
  auto bare = ddp->SavePowerSgdState(false);
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->errors.empty());
  EXPECT_EQ(bare->q.size(), s->q.size());
}

TEST_F(PowerSgdStateTest, AnotherWorldSizeKeepsCountAndQButZeroesTheError) {
  Net net;
  PowerSgdState saved;
  {
    auto ddp = Bucketer(net, Options());
    Train(net, *ddp, 0, 5);
    saved = *ddp->SavePowerSgdState(true);
  }
  saved.world_size = 2;
  saved.errors.push_back(saved.errors[0]);
  auto ddp = Bucketer(net, Options());
  const std::string line = ddp->RestorePowerSgdState(saved);
  EXPECT_THAT(line, HasSubstr("resumed at step 5"));
  EXPECT_THAT(line, HasSubstr("Q restored"));
  EXPECT_THAT(line, Not(HasSubstr("with this rank's error feedback")));
  EXPECT_THAT(line, HasSubstr("the error feedback was saved by 2 ranks, this attempt has 1: it "
                              "starts at zero"));
  auto now = ddp->SavePowerSgdState(true);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->iter, 5);
  ASSERT_EQ(now->q.size(), saved.q.size());
  for (size_t i = 0; i < now->q.size(); ++i) EXPECT_TRUE(torch::equal(now->q[i], saved.q[i]));
  for (const auto& e : now->errors[0]) EXPECT_EQ(e.abs().max().item<float>(), 0.0f);
}

TEST_F(PowerSgdStateTest, AnotherLayoutKeepsOnlyTheCount) {
  PowerSgdState saved;
  {
    Net net;
    auto ddp = Bucketer(net, Options());
    Train(net, *ddp, 0, 5);
    saved = *ddp->SavePowerSgdState(true);
  }
  // Another powersgd rank, another model: the same message, nothing but the
  // count (and generator) restored.
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant);
    Net net(variant == 0 ? 48 : 40);
    auto ddp = Bucketer(net, Options(variant == 0 ? 2 : 1));
    const std::string line = ddp->RestorePowerSgdState(saved);
    EXPECT_THAT(line, HasSubstr("resumed at step 5"));
    EXPECT_THAT(line, HasSubstr("the gradient buckets differ from the checkpoint's"));
    EXPECT_THAT(line, Not(HasSubstr("Q restored")));
    auto now = ddp->SavePowerSgdState(true);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(now->iter, 5);
    EXPECT_FALSE(now->has_q);
    for (const auto& e : now->errors[0]) EXPECT_EQ(e.abs().max().item<float>(), 0.0f);
    // And training goes on from there.
    xs_.assign(kSteps, torch::randn({8, net.fc0->options.in_features()}));
    Train(net, *ddp, 0, 2);
  }
}

TEST_F(PowerSgdStateTest, MalformedPartsStartAfreshWithoutFailing) {
  PowerSgdState saved;
  Net net;
  {
    auto ddp = Bucketer(net, Options());
    Train(net, *ddp, 0, 5);
    saved = *ddp->SavePowerSgdState(true);
  }
  PowerSgdState bad = saved;
  bad.rng = "not a generator";
  bad.errors[0].pop_back();
  auto ddp = Bucketer(net, Options());
  const std::string line = ddp->RestorePowerSgdState(bad);
  EXPECT_THAT(line, HasSubstr("the random-Q generator is reseeded"));
  EXPECT_THAT(line, HasSubstr("this rank's error feedback in the checkpoint does not fit"));
  EXPECT_THAT(line, HasSubstr("Q restored"));

  PowerSgdState no_errors = saved;
  no_errors.errors.clear();
  auto ddp2 = Bucketer(net, Options());
  EXPECT_THAT(ddp2->RestorePowerSgdState(no_errors),
              HasSubstr("the checkpoint holds no error feedback: it starts at zero"));
}

TEST_F(PowerSgdStateTest, OnlyUnderPowerSgdAndBetweenSteps) {
  Net net;
  GradientBucketerOptions o;
  auto plain = Bucketer(net, o);
  EXPECT_EQ(plain->SavePowerSgdState(true).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain->RestorePowerSgdState(PowerSgdState{}), HasSubstr("not in use"));
  plain.reset();
  auto ddp = Bucketer(net, Options());
  net.zero_grad();
  (net.forward(xs_[0]) - ys_[0]).pow(2).mean().backward();  // a step begun, not finalized
  EXPECT_EQ(ddp->SavePowerSgdState(true).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ddp->FinalizeBackward().ok());
  EXPECT_TRUE(ddp->SavePowerSgdState(true).ok());
}

}  // namespace
}  // namespace trainctl::dist

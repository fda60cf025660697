// PowerSGD's arithmetic (powersgd.h) without collectives: the ranks are
// simulated, their all-reduces are sums copied back into every rank's buffer.
#include "worker/dist/powersgd.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace trainctl::dist {
namespace {

bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.contiguous().data_ptr<float>(), b.contiguous().data_ptr<float>(),
                     a.numel() * sizeof(float)) == 0;
}

// One simulated rank's bucket: a weight matrix (rows x cols) and a bias.
struct SimRank {
  at::Tensor flat;
  std::vector<at::Tensor> views;
  std::unique_ptr<PowerSgdBucket> psgd;
  std::mt19937_64 rng{0};

  SimRank(int64_t rows, int64_t cols, const PowerSgdOptions& o) {
    flat = torch::zeros({rows * cols + rows});
    views = {flat.narrow(0, 0, rows * cols).view({rows, cols}), flat.narrow(0, rows * cols, rows)};
    psgd = std::make_unique<PowerSgdBucket>(flat, views, o);
  }
  at::Tensor weight() const { return views[0]; }
  at::Tensor bias() const { return views[1]; }
};

// One PowerSGD step over the simulated ranks (their flats hold the local
// gradients), with the two all-reduces as sums.
void Step(std::vector<SimRank>& ranks) {
  const int world = static_cast<int>(ranks.size());
  auto all_reduce = [&](std::vector<at::Tensor*>& bufs) {
    at::Tensor sum = torch::zeros_like(*bufs[0]);
    for (at::Tensor* b : bufs) sum.add_(*b);
    for (at::Tensor* b : bufs) b->copy_(sum);
  };
  std::vector<at::Tensor*> bufs;
  for (auto& r : ranks) bufs.push_back(&r.psgd->Compress(r.flat, r.rng));
  all_reduce(bufs);
  bufs.clear();
  for (auto& r : ranks) bufs.push_back(&r.psgd->ComputeQ(world));
  all_reduce(bufs);
  for (auto& r : ranks) r.psgd->Decompress(r.flat, world);
}

TEST(PowerSgdTest, ShouldCompressIsPyTorchsRule) {
  // (n + m) * r * rate < n * m
  EXPECT_TRUE(PowerSgdShouldCompress(64, 64, 1, 2));    // 256 < 4096
  EXPECT_FALSE(PowerSgdShouldCompress(4, 4, 1, 2));     // 16 == 16
  EXPECT_TRUE(PowerSgdShouldCompress(5, 4, 1, 2));      // 18 < 20
  EXPECT_FALSE(PowerSgdShouldCompress(64, 64, 32, 1));  // 4096 == 4096
  EXPECT_FALSE(PowerSgdShouldCompress(1000, 1, 1, 1));  // a column never pays
}

TEST(PowerSgdTest, GramSchmidtGivesOrthonormalColumnsDeterministically) {
  torch::manual_seed(1);
  at::Tensor m = torch::randn({50, 4});
  at::Tensor a = m.clone(), b = m.clone();
  EXPECT_TRUE(OrthogonalizeColumns(a));
  EXPECT_TRUE(OrthogonalizeColumns(b));
  EXPECT_TRUE(SameBits(a, b));
  EXPECT_TRUE(torch::allclose(a.t().mm(a), torch::eye(4), 0, 1e-5));
  // The first column keeps its direction; the span is the input's.
  EXPECT_TRUE(torch::allclose(a.select(1, 0), m.select(1, 0) / m.select(1, 0).norm(), 0, 1e-6));
  at::Tensor proj = a.mm(a.t().mm(m));
  EXPECT_TRUE(torch::allclose(proj, m, 0, 1e-4));

  // A strided matrix (the copy-to-host path a GPU tensor takes) gives the
  // same bits as a contiguous one.
  at::Tensor strided = m.t().contiguous().t();
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(OrthogonalizeColumns(strided));
  EXPECT_TRUE(SameBits(strided, a));

  // A zero column stays zero (PyTorch's hook would divide by 0); a NaN stays.
  at::Tensor z = torch::randn({10, 2});
  z.select(1, 0).zero_();
  EXPECT_FALSE(OrthogonalizeColumns(z));
  EXPECT_EQ(z.select(1, 0).abs().sum().item<float>(), 0.0f);
  EXPECT_NEAR(z.select(1, 1).norm().item<float>(), 1.0f, 1e-6);
  at::Tensor n = torch::randn({10, 1});
  n[3][0] = NAN;
  EXPECT_FALSE(OrthogonalizeColumns(n));
  EXPECT_TRUE(std::isnan(n[3][0].item<float>()));
}

TEST(PowerSgdTest, LowRankProductIsPTimesQTransposed) {
  torch::manual_seed(2);
  at::Tensor p = torch::randn({7, 3}), q = torch::randn({5, 3});
  at::Tensor out = torch::empty({7, 5}), scratch = torch::empty({7, 5});
  LowRankProduct(p, q, out, scratch);
  EXPECT_TRUE(torch::allclose(out, p.mm(q.t()), 1e-5, 1e-5));
  // Rank 1: each element is a single product, exact.
  at::Tensor out1 = torch::empty({7, 5});
  LowRankProduct(p.narrow(1, 0, 1), q.narrow(1, 0, 1), out1, scratch);
  EXPECT_TRUE(SameBits(out1, p.narrow(1, 0, 1) * q.narrow(1, 0, 1).t()));
}

TEST(PowerSgdTest, FreshQIsTheSameOnEveryRankAndUniform) {
  std::mt19937_64 a(0), b(0);
  at::Tensor x = torch::empty({1000}), y = torch::empty({1000});
  FillUniform(a, x);
  FillUniform(b, y);
  EXPECT_TRUE(SameBits(x, y));
  EXPECT_GE(x.min().item<float>(), -1.0f);
  EXPECT_LT(x.max().item<float>(), 1.0f);
  EXPECT_NEAR(x.mean().item<float>(), 0.0f, 0.1);
}

// The ranks' gradients sum to a rank-2 matrix: PowerSGD at rank 2 returns
// its average (one power iteration spans the column space); the bias is
// averaged exactly; every rank ends with the same bits.
TEST(PowerSgdTest, RankRMatrixIsReproducedAndRanksAgreeBitForBit) {
  const int64_t rows = 40, cols = 30;
  PowerSgdOptions o;
  o.rank = 2;
  std::vector<SimRank> ranks;
  for (int k = 0; k < 2; ++k) ranks.emplace_back(rows, cols, o);
  ASSERT_EQ(ranks[0].psgd->compressed_tensors(), 1u);
  EXPECT_EQ(ranks[0].psgd->wire_numel(), rows + rows * 2 + cols * 2);
  torch::manual_seed(3);
  at::Tensor basis = torch::randn({rows, 2});
  std::vector<at::Tensor> grads, biases;
  for (auto& r : ranks) {
    grads.push_back(basis.mm(torch::randn({cols, 2}).t()));
    biases.push_back(torch::randn({rows}));
    r.weight().copy_(grads.back());
    r.bias().copy_(biases.back());
  }
  Step(ranks);
  const at::Tensor avg = (grads[0] + grads[1]) / 2;
  EXPECT_TRUE(torch::allclose(ranks[0].weight(), avg, 1e-4, 1e-4))
      << (ranks[0].weight() - avg).abs().max().item<float>();
  EXPECT_TRUE(SameBits(ranks[0].bias(), (biases[0] + biases[1]) / 2));
  EXPECT_TRUE(SameBits(ranks[0].flat, ranks[1].flat));
  // Error feedback keeps each rank's own residual: its input minus the result.
  for (int k = 0; k < 2; ++k) {
    const at::Tensor& e = ranks[k].psgd->error();
    ASSERT_TRUE(e.defined());
    EXPECT_TRUE(torch::allclose(e.narrow(0, 0, rows * cols).view({rows, cols}),
                                grads[k] - ranks[k].weight(), 0, 1e-5));
  }
}

// Error feedback: what compression leaves out is added to the next step, so
// over T steps of the same gradient G the results plus the final error sum
// to T*G exactly enough, and their mean converges to G; without it the mean
// stays at the rank-1 approximation.
TEST(PowerSgdTest, ErrorFeedbackAccumulatesTheResidual) {
  const int64_t rows = 12, cols = 10;
  torch::manual_seed(4);
  const at::Tensor g = torch::randn({rows, cols});
  auto run = [&](bool feedback, at::Tensor* final_error) {
    PowerSgdOptions o;
    o.use_error_feedback = feedback;
    std::vector<SimRank> ranks;
    ranks.emplace_back(rows, cols, o);
    at::Tensor sum = torch::zeros({rows, cols}, torch::kDouble);
    const int steps = 200;
    for (int t = 0; t < steps; ++t) {
      ranks[0].weight().copy_(g);
      ranks[0].bias().zero_();
      Step(ranks);
      sum.add_(ranks[0].weight().to(torch::kDouble));
    }
    if (final_error != nullptr) *final_error = ranks[0].psgd->error().narrow(0, 0, rows * cols);
    EXPECT_EQ(ranks[0].psgd->error().defined(), feedback);
    return std::make_pair(sum, steps);
  };
  at::Tensor e;
  auto [with_sum, steps] = run(true, &e);
  const at::Tensor total = with_sum + e.view({rows, cols}).to(torch::kDouble);
  EXPECT_TRUE(torch::allclose(total, g.to(torch::kDouble) * steps, 1e-3, 1e-2))
      << (total - g.to(torch::kDouble) * steps).abs().max().item<double>();
  auto [without_sum, steps2] = run(false, nullptr);
  const double err_with = (with_sum / steps - g.to(torch::kDouble)).norm().item<double>();
  const double err_without = (without_sum / steps2 - g.to(torch::kDouble)).norm().item<double>();
  EXPECT_LT(err_with, 0.2 * err_without) << err_with << " vs " << err_without;
}

// A step whose gradient overflowed: the result shows the NaN (the loss scaler
// must see it), and the next finite step is finite again: the error restarts
// at zero and the warm-start Q is drawn afresh.
TEST(PowerSgdTest, NonFiniteStepDoesNotPoisonLaterSteps) {
  PowerSgdOptions o;
  std::vector<SimRank> ranks;
  for (int k = 0; k < 2; ++k) ranks.emplace_back(8, 6, o);
  torch::manual_seed(5);
  for (int t = 0; t < 3; ++t) {
    for (auto& r : ranks) r.flat.copy_(torch::randn({r.flat.numel()}));
    if (t == 1) ranks[1].weight()[2][3] = INFINITY;
    Step(ranks);
    const bool finite = torch::isfinite(ranks[0].weight()).all().item<bool>();
    EXPECT_EQ(finite, t != 1) << "step " << t;
    EXPECT_TRUE(torch::isfinite(ranks[0].psgd->error()).all().item<bool>()) << "step " << t;
    EXPECT_TRUE(SameBits(ranks[0].flat, ranks[1].flat)) << "step " << t;
  }
}

}  // namespace
}  // namespace trainctl::dist

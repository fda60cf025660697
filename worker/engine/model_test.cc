#include "worker/engine/model.h"

#include <ATen/Functions.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <sys/wait.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/test_util.h"

namespace trainctl::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;
using testing_util::TestDataPath;
using testing_util::WriteFile;

std::unique_ptr<Model> MustCreate(const ModelOptions& o) {
  auto m = CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

void BackwardOnce(Model& m, const at::Tensor& x) {
  auto y = m.Forward(x);
  ASSERT_TRUE(y.ok()) << y.status();
  y->sum().backward();
  for (const auto& [name, p] : m.NamedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().sum().item<float>(), 0.0f) << name;
  }
}

TEST(ModelTest, ClassicMlpIsOneLinear) {
  ModelOptions o;
  o.name = "mlp";
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  NamedTensors params = m->NamedParameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].first, "layers.0.weight");
  EXPECT_EQ(params[0].second.sizes(), (std::vector<int64_t>{2, 5}));
  auto y = m->Forward(at::randn({30, 5}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->sizes(), (std::vector<int64_t>{30, 2}));
  BackwardOnce(*m, at::randn({4, 5}));
}

TEST(ModelTest, MlpWithHiddenLayersTrains) {
  torch::manual_seed(0);
  ModelOptions o;
  o.name = "mlp";
  o.mlp = {4, {16, 8}, 3};
  auto m = MustCreate(o);
  EXPECT_EQ(m->Parameters().size(), 6u);
  // A few Adam steps on a fixed batch reduce the loss.
  at::Tensor x = at::randn({32, 4});
  at::Tensor t = at::randint(0, 3, {32}, at::kLong);
  torch::optim::Adam opt(m->Parameters(), torch::optim::AdamOptions(0.05));
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(*m->Forward(x), t);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  EXPECT_LT(last, first * 0.7f);
}

TEST(ModelTest, CnnShapesAndBatchNormBuffers) {
  ModelOptions o;
  o.name = "cnn";
  o.cnn.conv1_channels = 4;
  o.cnn.conv2_channels = 8;
  o.cnn.hidden = 16;
  auto m = MustCreate(o);
  auto y = m->Forward(at::rand({3, 1, 28, 28}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_TRUE(m->NamedBuffers().empty());
  BackwardOnce(*m, at::rand({2, 1, 28, 28}));
  // A wrong input shape is an error, not a crash.
  EXPECT_EQ(m->Forward(at::rand({3, 28, 28, 2})).status().code(),
            absl::StatusCode::kInvalidArgument);

  o.cnn.batch_norm = true;
  auto bn = MustCreate(o);
  EXPECT_EQ(bn->NamedBuffers().size(), 6u);  // 2 x (running_mean, running_var, num_batches)
  bn->SetTraining(true);
  BackwardOnce(*bn, at::rand({4, 1, 28, 28}));
  bn->SetTraining(false);
  EXPECT_TRUE(bn->Forward(at::rand({1, 1, 28, 28})).ok());
}

TEST(ModelTest, BuiltinSaveAndLoadInPlace) {
  TempDir dir;
  ModelOptions o;
  o.name = "cnn";
  o.cnn = {1, 28, 2, 3, 5, 10, true};
  auto a = MustCreate(o);
  auto b = MustCreate(o);
  at::Tensor b_first = b->Parameters()[0];  // what an optimizer would hold
  ASSERT_TRUE(a->Save(dir.File("a.pt")).ok());
  ASSERT_TRUE(b->Load(dir.File("a.pt")).ok());
  EXPECT_TRUE(b_first.equal(a->Parameters()[0]));
  EXPECT_TRUE(b->Parameters()[0].is_same(b_first));
  for (size_t i = 0; i < a->Parameters().size(); ++i) {
    EXPECT_TRUE(a->Parameters()[i].equal(b->Parameters()[i])) << i;
  }

  auto missing = b->Load(dir.File("missing.pt"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  o.cnn.hidden = 6;  // different shape
  auto c = MustCreate(o);
  auto mismatch = c->Load(dir.File("a.pt"));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument) << mismatch;
  WriteFile(dir.File("junk.pt"), "junk");
  EXPECT_EQ(c->Load(dir.File("junk.pt")).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, TorchScriptFromPythonLoadsTrainsAndSaves) {
  TempDir dir;
  ModelOptions o;
  o.name = "torchscript";
  o.torchscript.path = TestDataPath("tiny_script.pt");
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name(), "torchscript");
  ASSERT_EQ(m->NamedParameters().size(), 4u);
  EXPECT_EQ(m->NamedParameters()[0].first, "fc1.weight");
  // Same output as Python printed in gen_torch_files.py.
  auto y = m->Forward(at::ones({1, 4}));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_NEAR((*y)[0][0].item<float>(), 0.47942468f, 1e-5);
  EXPECT_NEAR((*y)[0][1].item<float>(), -0.11881878f, 1e-5);

  m->SetTraining(true);
  BackwardOnce(*m, at::randn({8, 4}));
  torch::optim::SGD opt(m->Parameters(), torch::optim::SGDOptions(0.1));
  opt.step();
  auto y2 = m->Forward(at::ones({1, 4}));
  ASSERT_TRUE(y2.ok());
  EXPECT_FALSE(y2->equal(*y));  // training changed the module's own parameters

  ASSERT_TRUE(m->Save(dir.File("trained.pt")).ok());
  ModelOptions reload = o;
  reload.torchscript.path = dir.File("trained.pt");
  auto m2 = MustCreate(reload);
  auto y3 = m2->Forward(at::ones({1, 4}));
  ASSERT_TRUE(y3.ok());
  EXPECT_TRUE(y3->allclose(*y2));

  // Load copies into the original module in place.
  auto fresh = MustCreate(o);
  ASSERT_TRUE(fresh->Load(dir.File("trained.pt")).ok());
  EXPECT_TRUE(fresh->Forward(at::ones({1, 4}))->allclose(*y2));

  EXPECT_EQ(m->Forward(at::ones({1, 7})).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, BuiltinsExportTorchScriptForPython) {
  TempDir dir;
  std::vector<ModelOptions> all(3);
  all[0].name = "mlp";
  all[1].name = "mlp";
  all[1].mlp = {5, {7, 3}, 4};
  all[2].name = "cnn";
  all[2].cnn = {1, 28, 3, 4, 6, 10, true};
  struct PythonCheck {
    std::string path;
    std::string shape;
    at::Tensor expect;  // the C++ model's output for ones(shape)
  };
  std::vector<PythonCheck> python_checks;
  for (const ModelOptions& o : all) {
    auto m = MustCreate(o);
    const bool cnn = o.name == "cnn";
    at::Tensor x = cnn ? at::rand({2, 1, 28, 28}) : at::randn({3, 5});
    if (cnn) {  // move the batch-norm running stats away from their initial values
      m->SetTraining(true);
      ASSERT_TRUE(m->Forward(at::rand({8, 1, 28, 28})).ok());
    }
    m->SetTraining(false);
    auto want = m->Forward(x);
    ASSERT_TRUE(want.ok());
    const std::string path = dir.File(o.name + std::to_string(python_checks.size()) + ".ts");
    auto st = m->ExportTorchScript(path);
    ASSERT_TRUE(st.ok()) << st;
    torch::jit::Module loaded = torch::jit::load(path);
    loaded.eval();
    at::Tensor got = loaded.forward({x}).toTensor();
    EXPECT_TRUE(got.allclose(*want, 1e-5, 1e-6)) << o.name;

    at::Tensor ones = cnn ? at::ones({1, 1, 28, 28}) : at::ones({1, 5});
    python_checks.push_back({path, cnn ? "1, 1, 28, 28" : "1, 5", m->Forward(ones)->flatten()});
  }

  // Where Debian's python3-torch is installed, check that Python itself loads
  // the exports and computes the same outputs (one interpreter: torch imports
  // slowly).
  std::string script = "import sys\ntry:\n    import torch\nexcept ImportError:\n    sys.exit(3)\n";
  for (const PythonCheck& c : python_checks) {
    script += "m = torch.jit.load('" + c.path + "'); m.eval()\n";
    script +=
        "print(' '.join('%.7g' % v for v in m(torch.ones(" + c.shape + ")).flatten().tolist()))\n";
  }
  testing_util::WriteFile(dir.File("check.py"), script);
  FILE* p = popen(("/usr/bin/python3 " + dir.File("check.py") + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = pclose(p);
  if (WIFEXITED(rc) && (WEXITSTATUS(rc) == 3 || WEXITSTATUS(rc) == 127)) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch; C++ reload checked only";
  }
  ASSERT_EQ(rc, 0) << out;
  std::istringstream values(out);
  for (const PythonCheck& c : python_checks) {
    for (int64_t i = 0; i < c.expect.numel(); ++i) {
      float v = 0;
      ASSERT_TRUE(values >> v) << out;
      EXPECT_NEAR(v, c.expect[i].item<float>(), 1e-5) << c.path << " output " << i;
    }
  }
}

TEST(ModelTest, FactoryErrors) {
  ModelOptions o;
  o.name = "resnet";
  auto r = CreateModel(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("'resnet' is unknown"));

  o.name = "mlp";
  o.mlp.input_dim = 0;
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("mlp input_dim"));
  o.mlp = {5, {8, 0}, 2};
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("mlp hidden_sizes[1]"));
  o.mlp = {5, {}, -2};
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("mlp output_dim"));

  o.name = "cnn";
  o.cnn.image_size = 3;
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("cnn image_size"));
  o.cnn.image_size = 28;
  o.cnn.classes = 0;
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("cnn classes"));

  o.name = "torchscript";
  EXPECT_THAT(std::string(CreateModel(o).status().message()), HasSubstr("torchscript path"));
  o.torchscript.path = "/nonexistent/model.pt";
  EXPECT_EQ(CreateModel(o).status().code(), absl::StatusCode::kNotFound);
  TempDir dir;
  WriteFile(dir.File("bad.pt"), "not a model");
  o.torchscript.path = dir.File("bad.pt");
  EXPECT_EQ(CreateModel(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::engine

// In-process Trainer tests (world size 1, no collectives): accumulation,
// clipping, MSE + eval, checkpoint round trips, error kinds.
#include "worker/trainer/trainer.h"

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/safe_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/engine/dataset.h"
#include "worker/trainer/checkpoint.h"
#if TRAINCTL_HAVE_GLOO
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/single_rank_gloo.h"
#endif

namespace trainctl::trainer {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<engine::Model> Mlp(std::vector<int64_t> hidden = {}, int64_t out = 2) {
  torch::manual_seed(0);
  engine::ModelOptions o;
  o.name = "mlp";
  o.mlp.input_dim = 5;
  o.mlp.hidden_sizes = std::move(hidden);
  o.mlp.output_dim = out;
  auto m = engine::CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

std::shared_ptr<const engine::Dataset> Synthetic(int64_t length, int64_t classes = 2) {
  engine::SyntheticDataOptions o;
  o.length = length;
  o.size = 5;
  o.seed = 3;
  if (classes == 0) {
    o.task = engine::SyntheticTask::kRegression;
    o.target_dim = 2;
  } else {
    o.classes = classes;
  }
  return std::shared_ptr<const engine::Dataset>(engine::MakeSyntheticDataset(o).value());
}

// y = x W^T + b, learnable by a Linear(5, 2).
std::shared_ptr<const engine::Dataset> LinearRegression(int64_t length) {
  torch::manual_seed(7);
  at::Tensor w = torch::randn({2, 5});  // the same function for every length
  at::Tensor x = torch::randn({length, 5});
  at::Tensor y = x.matmul(w.t()) + 0.5;
  return std::shared_ptr<const engine::Dataset>(engine::TensorDataset::Create(x, y).value());
}

TrainerSetup BaseSetup() {
  TrainerSetup s;
  s.options.epochs = 1;
  s.options.optimizer.kind = OptimizerKind::kSgd;
  s.options.optimizer.lr = 0.1;
  s.options.data.batch_size = 30;
  s.options.data.shuffle = true;
  s.options.metrics_every_steps = 1000;
  return s;
}

std::vector<at::Tensor> Params(engine::Model& m) {
  std::vector<at::Tensor> out;
  for (auto& [n, p] : m.NamedParameters()) out.push_back(p.detach().clone());
  return out;
}

absl::StatusOr<TrainResult> Train(const TrainerSetup& s, std::shared_ptr<engine::Model> m,
                                  std::shared_ptr<const engine::Dataset> train,
                                  std::shared_ptr<const engine::Dataset> eval = nullptr,
                                  std::vector<rankproto::RankMetric>* metrics = nullptr) {
  TrainerCallbacks cb;
  cb.on_metric = [metrics](const rankproto::RankMetric& r) {
    if (metrics != nullptr) metrics->push_back(r);
  };
  auto t = Trainer::Create(s, std::move(m), std::move(train), std::move(eval), nullptr, cb);
  if (!t.ok()) return t.status();
  return (*t)->Run();
}

TEST(TrainerTest, GradientAccumulationEqualsTheLargerBatch) {
  auto data = Synthetic(120);
  TrainerSetup big = BaseSetup();
  big.options.epochs = 2;
  auto a = Mlp({4});
  ASSERT_TRUE(Train(big, a, data).ok());

  TrainerSetup acc = big;
  acc.options.data.batch_size = 15;
  acc.options.grad_accumulation = 2;
  auto b = Mlp({4});
  std::vector<rankproto::RankMetric> metrics;
  auto r = Train(acc, b, data, nullptr, &metrics);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 8);  // 4 optimizer steps per epoch either way
  auto pa = Params(*a), pb = Params(*b);
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], 1e-5, 1e-6)) << i;
}

TEST(TrainerTest, ClippingBoundsTheGlobalGradientNorm) {
  auto data = Synthetic(30);
  TrainerSetup s = BaseSetup();
  s.options.optimizer.lr = 1.0;
  s.options.max_grad_norm = 0.01;
  auto m = Mlp();
  auto before = Params(*m);
  ASSERT_TRUE(Train(s, m, data).ok());
  auto after = Params(*m);
  double sq = 0;
  for (size_t i = 0; i < before.size(); ++i)
    sq += (after[i] - before[i]).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(sq), 0.01, 1e-4);  // one SGD step of lr 1 on the clipped gradient
}

// Issue #30: Adam at lr 1e6 ran to a loss of 8e23 and "succeeded". The
// divergence check (health.divergence.factor, default 1e4) fails it as a NaN
// at the first metric window; with the check off the same run completes.
TEST(TrainerTest, ARunawayLossIsANanFailureUnlessTheCheckIsOff) {
  auto data = Synthetic(600, 10);
  TrainerSetup s = BaseSetup();
  s.options.optimizer.kind = OptimizerKind::kAdam;
  s.options.optimizer.lr = 1e6;
  s.options.metrics_every_steps = 5;
  auto r = Train(s, Mlp({64}, 10), data);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kNan) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("loss diverged at step 4 (epoch 0)"));
  EXPECT_THAT(r.status().message(), HasSubstr("health.divergence.factor 10000"));

  s.options.health.divergence_factor = 0;
  auto off = Train(s, Mlp({64}, 10), data);
  EXPECT_TRUE(off.ok()) << off.status();

  // A healthy run at a sane rate is never flagged.
  s.options.health.divergence_factor = 1e4;
  s.options.optimizer.lr = 1e-3;
  auto sane = Train(s, Mlp({64}, 10), data);
  EXPECT_TRUE(sane.ok()) << sane.status();
}

TEST(TrainerTest, MseRegressionTrainsAndEvaluates) {
  auto data = LinearRegression(256);
  auto eval = LinearRegression(64);
  TrainerSetup s = BaseSetup();
  s.options.loss = LossKind::kMse;
  s.options.optimizer.kind = OptimizerKind::kAdam;
  s.options.optimizer.lr = 0.05;
  s.options.epochs = 8;
  s.options.data.batch_size = 32;
  s.options.metrics_every_steps = 4;
  std::vector<rankproto::RankMetric> metrics;
  auto r = Train(s, Mlp(), data, eval, &metrics);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<rankproto::RankMetric> ends;
  for (auto& m : metrics) {
    if (m.kind == "epoch_end") ends.push_back(m);
  }
  ASSERT_EQ(ends.size(), 8u);
  EXPECT_TRUE(ends.back().has_eval);
  EXPECT_EQ(ends.back().eval_samples, 64);
  EXPECT_LT(ends.back().loss, 0.2 * ends.front().loss);
  EXPECT_LT(ends.back().eval_loss, ends.front().eval_loss);
  EXPECT_EQ(metrics.front().kind, "train");
  EXPECT_EQ(metrics.front().step, 4);
  EXPECT_EQ(metrics.front().steps_per_epoch, 8);
}

TEST(TrainerTest, AdamWAndStepScheduleReportTheScheduledRate) {
  auto data = Synthetic(60);
  TrainerSetup s = BaseSetup();
  s.options.optimizer.kind = OptimizerKind::kAdamW;
  s.options.optimizer.weight_decay = 0.01;
  s.options.optimizer.lr = 0.1;
  s.options.lr_schedule.kind = ScheduleKind::kStep;
  s.options.lr_schedule.step_size = 2;
  s.options.lr_schedule.gamma = 0.5;
  s.options.data.batch_size = 10;  // 6 steps
  s.options.metrics_every_steps = 1;
  std::vector<rankproto::RankMetric> metrics;
  ASSERT_TRUE(Train(s, Mlp(), data, nullptr, &metrics).ok());
  std::vector<double> lrs;
  for (auto& m : metrics) {
    if (m.kind == "train") lrs.push_back(m.lr);
  }
  EXPECT_THAT(lrs, ::testing::ElementsAre(0.1, 0.1, 0.05, 0.05, 0.025, 0.025));
}

TEST(TrainerTest, CheckpointResumeIsBitwiseEqual) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_ckpt_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto data = Synthetic(90);
  TrainerSetup s = BaseSetup();
  s.options.optimizer.kind = OptimizerKind::kAdam;
  s.options.optimizer.lr = 0.01;
  s.options.epochs = 3;
  s.options.data.batch_size = 20;
  s.options.lr_schedule.kind = ScheduleKind::kCosine;
  s.options.lr_schedule.warmup_steps = 2;

  auto full = Mlp({6});
  ASSERT_TRUE(Train(s, full, data).ok());

  TrainerSetup first = s;
  first.options.checkpoint.dir = dir;
  first.options.checkpoint.keep = 1;
  first.options.checkpoint.every_epochs = 1;
  first.options.epochs = 3;
  // Stop after epoch 2 by training a 3-epoch schedule and interrupting it:
  // the stop flag fires after the first step of epoch 3.
  std::atomic<bool> stop{false};
  first.stop = &stop;
  TrainerCallbacks cb;
  cb.on_metric = [&stop](const rankproto::RankMetric& m) {
    if (m.kind == "epoch_end" && m.epoch == 1) stop = true;
  };
  auto part = Mlp({6});
  auto t = Trainer::Create(first, part, data, nullptr, nullptr, cb);
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kStopped);
  ASSERT_EQ(ListCheckpoints(dir, "").size(), 1u);  // keep = 1
  EXPECT_EQ(LatestCheckpoint(dir, ""), CheckpointPath(dir, "", 2));

  TrainerSetup resumed = s;
  resumed.options.checkpoint.dir = dir;
  resumed.resume_from = LatestCheckpoint(dir, "");
  auto fresh = Mlp({6});
  std::vector<rankproto::RankMetric> metrics;
  auto rr = Train(resumed, fresh, data, nullptr, &metrics);
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_EQ(rr->start_epoch, 2);
  EXPECT_EQ(rr->global_step, 15);
  auto pa = Params(*full), pb = Params(*fresh);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.pt"));
  std::filesystem::remove_all(dir);
}

// checkpoint.every_steps: a checkpoint inside an epoch records how far the
// epoch's order got, and a resume from it continues that epoch with the
// next unseen sample: the run ends with the uninterrupted run's parameters.
TEST(TrainerTest, MidEpochCheckpointContinuesTheEpochWhereItStopped) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_mid_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto data = Synthetic(150);  // 5 steps of 30 per epoch
  TrainerSetup s = BaseSetup();
  s.options.epochs = 2;
  s.options.metrics_every_steps = 1;
  auto full = Mlp({6});
  ASSERT_TRUE(Train(s, full, data).ok());

  TrainerSetup first = s;
  first.options.checkpoint.dir = dir;
  first.options.checkpoint.keep = 10;
  first.options.checkpoint.every_steps = 2;
  std::atomic<bool> stop{false};
  first.stop = &stop;
  TrainerCallbacks cb;
  std::vector<TrainingPosition> written;
  cb.on_checkpoint = [&written](const WrittenCheckpoint&, const TrainingPosition& p) {
    written.push_back(p);
  };
  cb.on_metric = [&stop](const rankproto::RankMetric& m) {
    if (m.kind == "train" && m.epoch == 1 && m.step == 1) stop = true;  // global step 6
  };
  auto part = Mlp({6});
  auto t = Trainer::Create(first, part, data, nullptr, nullptr, cb);
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kStopped);
  // Steps 2 and 4 inside epoch 0, the end of epoch 0 (step 5), step 6
  // inside epoch 1; then the stop.
  ASSERT_EQ(written.size(), 4u);
  EXPECT_EQ(written[0].epochs_done, 0);
  EXPECT_EQ(written[0].epoch_consumed, 60);
  EXPECT_EQ(written[1].epoch_consumed, 120);
  EXPECT_EQ(written[2].epochs_done, 1);
  EXPECT_EQ(written[2].epoch_consumed, 0);
  EXPECT_EQ(written[3].epochs_done, 1);
  EXPECT_EQ(written[3].epoch_consumed, 30);
  const std::vector<std::string> files = ListCheckpoints(dir, "");  // oldest first
  EXPECT_EQ(files, (std::vector<std::string>{
                       CheckpointPath(dir, "", 0, 60), CheckpointPath(dir, "", 0, 120),
                       CheckpointPath(dir, "", 1), CheckpointPath(dir, "", 1, 30)}));

  // Resume from the checkpoint inside epoch 0 (after 4 of 5 steps).
  TrainerSetup resumed = s;
  resumed.resume_from = CheckpointPath(dir, "", 0, 120);
  auto fresh = Mlp({6});
  auto rr = Train(resumed, fresh, data);
  ASSERT_TRUE(rr.ok()) << rr.status();
  EXPECT_EQ(rr->start_epoch, 0);
  EXPECT_EQ(rr->global_step, 10);
  auto pa = Params(*full), pb = Params(*fresh);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
  std::filesystem::remove_all(dir);
}

TEST(TrainerTest, CheckpointOfAnotherModelIsRejected) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_ckpt2_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  TrainerSetup s = BaseSetup();
  s.options.checkpoint.dir = dir;
  ASSERT_TRUE(Train(s, Mlp({6}), Synthetic(30)).ok());
  s.resume_from = LatestCheckpoint(dir, "");
  auto r = Train(s, Mlp({7}), Synthetic(30));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("the model expects"));
  auto r2 = Train(s, Mlp({6, 3}), Synthetic(30));
  ASSERT_FALSE(r2.ok());
  EXPECT_THAT(std::string(r2.status().message()), HasSubstr("another model"));
  std::filesystem::remove_all(dir);
}

// A checkpoint names its job: a resume that expects another job's file, or
// a file whose contents changed since it was recorded, is refused before
// anything is loaded; `keep` never deletes another job's files.
TEST(TrainerTest, CheckpointIdentityIsVerified) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_ckpt3_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Another job's checkpoint in the same directory.
  const std::string foreign = CheckpointPath(dir, "other-job", 1);
  { std::ofstream(foreign) << "not ours"; }

  TrainerSetup s = BaseSetup();
  s.options.epochs = 3;
  s.options.checkpoint.dir = dir;
  s.options.checkpoint.keep = 1;
  s.manifest.job_id = "job-a";
  s.manifest.attempt = 1;
  s.manifest.spec_hash = "h1";
  std::vector<WrittenCheckpoint> written;
  TrainerCallbacks cb;
  cb.on_checkpoint = [&](const WrittenCheckpoint& w, const TrainingPosition& p) {
    written.push_back(w);
    EXPECT_EQ(p.epochs_done, static_cast<int64_t>(written.size()));
  };
  auto t = Trainer::Create(s, Mlp({6}), Synthetic(30), nullptr, nullptr, cb);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run().ok());
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written.back().path, CheckpointPath(dir, "job-a", 3));
  EXPECT_EQ(ListCheckpoints(dir, "job-a"), std::vector<std::string>{written.back().path});
  EXPECT_TRUE(std::filesystem::exists(foreign));  // keep = 1 deleted only job-a's older files
  EXPECT_EQ(LatestCheckpoint(dir, "other-job"), foreign);
  auto bytes = ReadCheckpointBytes(written.back().path, written.back().checksum);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(static_cast<int64_t>(bytes->size()), written.back().size_bytes);

  TrainerSetup r = BaseSetup();
  r.options.epochs = 4;
  r.resume_from = written.back().path;
  r.resume_checksum = written.back().checksum;
  r.resume_job_id = "job-a";
  r.manifest.spec_hash = "h1";
  auto ok = Train(r, Mlp({6}), Synthetic(30));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->start_epoch, 3);

  TrainerSetup wrong_job = r;
  wrong_job.resume_job_id = "job-b";
  auto e1 = Train(wrong_job, Mlp({6}), Synthetic(30));
  ASSERT_FALSE(e1.ok());
  EXPECT_THAT(std::string(e1.status().message()),
              HasSubstr("was written by job 'job-a', not by 'job-b'"));
  EXPECT_EQ(FailureKindOf(e1.status()), FailureKind::kConfig);

  TrainerSetup wrong_spec = r;
  wrong_spec.manifest.spec_hash = "h2";
  auto e2 = Train(wrong_spec, Mlp({6}), Synthetic(30));
  ASSERT_FALSE(e2.ok());
  EXPECT_THAT(std::string(e2.status().message()), HasSubstr("another model or optimizer"));

  TrainerSetup corrupt = r;
  corrupt.resume_checksum = "crc32:00000000";
  auto e3 = Train(corrupt, Mlp({6}), Synthetic(30));
  ASSERT_FALSE(e3.ok());
  EXPECT_TRUE(absl::IsDataLoss(e3.status())) << e3.status();
  EXPECT_THAT(std::string(e3.status().message()), HasSubstr("is corrupt: checksum"));
  // Unreadable or replaced files are RESUME (the coordinator falls back to
  // an older record), not CONFIG.
  EXPECT_EQ(FailureKindOf(e3.status()), FailureKind::kResume);
  TrainerSetup missing = r;
  missing.resume_from = dir + "/job-a.ckpt-epoch-000009.pt";
  auto e4 = Train(missing, Mlp({6}), Synthetic(30));
  ASSERT_FALSE(e4.ok());
  EXPECT_EQ(FailureKindOf(e4.status()), FailureKind::kResume) << e4.status();
  std::filesystem::remove_all(dir);
}

// Under a worker daemon: per-host copies carry the writer in their names and
// the rank deletes none (keep is the coordinator's: fencing).
TEST(TrainerTest, PerHostCopiesNameTheirWriterAndADaemonsRankDeletesNone) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_writer_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  TrainerSetup s = BaseSetup();
  s.options.epochs = 3;
  s.options.checkpoint.dir = dir;
  s.options.checkpoint.keep = 1;
  s.options.checkpoint.prune = false;
  s.manifest.job_id = "job-w";
  s.manifest.writer = "w-host1";
  std::vector<std::string> written;
  TrainerCallbacks cb;
  cb.on_checkpoint = [&](const WrittenCheckpoint& w, const TrainingPosition&) {
    written.push_back(w.path);
  };
  auto t = Trainer::Create(s, Mlp({6}), Synthetic(30), nullptr, nullptr, cb);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run().ok());
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written.back(), dir + "/job-w.ckpt-epoch-000003.w-host1.pt");
  EXPECT_EQ(ListCheckpoints(dir, "job-w"), written) << "keep 1, but the rank deleted nothing";
  std::filesystem::remove_all(dir);
}

// The checkpoint dir is the job's: links planted at every name the writers
// used to open by path (the write probe, a checkpoint's and the model's
// temporary names, their final names) are never written through, and
// training succeeds.
TEST(TrainerTest, LinksPlantedInTheCheckpointDirAreNeverWrittenThrough) {
  namespace fs = std::filesystem;
  const std::string base = ::testing::TempDir() + "/trainer_test_links_" + std::to_string(getpid());
  fs::remove_all(base);
  const std::string dir = base + "/ckpt", victim = base + "/victim";
  fs::create_directories(dir);
  { std::ofstream(victim) << "precious"; }
  const std::string ckpt = CheckpointPath(dir, "job-l", 1);
  for (const std::string& name : {dir + "/.trainctl-write-probe." + std::to_string(getpid()),
                                  ckpt + ".tmp." + std::to_string(getpid()), ckpt,
                                  dir + "/model.pt.tmp", dir + "/model.pt"}) {
    fs::create_symlink(victim, name);
  }
  TrainerSetup s = BaseSetup();
  s.options.checkpoint.dir = dir;
  s.manifest.job_id = "job-l";
  auto r = Train(s, Mlp({6}), Synthetic(30));
  ASSERT_TRUE(r.ok()) << r.status();
  std::ifstream in(victim);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
            "precious");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(ckpt)));  // the link replaced, not followed
  EXPECT_TRUE(
      fs::is_symlink(dir + "/.trainctl-write-probe." + std::to_string(getpid())));  // left alone
  fs::remove_all(base);
}

// The same without root, through the file writer's fault seam: the disk
// fills while the epoch-2 checkpoint is written (epoch 1's went through) and
// an EIO hits a rename: each is a typed failure naming the checkpoint, and
// the checkpoint written before stays whole.
TEST(TrainerTest, InjectedWriteFaultsAreTypedAndKeepTheEarlierCheckpoint) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_faults_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  struct Case {
    FileOp op;
    int err;
    FailureKind kind;
  };
  for (const Case& c : {Case{FileOp::kWrite, ENOSPC, FailureKind::kDiskFull},
                        Case{FileOp::kRename, EIO, FailureKind::kOther}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    TrainerSetup s = BaseSetup();
    s.options.epochs = 2;
    s.options.checkpoint.dir = dir;
    s.manifest.job_id = "job-faults";
    const std::string second = CheckpointPath(dir, "job-faults", 2);
    FaultFileEnv env;
    env.Inject({c.op,
                std::filesystem::canonical(dir).string() + "/" +
                    std::filesystem::path(second).filename().string(),
                c.err});
    s.file_env = &env;
    auto r = Train(s, Mlp({8}), Synthetic(30));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(FailureKindOf(r.status()), c.kind) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(second)) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(std::strerror(c.err)));
    EXPECT_TRUE(std::filesystem::exists(CheckpointPath(dir, "job-faults", 1)))
        << "epoch 1's checkpoint stays";
    EXPECT_FALSE(std::filesystem::exists(second));
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
    }
  }
  std::filesystem::remove_all(dir);
}

// A full disk is a typed failure that names the path, the errno text and the
// size, and leaves no temporary file; an unwritable directory is a
// configuration error. Needs root to mount a tiny tmpfs.
TEST(TrainerTest, DiskFullIsTypedAndLeavesNoTemporaryFile) {
  const std::string dir = ::testing::TempDir() + "/trainer_test_full_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  if (std::system(("mount -t tmpfs -o size=8k tmpfs " + dir + " 2>/dev/null").c_str()) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  }
  TrainerSetup s = BaseSetup();
  s.options.checkpoint.dir = dir;
  s.manifest.job_id = "job-full";
  auto r = Train(s, Mlp({64, 64}), Synthetic(30));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kDiskFull) << r.status();
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr(CheckpointPath(dir, "job-full", 1)));
  EXPECT_THAT(msg, HasSubstr("No space left on device"));
  EXPECT_THAT(msg, HasSubstr("it needs "));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    ADD_FAILURE() << "left behind: " << e.path();
  }
  EXPECT_EQ(files, 0);
  EXPECT_EQ(std::system(("umount " + dir).c_str()), 0);
  std::filesystem::remove_all(dir);

  // A checkpoint dir below a regular file cannot be created: configuration.
  const std::string file = ::testing::TempDir() + "/trainer_test_file_" + std::to_string(getpid());
  { std::ofstream(file) << "x"; }
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckCheckpointDir(file + "/ckpt")));
  TrainerSetup bad = BaseSetup();
  bad.options.checkpoint.dir = file + "/ckpt";
  auto rb = Train(bad, Mlp({6}), Synthetic(30));
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(FailureKindOf(rb.status()), FailureKind::kConfig) << rb.status();
  std::filesystem::remove(file);
}

TEST(TrainerTest, CrossEntropyOnRegressionTargetsIsAConfigError) {
  TrainerSetup s = BaseSetup();
  auto r = Train(s, Mlp(), Synthetic(30, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kConfig);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("training.loss"));
}

TEST(TrainerTest, WrongInputWidthIsAConfigError) {
  TrainerSetup s = BaseSetup();
  engine::ModelOptions o;
  o.name = "mlp";
  o.mlp.input_dim = 7;  // the data has 5 features
  std::shared_ptr<engine::Model> m = engine::CreateModel(o).value();
  auto r = Train(s, m, Synthetic(30));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(FailureKindOf(r.status()), FailureKind::kConfig) << r.status();
}

TEST(TrainerTest, Bf16AutocastOnCpuTrains) {
  auto data = LinearRegression(256);
  TrainerSetup s = BaseSetup();
  s.options.loss = LossKind::kMse;
  s.options.optimizer.kind = OptimizerKind::kAdam;
  s.options.optimizer.lr = 0.05;
  s.options.epochs = 6;
  s.options.data.batch_size = 32;
  s.options.amp.enabled = true;
  s.options.amp.dtype = AmpDtype::kBFloat16;
  std::vector<rankproto::RankMetric> metrics;
  auto r = Train(s, Mlp(), data, nullptr, &metrics);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> losses;
  for (auto& m : metrics) {
    if (m.kind == "epoch_end") losses.push_back(m.loss);
  }
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), 0.3 * losses.front());
}

#if TRAINCTL_HAVE_GLOO
using dist::testing::SingleRankGloo;

// ddp.gradient_as_bucket_view through the training loop (a 1-rank Gloo
// group, so the bucketer runs): after every step's zero_grad each gradient
// is still its bucket slice, zeroed in place (on LibTorch 1.x and 2.x
// alike), so no step copies a gradient; Adam ends on the same bytes as with
// the copies.
TEST(TrainerTest, BucketViewGradientsStayInTheBucketAcrossSteps) {
  auto data = Synthetic(240);
  std::vector<std::vector<at::Tensor>> finals;
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "gradient_as_bucket_view" : "copy");
    TrainerSetup s = BaseSetup();
    s.options.optimizer.kind = OptimizerKind::kAdam;
    s.options.optimizer.lr = 0.01;
    s.options.epochs = 2;
    s.options.ddp.gradient_as_bucket_view = view;
    auto m = Mlp({16, 16});
    std::vector<const void*> slots;  // each step's gradient addresses, after zero_grad
    int64_t steps = 0;
    TrainerCallbacks cb;
    cb.on_step_samples = [&](int64_t, int64_t, const std::vector<int64_t>&) {
      ++steps;
      if (!view) return;
      std::vector<const void*> now;
      at::Tensor first;
      for (auto& [name, p] : m->NamedParameters()) {
        const at::Tensor& g = p.grad();
        ASSERT_TRUE(g.defined()) << name;
        EXPECT_TRUE(torch::equal(g, torch::zeros_like(g))) << name << " not zeroed";
        if (!first.defined()) first = g;
        // The model is one bucket: every gradient lives in its storage.
        EXPECT_TRUE(g.storage().is_alias_of(first.storage())) << name;
        now.push_back(g.data_ptr());
      }
      if (slots.empty()) slots = now;
      EXPECT_EQ(now, slots) << "a gradient left its bucket slot at step " << steps;
    };
    auto t = Trainer::Create(s, m, data, nullptr, SingleRankGloo(), cb);
    ASSERT_TRUE(t.ok()) << t.status();
    auto r = (*t)->Run();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(steps, 16);
    finals.push_back(Params(*m));
  }
  ASSERT_EQ(finals[0].size(), finals[1].size());
  for (size_t i = 0; i < finals[0].size(); ++i)
    EXPECT_TRUE(torch::equal(finals[0][i], finals[1][i]));
}
#endif

}  // namespace
}  // namespace trainctl::trainer

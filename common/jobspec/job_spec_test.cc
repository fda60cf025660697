#include "common/jobspec/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/jobspec/spec_test_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace trainctl {
namespace {

using namespace testing_spec;  // NOLINT: kBase, Errors, Source, matchers

TEST(JobSpecTest, MinimalSpecGetsEveryDefault) {
  ParsedJobSpec r = ParseJobSpecYaml(kBase, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  const v1::JobSpec& s = r.spec;
  EXPECT_EQ(s.name(), "j");
  EXPECT_EQ(s.world_size(), 1);
  EXPECT_EQ(s.device(), v1::DEVICE_AUTO);
  EXPECT_EQ(s.backend(), v1::BACKEND_AUTO);
  EXPECT_EQ(s.data().batch_size(), 32);
  EXPECT_TRUE(s.data().shuffle());
  EXPECT_EQ(s.data().num_workers(), 0);
  EXPECT_TRUE(s.data().pin_memory());
  EXPECT_FALSE(s.data().drop_last());
  EXPECT_FALSE(s.data().has_eval());
  EXPECT_EQ(s.training().epochs(), 1);
  EXPECT_EQ(s.training().loss(), v1::LOSS_CROSS_ENTROPY);
  EXPECT_EQ(s.training().optimizer().name(), v1::OPTIMIZER_ADAM);
  EXPECT_DOUBLE_EQ(s.training().optimizer().lr(), 0.001);
  EXPECT_DOUBLE_EQ(s.training().optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(s.training().optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(s.training().optimizer().eps(), 1e-8);
  EXPECT_EQ(s.training().lr_schedule().name(), v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(s.training().grad_accumulation(), 1);
  EXPECT_FALSE(s.training().amp().enabled());
  EXPECT_EQ(s.training().amp().dtype(), v1::AMP_DTYPE_BF16);
  EXPECT_DOUBLE_EQ(s.ddp().bucket_cap_mb(), 25);
  EXPECT_TRUE(s.ddp().broadcast_buffers());
  EXPECT_FALSE(s.ddp().find_unused_parameters());
  EXPECT_TRUE(s.ddp().gradient_as_bucket_view());
  // PyTorch's PowerSGDState defaults.
  EXPECT_EQ(s.ddp().powersgd().rank(), 1);
  EXPECT_EQ(s.ddp().powersgd().start_iter(), 1000);
  EXPECT_DOUBLE_EQ(s.ddp().powersgd().min_compression_rate(), 2);
  EXPECT_TRUE(s.ddp().powersgd().use_error_feedback());
  EXPECT_TRUE(s.ddp().powersgd().warm_start());
  EXPECT_EQ(s.checkpoint().every_epochs(), 1);
  EXPECT_EQ(s.checkpoint().keep(), 2);
  EXPECT_EQ(s.restart().max_restarts(), 3);
  EXPECT_EQ(s.metrics().every_steps(), 20);
}

// queue: (docs/queues.md) is a top-level key; priority is optional, so a
// file without it leaves it unset for the queue's default_priority.
TEST(JobSpecTest, QueueKeyAndUnsetPriority) {
  const std::string base =
      "name: q-job\nworld_size: 2\nmodel: {name: mlp, input_dim: 5, classes: 2}\n"
      "data: {train: {format: synthetic, length: 100, size: 5, classes: 2}}\n";
  ParsedJobSpec r = ParseJobSpecYaml(base + "queue: team-a\n", "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  EXPECT_EQ(r.spec.queue(), "team-a");
  EXPECT_FALSE(r.spec.has_priority()) << "no priority: key leaves it to the queue";
  r = ParseJobSpecYaml(base + "queue: team-a\npriority: 0\n", "job.yaml", {"queue=team-b"});
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  EXPECT_EQ(r.spec.queue(), "team-b") << "--set overrides the file";
  EXPECT_TRUE(r.spec.has_priority()) << "an explicit 0 is kept";
  r = ParseJobSpecYaml(base, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  EXPECT_EQ(r.spec.queue(), "") << "no queue: the coordinator picks (token's first, else default)";
}

TEST(JobSpecTest, EveryFieldIsRead) {
  const std::string yaml = R"(
name: full-job-1
world_size: 8
device: cuda
backend: nccl
priority: 5
model: {name: cnn, classes: 10, batch_norm: true, conv1_channels: 16, conv2_channels: 24, hidden: 64, image_size: 32}
data:
  train: {format: idx, images: /d/train-images.gz, labels: /d/train-labels.gz}
  eval: {format: csv, path: /d/eval.csv, label_column: y, header: false}
  batch_size: 128
  shuffle: false
  seed: 42
  drop_last: true
  num_workers: 3
  pin_memory: false
training:
  epochs: 7
  loss: cross_entropy
  optimizer: {name: sgd, lr: 0.5, weight_decay: 0.0001, momentum: 0.9, beta1: 0.8, beta2: 0.99, eps: 1.0e-6}
  lr_schedule: {name: step, warmup_steps: 10, step_size: 100, gamma: 0.5, min_lr: 0.01}
  grad_accumulation: 4
  max_grad_norm: 1.5
  amp: {enabled: true, dtype: fp16}
ddp: {bucket_cap_mb: 5.5, broadcast_buffers: false, find_unused_parameters: true, comm_hook: bf16_compress,
      gradient_as_bucket_view: false}
checkpoint: {dir: /ckpt, every_epochs: 2, keep: 5}
restart: {max_restarts: 0, progress_timeout_s: 120}
metrics: {every_steps: 7}
)";
  ParsedJobSpec r = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  const v1::JobSpec& s = r.spec;
  EXPECT_EQ(s.name(), "full-job-1");
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_EQ(s.device(), v1::DEVICE_CUDA);
  EXPECT_EQ(s.backend(), v1::BACKEND_NCCL);
  EXPECT_EQ(s.priority(), 5);
  ASSERT_TRUE(s.model().has_cnn());
  EXPECT_EQ(s.model().cnn().classes(), 10);
  EXPECT_TRUE(s.model().cnn().batch_norm());
  EXPECT_EQ(s.model().cnn().conv1_channels(), 16);
  EXPECT_EQ(s.model().cnn().conv2_channels(), 24);
  EXPECT_EQ(s.model().cnn().hidden(), 64);
  EXPECT_EQ(s.model().cnn().image_size(), 32);
  ASSERT_TRUE(s.data().train().has_idx());
  EXPECT_EQ(s.data().train().idx().images(), "/d/train-images.gz");
  EXPECT_EQ(s.data().train().idx().labels(), "/d/train-labels.gz");
  ASSERT_TRUE(s.data().eval().has_csv());
  EXPECT_EQ(s.data().eval().csv().path(), "/d/eval.csv");
  EXPECT_EQ(s.data().eval().csv().label_column(), "y");
  EXPECT_FALSE(s.data().eval().csv().header());
  EXPECT_EQ(s.data().batch_size(), 128);
  EXPECT_FALSE(s.data().shuffle());
  EXPECT_EQ(s.data().seed(), 42u);
  EXPECT_TRUE(s.data().drop_last());
  EXPECT_EQ(s.data().num_workers(), 3);
  EXPECT_FALSE(s.data().pin_memory());
  EXPECT_EQ(s.training().epochs(), 7);
  EXPECT_EQ(s.training().optimizer().name(), v1::OPTIMIZER_SGD);
  EXPECT_DOUBLE_EQ(s.training().optimizer().lr(), 0.5);
  EXPECT_DOUBLE_EQ(s.training().optimizer().weight_decay(), 0.0001);
  EXPECT_DOUBLE_EQ(s.training().optimizer().momentum(), 0.9);
  EXPECT_DOUBLE_EQ(s.training().optimizer().beta1(), 0.8);
  EXPECT_DOUBLE_EQ(s.training().optimizer().beta2(), 0.99);
  EXPECT_DOUBLE_EQ(s.training().optimizer().eps(), 1e-6);
  EXPECT_EQ(s.training().lr_schedule().name(), v1::LR_SCHEDULE_STEP);
  EXPECT_EQ(s.training().lr_schedule().warmup_steps(), 10);
  EXPECT_EQ(s.training().lr_schedule().step_size(), 100);
  EXPECT_DOUBLE_EQ(s.training().lr_schedule().gamma(), 0.5);
  EXPECT_DOUBLE_EQ(s.training().lr_schedule().min_lr(), 0.01);
  EXPECT_EQ(s.training().grad_accumulation(), 4);
  EXPECT_DOUBLE_EQ(s.training().max_grad_norm(), 1.5);
  EXPECT_TRUE(s.training().amp().enabled());
  EXPECT_EQ(s.training().amp().dtype(), v1::AMP_DTYPE_FP16);
  EXPECT_DOUBLE_EQ(s.ddp().bucket_cap_mb(), 5.5);
  EXPECT_FALSE(s.ddp().broadcast_buffers());
  EXPECT_TRUE(s.ddp().find_unused_parameters());
  EXPECT_EQ(s.ddp().comm_hook(), v1::DDP_COMM_HOOK_BF16_COMPRESS);
  ASSERT_TRUE(s.ddp().has_gradient_as_bucket_view());
  EXPECT_FALSE(s.ddp().gradient_as_bucket_view());
  EXPECT_EQ(s.checkpoint().dir(), "/ckpt");
  EXPECT_EQ(s.checkpoint().every_epochs(), 2);
  EXPECT_EQ(s.checkpoint().keep(), 5);
  EXPECT_EQ(s.restart().max_restarts(), 0);
  EXPECT_EQ(s.restart().progress_timeout_s(), 120);
  EXPECT_EQ(s.metrics().every_steps(), 7);
}

TEST(JobSpecTest, OtherModelsAndDatasets) {
  ParsedJobSpec r = ParseJobSpecYaml(R"(
name: ts
model: {name: torchscript, path: /m/model.pt}
data:
  train: {format: tensors, path: /d/train.pt}
  eval: {format: synthetic, length: 10, size: 3, classes: 0, target_dim: 2, seed: 9}
training: {loss: mse, optimizer: {name: adamw}, lr_schedule: {name: cosine, warmup_steps: 5}}
)",
                                     "job.yaml");
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  EXPECT_EQ(r.spec.model().torchscript().path(), "/m/model.pt");
  EXPECT_EQ(r.spec.data().train().tensors().path(), "/d/train.pt");
  EXPECT_EQ(r.spec.data().train().tensors().inputs_key(), "inputs");
  EXPECT_EQ(r.spec.data().train().tensors().targets_key(), "targets");
  const v1::SyntheticData& e = r.spec.data().eval().synthetic();
  EXPECT_EQ(e.length(), 10);
  EXPECT_EQ(e.size(), 3);
  EXPECT_EQ(e.target_dim(), 2);
  EXPECT_EQ(e.seed(), 9u);
  EXPECT_EQ(r.spec.training().loss(), v1::LOSS_MSE);
  EXPECT_EQ(r.spec.training().optimizer().name(), v1::OPTIMIZER_ADAMW);
  EXPECT_EQ(r.spec.training().lr_schedule().name(), v1::LR_SCHEDULE_COSINE);

  ParsedJobSpec mlp = ParseJobSpecYaml(
      "name: m\nmodel: {name: mlp, input_dim: 256, hidden: [1024, 1024], classes: 10}\n"
      "data: {train: {format: synthetic, length: 64, size: 256, classes: 10}}\n",
      "job.yaml");
  ASSERT_TRUE(mlp.ok()) << mlp.errors[0].ToString();
  EXPECT_THAT(mlp.spec.model().mlp().hidden(), ElementsAre(1024, 1024));
}

TEST(JobSpecTest, ExamplesValidate) {
  for (const char* f : {"examples/mlp-synthetic.yaml", "examples/fashion-mnist-cnn.yaml",
                        "examples/fashion-mnist-bf16.yaml", "examples/ddp-script/job.yaml"}) {
    ParsedJobSpec r = ParseJobSpecFile(Source(f));
    EXPECT_TRUE(r.ok()) << f << ": " << (r.errors.empty() ? "" : r.errors[0].ToString());
  }
}

TEST(JobSpecTest, YamlRoundTripIsExact) {
  for (const char* f : {"examples/mlp-synthetic.yaml", "examples/fashion-mnist-cnn.yaml",
                        "examples/fashion-mnist-bf16.yaml", "examples/ddp-script/job.yaml"}) {
    ParsedJobSpec r = ParseJobSpecFile(Source(f));
    ASSERT_TRUE(r.ok()) << f;
    std::string yaml = JobSpecToYaml(r.spec);
    ParsedJobSpec again = ParseJobSpecYaml(yaml, "round-trip.yaml");
    ASSERT_TRUE(again.ok()) << again.errors[0].ToString() << "\n" << yaml;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r.spec, again.spec)) << yaml;
  }
}

TEST(JobSpecTest, FlatFormForRankProcesses) {
  ParsedJobSpec r = ParseJobSpecFile(Source("examples/fashion-mnist-cnn.yaml"));
  ASSERT_TRUE(r.ok());
  std::map<std::string, std::string> flat = JobSpecToFlat(r.spec);
  EXPECT_EQ(flat["model.name"], "cnn");
  EXPECT_EQ(flat["model.batch_norm"], "true");
  EXPECT_EQ(flat["model.conv1_channels"], "32");
  EXPECT_EQ(flat["data.train.format"], "idx");
  EXPECT_EQ(flat["data.eval.labels"],
            "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(flat["training.optimizer.name"], "adam");
  EXPECT_EQ(flat["training.optimizer.lr"], "0.001");
  EXPECT_EQ(flat["training.lr_schedule.name"], "cosine");
  EXPECT_EQ(flat["training.amp.dtype"], "bf16");
  EXPECT_EQ(flat["ddp.bucket_cap_mb"], "25");
  EXPECT_EQ(flat["ddp.comm_hook"], "none");
  EXPECT_EQ(flat["ddp.gradient_as_bucket_view"], "true");
  EXPECT_EQ(flat["data.shuffle"], "true");
  ParsedJobSpec mlp = ParseJobSpecFile(Source("examples/mlp-synthetic.yaml"));
  std::map<std::string, std::string> f2 = JobSpecToFlat(mlp.spec);
  EXPECT_EQ(f2["model.hidden"], "");
  EXPECT_EQ(f2.count("data.eval.format"), 0u);
}

struct BadCase {
  const char* what;
  std::string yaml;
  std::vector<std::string> errors;
};

TEST(JobSpecTest, BadInputsGetExactMessages) {
  const std::string b = kBase;
  const std::vector<BadCase> cases = {
      {"empty file",
       "",
       {"job.yaml:1:1: the file is empty; a job needs at least name, model and data.train"}},
      {"only a comment",
       "# nothing\n",
       {"job.yaml:1:1: the file is empty; a job needs at least name, model and data.train"}},
      {"not yaml",
       "name: [unclosed\n",
       {"job.yaml:2:1: not valid YAML: end of sequence flow not found"}},
      {"a list at top",
       "- a\n- b\n",
       {"job.yaml:1:1: must be a mapping of job fields, got a list"}},
      {"a scalar at top",
       "hello\n",
       {"job.yaml:1:1: must be a mapping of job fields, got a scalar"}},
      {"two documents",
       b + "---\nname: k\n",
       {"job.yaml:1:1: holds several YAML documents; a job.yaml holds one"}},
      // yaml-cpp's LoadAll never returned on these (fuzz_job_yaml).
      {"scalar then a stray comma",
       "'',s''",
       {"job.yaml:1:1: not valid YAML: ',' outside [] or {} at the start of a line or after a "
        "quoted or [] / {} value"}},
      // The fuzzer's input, past that check: the parser no longer loops.
      {"quoted scalars then commas",
       "'NUL' '''''''',s''',s''Y",
       {"job.yaml:1:1: holds several YAML documents; a job.yaml holds one"}},
      {"quoted scalars then a comma",
       "'a' '',",
       {"job.yaml:1:1: holds several YAML documents; a job.yaml holds one"}},
      {"negative world size",
       b + "world_size: -2\n",
       {"job.yaml:5:13: world_size: must be > 0, got -2"}},
      {"zero world size", b + "world_size: 0\n", {"job.yaml:5:13: world_size: must be > 0, got 0"}},
      {"huge number",
       b + "world_size: 99999999999999999999\n",
       {"job.yaml:5:13: world_size: must be an integer, got '99999999999999999999' (out of "
        "range)"}},
      {"int32 overflow",
       b + "world_size: 4294967296\n",
       {"job.yaml:5:13: world_size: must be an integer, got '4294967296' (out of range)"}},
      {"word for a number",
       b + "world_size: two\n",
       {"job.yaml:5:13: world_size: must be an integer, got 'two'"}},
      {"quoted number",
       b + "world_size: \"2\"\n",
       {"job.yaml:5:13: world_size: must be an integer, got the string '2'"}},
      {"fraction for an integer",
       b + "world_size: 1.5\n",
       {"job.yaml:5:13: world_size: must be an integer, got '1.5'"}},
      {"duplicate key",
       b + "world_size: 1\nworld_size: 2\n",
       {"job.yaml:6:1: world_size: duplicate key (first at line 5)"}},
      {"unknown top-level key",
       b + "wrold_size: 2\n",
       {"job.yaml:5:1: wrold_size: unknown key; did you mean 'world_size'?"}},
      {"unknown key, no suggestion", b + "zzz: 1\n", {"job.yaml:5:1: zzz: unknown key"}},
      {"bad enum",
       b + "device: gpu\n",
       {"job.yaml:5:9: device: must be one of auto, cuda, cpu, got 'gpu'; did you mean 'cpu'?"}},
      {"unspecified is not a value",
       b + "device: unspecified\n",
       {"job.yaml:5:9: device: must be one of auto, cuda, cpu, got 'unspecified'"}},
      {"negative lr",
       b + "training:\n  optimizer: {name: adam, lr: -1}\n",
       {"job.yaml:6:31: training.optimizer.lr: must be > 0, got -1"}},
      {"zero lr written",
       b + "training:\n  optimizer: {lr: 0}\n",
       {"job.yaml:6:19: training.optimizer.lr: must be > 0, got 0"}},
      {"misspelt section",
       b + "training:\n  optimzer: {name: adam}\n",
       {"job.yaml:6:3: training.optimzer: unknown key in training; did you mean 'optimizer'?"}},
      {"key one level too high",
       b + "training:\n  lr: 0.1\n",
       {"job.yaml:6:3: training.lr: unknown key in training; did you mean 'optimizer.lr'?"}},
      {"misspelt optimizer",
       b + "training:\n  optimizer: {name: adma}\n",
       {"job.yaml:6:21: training.optimizer.name: must be one of sgd, adam, adamw, got 'adma'; did "
        "you mean 'adam'?"}},
      {"yes is not a bool",
       b + "training:\n  amp: {enabled: yes}\n",
       {"job.yaml:6:18: training.amp.enabled: must be true or false, got 'yes'"}},
      {"section as a list",
       b + "training: [1, 2]\n",
       {"job.yaml:5:11: training: must be a mapping, got a list"}},
      {"missing value",
       b + "training:\n  epochs:\n",
       {"job.yaml:7:1: training.epochs: missing value"}},
      {"step schedule without step size",
       b + "training:\n  lr_schedule: {name: step}\n",
       {"job.yaml:6:16: training.lr_schedule.step_size: required for name: step"}},
      {"nccl on cpu",
       b + "device: cpu\nbackend: nccl\n",
       {"job.yaml:6:10: backend: nccl needs device: cuda (use gloo or auto on cpu)"}},
      {"gloo on cuda",
       b + "device: cuda\nbackend: gloo\n",
       {"job.yaml:6:10: backend: gloo runs on CPU tensors; use nccl (or auto) with device: cuda"}},
      {"fp16 on cpu",
       b + "device: cpu\ntraining: {amp: {enabled: true, dtype: fp16}}\n",
       {"job.yaml:6:40: training.amp.dtype: fp16 autocast needs device: cuda; use bf16 on cpu"}},
      {"zero bucket",
       b + "ddp: {bucket_cap_mb: 0}\n",
       {"job.yaml:5:22: ddp.bucket_cap_mb: must be in (0, 4096], got 0"}},
      {"powersgd rank 0",
       b + "ddp: {powersgd: {rank: 0}}\n",
       {"job.yaml:5:24: ddp.powersgd.rank: must be > 0, got 0"}},
      {"powersgd negative start",
       b + "ddp: {powersgd: {start_iter: -1}}\n",
       {"job.yaml:5:30: ddp.powersgd.start_iter: must be >= 0, got -1"}},
      {"powersgd compression rate below 1",
       b + "ddp: {powersgd: {min_compression_rate: 0.5}}\n",
       {"job.yaml:5:40: ddp.powersgd.min_compression_rate: must be >= 1 (a matrix is compressed "
        "only when that many times smaller), got 0.5"}},
      {"bucket view not a bool",
       b + "ddp: {gradient_as_bucket_view: 1}\n",
       {"job.yaml:5:32: ddp.gradient_as_bucket_view: must be true or false, got '1'"}},
      {"unknown comm hook",
       b + "ddp: {comm_hook: topk}\n",
       {"job.yaml:5:18: ddp.comm_hook: must be one of none, fp16_compress, bf16_compress, "
        "powersgd, got 'topk'"}},
      {"nan",
       b + "training: {max_grad_norm: .nan}\n",
       {"job.yaml:5:27: training.max_grad_norm: must be a number, got '.nan'"}},
      {"infinity",
       b + "training: {max_grad_norm: 1e999}\n",
       {"job.yaml:5:27: training.max_grad_norm: must be a number, got '1e999' (must be finite)"}},
      {"momentum for adam",
       b + "training: {optimizer: {momentum: 0.9}}\n",
       {"job.yaml:5:34: training.optimizer.momentum: only for name: sgd (Adam uses beta1)"}},
      {"bad gamma",
       b + "training: {lr_schedule: {name: step, step_size: 5, gamma: 2}}\n",
       {"job.yaml:5:59: training.lr_schedule.gamma: must be in (0, 1], got 2"}},
      {"bad name",
       "name: Bad_Name\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {train: {format: "
       "synthetic, length: 100, size: 5, classes: 2}}\n",
       {"job.yaml:1:7: name: must be lower-case letters, digits and '-', starting and ending with "
        "a letter or digit, got 'Bad_Name'"}},
      {"long name",
       "name: " + std::string(64, 'a') +
           "\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {train: {format: synthetic, "
           "length: 100, size: 5, classes: 2}}\n",
       {"job.yaml:1:7: name: at most 63 characters, got 64"}},
      {"unknown model",
       "name: j\nmodel: {name: transformer}\ndata: {train: {format: synthetic, length: 100, size: "
       "5, classes: 2}}\n",
       {"job.yaml:2:15: model.name: must be one of mlp, cnn, torchscript, got 'transformer'"}},
      {"model without name",
       "name: j\nmodel: {classes: 2}\ndata: {train: {format: synthetic, length: 100, size: 5, "
       "classes: 2}}\n",
       {"job.yaml:2:8: model.name: required: one of mlp, cnn, torchscript"}},
      {"key of another model",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2, batch_norm: true}\ndata: {train: "
       "{format: synthetic, length: 100, size: 5, classes: 2}}\n",
       {"job.yaml:2:46: model.batch_norm: unknown key in model"}},
      {"no train set",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {}\n",
       {"job.yaml:3:7: data.train: required (format: synthetic, idx, csv or tensors)"}},
      {"bad format",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {train: {format: parquet, "
       "path: x}}\n",
       {"job.yaml:3:24: data.train.format: must be one of synthetic, idx, csv, tensors, got "
        "'parquet'"}},
      {"shape mismatch",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata:\n  train: {format: synthetic, "
       "length: 100, size: 7, classes: 2}\n",
       {"job.yaml:4:49: data.train.size: must equal model.input_dim (5), got 7"}},
      {"regression data for cross-entropy",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata:\n  train: {format: synthetic, "
       "length: 100, size: 5}\n",
       {"job.yaml:4:10: data.train.classes: cross_entropy needs class targets: set classes > 0 or "
        "loss: mse"}},
      {"nothing required",
       "world_size: 2\n",
       {"job.yaml:1:1: name: required",
        "job.yaml:1:1: model: required (name: mlp, cnn or torchscript), or a command: block",
        "job.yaml:1:1: data.train: required (format: synthetic, idx, csv or tensors)"}},
      {"several errors at once",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2, hidden: [8, -1, x]}\ndata:\n  train: "
       "{format: idx, images: a}\n",
       {"job.yaml:2:58: model.hidden[1]: must be > 0, got -1",
        "job.yaml:2:62: model.hidden[2]: must be an integer, got 'x'",
        "job.yaml:4:10: data.train.labels: required"}},
      {"cnn image size",
       "name: j\nmodel: {name: cnn, classes: 10, image_size: 30}\ndata: {train: {format: idx, "
       "images: a, labels: b}}\n",
       {"job.yaml:2:45: model.image_size: must be a multiple of 4 (two 2x2 poolings), got 30"}},
      {"negative seed",
       "name: j\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {seed: -1, train: {format: "
       "synthetic, length: 100, size: 5, classes: 2}}\n",
       {"job.yaml:3:14: data.seed: must be an integer, got '-1' (must not be negative)"}},
      {"NUL bytes",
       std::string("name: j\0\x01\x02", 10),
       {"job.yaml:1:1: not a text file (it contains NUL bytes)"}},
  };
  int checked = 0;
  for (const BadCase& c : cases) {
    std::vector<std::string> got = Errors(c.yaml);
    EXPECT_EQ(got, c.errors) << "case: " << c.what;
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(JobSpecTest, ElasticBlockIsReadResolvedAndChecked) {
  ParsedJobSpec p = ParseJobSpecYaml(
      std::string(kBase) +
          "world_size: 4\nelastic: {min_ranks: 2}\ncheckpoint: {every_steps: 50}\n",
      "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.elastic().min_ranks(), 2);
  EXPECT_EQ(p.spec.elastic().replace_timeout_s(), 60);
  EXPECT_EQ(p.spec.elastic().grow(), v1::ELASTIC_GROW_AT_CHECKPOINT);
  EXPECT_FALSE(p.spec.elastic().keep_global_batch());
  EXPECT_EQ(p.spec.checkpoint().every_steps(), 50);
  ParsedJobSpec q =
      ParseJobSpecYaml(kBase, "job.yaml",
                       {"world_size=3", "elastic.grow=never", "elastic.keep_global_batch=true",
                        "elastic.min_ranks=1", "elastic.replace_timeout_s=0"});
  ASSERT_TRUE(q.ok()) << q.errors[0].ToString();
  EXPECT_EQ(q.spec.elastic().grow(), v1::ELASTIC_GROW_NEVER);
  EXPECT_EQ(q.spec.elastic().replace_timeout_s(), 0);
  EXPECT_TRUE(q.spec.elastic().keep_global_batch());

  EXPECT_EQ(Errors(std::string(kBase) + "world_size: 2\nelastic: {min_ranks: 3}\n"),
            std::vector<std::string>{
                "job.yaml:6:22: elastic.min_ranks: must be in [1, world_size = 2], got 3"});
  EXPECT_EQ(Errors(std::string(kBase) + "elastic: {min_ranks: 1, replace_timeout_s: -1}\n").size(),
            1u);
  EXPECT_EQ(Errors(std::string(kBase) + "elastic: {grow: sometimes}\n").size(), 1u);
  EXPECT_EQ(Errors(std::string(kBase) + "checkpoint: {every_steps: -2}\n").size(), 1u);
}

// ddp.powersgd: what is written is kept, the rest gets PyTorch's defaults,
// and start_iter 0 (PowerSGD from the first step) is a value, not "unset".
TEST(JobSpecTest, PowerSgdIsReadWithDefaultsAndChecked) {
  ParsedJobSpec p = ParseJobSpecYaml(
      std::string(kBase) +
          "ddp: {comm_hook: powersgd, powersgd: {rank: 4, start_iter: 0, warm_start: false}}\n",
      "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.ddp().comm_hook(), v1::DDP_COMM_HOOK_POWERSGD);
  EXPECT_EQ(p.spec.ddp().powersgd().rank(), 4);
  EXPECT_EQ(p.spec.ddp().powersgd().start_iter(), 0);
  EXPECT_FALSE(p.spec.ddp().powersgd().warm_start());
  EXPECT_TRUE(p.spec.ddp().powersgd().use_error_feedback());
  EXPECT_DOUBLE_EQ(p.spec.ddp().powersgd().min_compression_rate(), 2);
  auto flat = JobSpecToFlat(p.spec);
  EXPECT_EQ(flat["ddp.comm_hook"], "powersgd");
  EXPECT_EQ(flat["ddp.powersgd.start_iter"], "0");
  EXPECT_EQ(flat["ddp.powersgd.warm_start"], "false");

  EXPECT_EQ(
      Errors(std::string(kBase) + "ddp: {powersgd: {rank: 1025}}\n"),
      std::vector<std::string>{"job.yaml:5:24: ddp.powersgd.rank: must be in [1, 1024], got 1025"});
  EXPECT_EQ(Errors(std::string(kBase) + "ddp: {powersgd: {min_compression_rate: .inf}}\n").size(),
            1u);
  EXPECT_EQ(Errors(std::string(kBase) + "ddp: {powersgd: {use_error_feedback: maybe}}\n").size(),
            1u);
}

TEST(JobSpecTest, HealthIsReadAndChecked) {
  ParsedJobSpec p =
      ParseJobSpecYaml(std::string(kBase) +
                           "health: {on_nan: fail, max_rollbacks: 0, min_loss_scale: 0.5, "
                           "max_skipped_steps: 7, debug_nan_at_step: 12}\n",
                       "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.health().on_nan(), v1::HealthSpec::ON_NAN_FAIL);
  EXPECT_TRUE(p.spec.health().has_max_rollbacks());
  EXPECT_EQ(p.spec.health().max_rollbacks(), 0);
  EXPECT_EQ(p.spec.health().min_loss_scale(), 0.5);
  EXPECT_EQ(p.spec.health().max_skipped_steps(), 7);
  EXPECT_EQ(p.spec.health().debug_nan_at_step(), 12);
  EXPECT_EQ(JobSpecToFlat(p.spec).at("health.debug_nan_at_step"), "12");
  EXPECT_EQ(Errors(std::string(kBase) + "health: {max_rollbacks: -1}\n"),
            std::vector<std::string>{"job.yaml:5:25: health.max_rollbacks: must be >= 0, got -1"});
  EXPECT_EQ(Errors(std::string(kBase) + "health: {min_loss_scale: -2}\n"),
            std::vector<std::string>{"job.yaml:5:26: health.min_loss_scale: must be >= 0, got -2"});
  EXPECT_THAT(Errors(std::string(kBase) + "health: {on_nan: retry}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "health.on_nan: must be one of rollback, fail, got 'retry'")));
  EXPECT_EQ(
      Errors("name: j\ncommand: {argv: [python3, t.py]}\nhealth: {on_nan: fail}\n"),
      std::vector<std::string>{
          "job.yaml:3:9: health: only for trainctl's engine (a command job's NaNs are its own)"});
  // Divergence: default 1e4 on the rank's key, 0 turns it off, (0, 1] is refused.
  ParsedJobSpec d = ParseJobSpecYaml(std::string(kBase), "job.yaml", {});
  ASSERT_TRUE(d.ok());
  ResolveJobSpecDefaults(&d.spec);
  EXPECT_EQ(JobSpecToFlat(d.spec).at("health.divergence.factor"), "10000");
  EXPECT_TRUE(Errors(std::string(kBase) + "health: {divergence: {factor: 0}}\n").empty());
  EXPECT_THAT(Errors(std::string(kBase) + "health: {divergence: {factor: 0.5}}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "health.divergence.factor: must be 0 (off) or > 1, got 0.5")));
}

TEST(JobSpecTest, SchedulingIsReadAndChecked) {
  ParsedJobSpec p = ParseJobSpecYaml(
      std::string(kBase) + "scheduling: {wait_for_capacity: true, pending_timeout_s: 90}\n",
      "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_TRUE(p.spec.scheduling().wait_for_capacity());
  EXPECT_EQ(p.spec.scheduling().pending_timeout_s(), 90);
  EXPECT_THAT(
      Errors(std::string(kBase) + "scheduling: {pending_timeout_s: -1}\n"),
      ::testing::ElementsAre(::testing::HasSubstr("scheduling.pending_timeout_s: must be >= 0")));
}

TEST(JobSpecTest, MaxRuntimeIsReadAndChecked) {
  ParsedJobSpec p =
      ParseJobSpecYaml(std::string(kBase) + "scheduling: {max_runtime_s: 2}\n", "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.scheduling().max_runtime_s(), 2);
  p = ParseJobSpecYaml(kBase, "job.yaml", {"scheduling.max_runtime_s=5400"});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.scheduling().max_runtime_s(), 5400) << "as submit --max-runtime sets it";
  EXPECT_THAT(Errors(std::string(kBase) + "scheduling: {max_runtime_s: -3}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("scheduling.max_runtime_s: must be >= 0 seconds (0 = the "
                                       "queue's default, else no limit), got -3")));
}

TEST(JobSpecTest, SchedulingNodesDividesWorldSizeAndIsNotElastic) {
  ParsedJobSpec p = ParseJobSpecYaml(std::string(kBase) + "world_size: 4\nscheduling: {nodes: 2}\n",
                                     "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.scheduling().nodes(), 2);
  ParsedJobSpec set =
      ParseJobSpecYaml(std::string(kBase) + "world_size: 6\n", "job.yaml", {"scheduling.nodes=3"});
  ASSERT_TRUE(set.ok()) << set.errors[0].ToString();
  EXPECT_EQ(set.spec.scheduling().nodes(), 3);
  EXPECT_THAT(Errors(std::string(kBase) + "world_size: 4\nscheduling: {nodes: 3}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("scheduling.nodes: must divide world_size (4) so that every "
                                       "node runs the same number of ranks, got 3")));
  EXPECT_THAT(Errors(std::string(kBase) + "scheduling: {nodes: -1}\n"),
              ::testing::ElementsAre(::testing::HasSubstr("scheduling.nodes: must be >= 0")));
  EXPECT_THAT(Errors(std::string(kBase) + "world_size: 4\nscheduling: {nodes: 2}\nelastic: "
                                          "{min_ranks: 2}\ncheckpoint: {every_steps: 50}\n"),
              ::testing::Contains(::testing::HasSubstr(
                  "scheduling.nodes: does not combine with elastic.min_ranks")));
  // world_size defaults to 1: nodes 1 is fine, 2 is not.
  EXPECT_TRUE(Errors(std::string(kBase) + "scheduling: {nodes: 1}\n").empty());
}

TEST(JobSpecTest, ResourcesAreReadWithByteQuantities) {
  ParsedJobSpec p = ParseJobSpecYaml(
      std::string(kBase) + "resources: {cpus: 1.5, memory: 4Gi, pids: 512}\n", "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_DOUBLE_EQ(p.spec.resources().cpus(), 1.5);
  EXPECT_EQ(p.spec.resources().memory(), int64_t{4} << 30);
  EXPECT_EQ(p.spec.resources().pids(), 512);
  for (const auto& [text, bytes] :
       std::vector<std::pair<std::string, int64_t>>{{"1048576", 1048576},
                                                    {"64Mi", 64 << 20},
                                                    {"\"2048Ki\"", 2048 << 10},
                                                    {"2G", 2000000000},
                                                    {"1.5Gi", int64_t{3} << 29},
                                                    {"300M", 300000000},
                                                    {"5000k", 5000000}}) {
    ParsedJobSpec q = ParseJobSpecYaml(std::string(kBase) + "resources: {memory: " + text + "}\n",
                                       "job.yaml", {});
    ASSERT_TRUE(q.ok()) << text << ": " << q.errors[0].ToString();
    EXPECT_EQ(q.spec.resources().memory(), bytes) << text;
  }
  // --set takes the same form.
  ParsedJobSpec o = ParseJobSpecYaml(kBase, "job.yaml", {"resources.memory=256Mi"});
  ASSERT_TRUE(o.ok()) << o.errors[0].ToString();
  EXPECT_EQ(o.spec.resources().memory(), 256 << 20);
}

TEST(JobSpecTest, BadResourcesNameTheField) {
  const std::string b = kBase;
  EXPECT_THAT(
      Errors(b + "resources: {memory: 4GB}\n"),
      ::testing::ElementsAre(::testing::HasSubstr("resources.memory: must be a byte quantity")));
  EXPECT_THAT(
      Errors(b + "resources: {memory: -1Mi}\n"),
      ::testing::ElementsAre(::testing::HasSubstr("resources.memory: must be a byte quantity")));
  EXPECT_THAT(
      Errors(b + "resources: {memory: 99999999Ti}\n"),
      ::testing::ElementsAre(::testing::HasSubstr("resources.memory: must be a byte quantity")));
  EXPECT_THAT(Errors(b + "resources: {memory: 100}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("resources.memory: must be 0 (no limit) or at least 1Mi")));
  EXPECT_THAT(Errors(b + "resources: {cpus: -1}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("resources.cpus: must be 0 (no limit) or in [0.01, 4096]")));
  EXPECT_THAT(Errors(b + "resources: {pids: 2}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("resources.pids: must be 0 (no limit) or in [8, 4194304]")));
  EXPECT_THAT(Errors(b + "resources: {memroy: 1Gi}\n"),
              ::testing::ElementsAre(::testing::HasSubstr("did you mean 'memory'")));
}

TEST(JobSpecTest, GpuFlavorIsReadAndCheckedForGpuJobs) {
  const std::string b = kBase;
  ParsedJobSpec p =
      ParseJobSpecYaml(b + "device: cuda\nresources: {gpu_flavor: h100}\n", "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors[0].ToString();
  EXPECT_EQ(p.spec.resources().gpu_flavor(), "h100");
  // device auto may land on GPUs: a flavor is allowed; --set takes it too.
  ParsedJobSpec o = ParseJobSpecYaml(b, "job.yaml", {"resources.gpu_flavor=a100"});
  ASSERT_TRUE(o.ok()) << o.errors[0].ToString();
  EXPECT_EQ(o.spec.resources().gpu_flavor(), "a100");
  // A CPU job has no GPU to be of a flavor: refused, naming the field.
  EXPECT_THAT(Errors(b + "device: cpu\nresources: {gpu_flavor: h100}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "resources.gpu_flavor: asks for GPUs of flavor h100, but device is cpu")));
  EXPECT_THAT(
      Errors(b + "device: cuda\nresources: {gpu_flavor: H100}\n"),
      ::testing::ElementsAre(::testing::HasSubstr(
          "resources.gpu_flavor: must start with a lowercase letter or a digit, got 'H100'")));
  EXPECT_THAT(Errors(b + "device: cuda\nresources: {gpu_flavor: \"h 100\"}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("resources.gpu_flavor: may hold only lowercase")));
  // The same rule for a client that sends the proto.
  v1::JobSpec spec = p.spec;
  spec.set_device(v1::DEVICE_CPU);
  std::vector<SpecError> errors = ValidateJobSpec(spec);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "resources.gpu_flavor");
}

TEST(JobSpecTest, HangAndStragglerPolicies) {
  const std::string b = kBase;
  ParsedJobSpec p = ParseJobSpecYaml(
      b + "restart: {on_hang: fail}\nstragglers: {threshold: 0.5, policy: warn}\n", "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors.front().ToString();
  EXPECT_EQ(p.spec.restart().on_hang(), v1::HANG_POLICY_FAIL);
  EXPECT_DOUBLE_EQ(p.spec.stragglers().threshold(), 0.5);
  EXPECT_EQ(p.spec.stragglers().policy(), v1::STRAGGLER_POLICY_WARN);
  p = ParseJobSpecYaml(b, "job.yaml", {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.spec.restart().on_hang(), v1::HANG_POLICY_RESTART);  // resolved, as documented
  EXPECT_DOUBLE_EQ(p.spec.stragglers().threshold(), 0.3);
  EXPECT_EQ(p.spec.stragglers().policy(), v1::STRAGGLER_POLICY_WARN);
  EXPECT_THAT(Errors(b + "restart: {on_hang: retry}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "restart.on_hang: must be one of restart, fail, got 'retry'")));
  EXPECT_THAT(Errors(b + "stragglers: {threshold: 0}\n"),
              ::testing::ElementsAre(
                  ::testing::HasSubstr("stragglers.threshold: must be in (0, 100] (a fraction: 0.3 "
                                       "= 30% slower than the median), got 0")));
  EXPECT_THAT(
      Errors(b + "stragglers: {threshold: -0.3}\n"),
      ::testing::ElementsAre(::testing::HasSubstr("stragglers.threshold: must be in (0, 100]")));
  EXPECT_THAT(Errors(b + "stragglers: {policy: skip}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "stragglers.policy: must be one of warn, off, avoid, got 'skip'")));
  // -1 turns progress checks off (docs/failures.md#hangs); nothing below.
  p = ParseJobSpecYaml(b + "restart: {progress_timeout_s: -1}\n", "job.yaml", {});
  ASSERT_TRUE(p.ok()) << p.errors.front().ToString();
  EXPECT_EQ(p.spec.restart().progress_timeout_s(), -1);
  EXPECT_THAT(Errors(b + "restart: {progress_timeout_s: -2}\n"),
              ::testing::ElementsAre(::testing::HasSubstr(
                  "restart.progress_timeout_s: must be in [-1, 604800], got -2")));
}

TEST(JobSpecTest, OverridesApplyOnTopAndNameSet) {
  ParsedJobSpec r =
      ParseJobSpecYaml(kBase, "job.yaml",
                       {"world_size=4", "training.optimizer.lr=0.5",
                        "data.eval={format: synthetic, length: 5, size: 5, classes: 2}"});
  ASSERT_TRUE(r.ok()) << r.errors[0].ToString();
  EXPECT_EQ(r.spec.world_size(), 4);
  EXPECT_DOUBLE_EQ(r.spec.training().optimizer().lr(), 0.5);
  EXPECT_EQ(r.spec.data().eval().synthetic().length(), 5);

  EXPECT_EQ(Errors(kBase, {"training.optimizer.lr=-1", "nokey", "data.batch_size=x", "name.sub=1"}),
            (std::vector<std::string>{
                "--set: expected key.path=value, got 'nokey'",
                "--set: name.sub: 'name' is not a mapping in the file",
                "--set: data.batch_size: must be an integer, got 'x'",
                "--set: training.optimizer.lr: must be > 0, got -1",
            }));
  // A key that exists only through --set is reported as --set's.
  EXPECT_EQ(Errors(kBase, {"nope.field=3"}),
            std::vector<std::string>{"--set: nope: unknown key; did you mean 'name'?"});
  // An empty file with overrides only is a document of overrides.
  EXPECT_THAT(
      Errors("", {"name=x"}),
      testing::Contains(
          "job.yaml:1:1: model: required (name: mlp, cnn or torchscript), or a command: block"));
}

TEST(JobSpecTest, UnreadableFile) {
  ParsedJobSpec r = ParseJobSpecFile("/nonexistent/job.yaml");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].ToString(),
            "/nonexistent/job.yaml: cannot read the file (no such file or no permission)");
}

TEST(JobSpecTest, GrpcSpecsUseZeroAsDefault) {
  v1::JobSpec s;
  s.set_name("from-grpc");
  s.mutable_model()->mutable_mlp()->set_input_dim(5);
  s.mutable_model()->mutable_mlp()->set_classes(2);
  v1::SyntheticData* d = s.mutable_data()->mutable_train()->mutable_synthetic();
  d->set_length(10);
  d->set_size(5);
  d->set_classes(2);
  EXPECT_TRUE(ValidateJobSpec(s).empty());
  ResolveJobSpecDefaults(&s);
  EXPECT_EQ(s.world_size(), 1);
  EXPECT_EQ(s.data().batch_size(), 32);
  v1::JobSpec again = s;
  ResolveJobSpecDefaults(&again);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(s, again));

  s.set_world_size(-3);
  s.mutable_training()->mutable_optimizer()->set_lr(-0.5);
  s.set_name("");
  std::vector<std::string> got;
  for (const SpecError& e : ValidateJobSpec(s)) got.push_back(e.ToString());
  EXPECT_EQ(got, (std::vector<std::string>{"name: required", "world_size: must be > 0, got -3",
                                           "training.optimizer.lr: must be > 0, got -0.5"}));
  EXPECT_EQ(SpecErrorsToStatus(ValidateJobSpec(s)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SpecErrorsToStatus({}).ok());
}

// What the YAML parser cannot produce but a gRPC client can: out-of-range
// enums, huge or NUL-bearing strings, long lists, a huge spec. Each is refused
// naming the field before anything reads it.
TEST(JobSpecTest, GrpcSpecsAreBoundedAndEnumsChecked) {
  v1::JobSpec good;
  good.set_name("from-grpc");
  good.mutable_model()->mutable_mlp()->set_input_dim(5);
  good.mutable_model()->mutable_mlp()->set_classes(2);
  v1::SyntheticData* d = good.mutable_data()->mutable_train()->mutable_synthetic();
  d->set_length(10);
  d->set_size(5);
  d->set_classes(2);
  ASSERT_TRUE(ValidateJobSpec(good).empty());
  auto errors = [](const v1::JobSpec& s) {
    std::vector<std::string> got;
    for (const SpecError& e : ValidateJobSpec(s)) got.push_back(e.ToString());
    return got;
  };

  v1::JobSpec s = good;
  s.set_device(static_cast<v1::Device>(99));
  s.set_backend(static_cast<v1::Backend>(-7));
  s.mutable_training()->mutable_optimizer()->set_name(static_cast<v1::Optimizer>(1234));
  std::vector<std::string> got = errors(s);
  ASSERT_EQ(got.size(), 3u) << ::testing::PrintToString(got);
  EXPECT_THAT(got[0], ::testing::StartsWith("device: unknown value 99; expected one of "));
  EXPECT_THAT(got[1], ::testing::StartsWith("backend: unknown value -7; expected one of "));
  EXPECT_THAT(got[2], ::testing::StartsWith(
                          "training.optimizer.name: unknown value 1234; expected one of sgd"));

  s = good;
  s.mutable_checkpoint()->set_dir(std::string(10 << 20, 'x'));
  EXPECT_THAT(errors(s), ::testing::ElementsAre(::testing::HasSubstr("spec: is ")));
  s = good;
  s.mutable_checkpoint()->set_dir(std::string(5000, 'x'));
  EXPECT_THAT(errors(s), ::testing::ElementsAre("checkpoint.dir: at most 4096 bytes, got 5000"));
  s = good;
  s.mutable_checkpoint()->set_dir(std::string("/tmp/a\0b", 8));
  EXPECT_THAT(errors(s), ::testing::ElementsAre("checkpoint.dir: contains a NUL byte"));
  s = good;
  for (int i = 0; i < 65; ++i) s.mutable_model()->mutable_mlp()->add_hidden(4);
  EXPECT_THAT(errors(s), ::testing::ElementsAre("model.mlp.hidden: at most 64 items, got 65"));
  s = good;
  s.mutable_checkpoint()->set_dir("/tmp/\xff");
  EXPECT_THAT(errors(s), ::testing::ElementsAre("checkpoint.dir: is not valid UTF-8"));
  s = good;
  s.mutable_checkpoint()->set_dir("/tmp/a\x1b[2Jb");
  EXPECT_THAT(errors(s),
              ::testing::ElementsAre("checkpoint.dir: contains a control character (0x1b)"));
  s = good;
  s.mutable_checkpoint()->set_dir("/tmp/caf\xc3\xa9-\xe2\x9c\x93");  // UTF-8 is fine
  EXPECT_TRUE(errors(s).empty()) << ::testing::PrintToString(errors(s));
  s = good;
  s.mutable_resume_from()->set_job("../etc");
  EXPECT_THAT(errors(s),
              ::testing::ElementsAre(::testing::StartsWith("resume_from.job: not a job id")));
}

}  // namespace
}  // namespace trainctl

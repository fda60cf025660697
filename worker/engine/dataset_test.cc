// Tests for dataset.h, idx_dataset.h, csv_dataset.h and tensor_file_dataset.h.
#include <ATen/Functions.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/csv_dataset.h"
#include "worker/engine/dataset.h"
#include "worker/engine/idx_dataset.h"
#include "worker/engine/tensor_file_dataset.h"
#include "worker/engine/test_util.h"

namespace trainctl::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDir;
using testing_util::TestDataPath;
using testing_util::WriteFile;
using testing_util::WriteGzipFile;

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(needle)) << status;
}

// ------------------------------------------------------------ TensorDataset

TEST(TensorDatasetTest, GetAndGatherBatches) {
  auto ds =
      TensorDataset::Create(at::arange(12, at::kFloat).reshape({6, 2}), at::arange(6, at::kLong));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->size(), 6);
  auto e = (*ds)->Get(4);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->target.item<int64_t>(), 4);
  EXPECT_EQ(e->input[1].item<float>(), 9.0f);
  std::vector<int64_t> idx = {5, 0, 3};
  auto b = (*ds)->GetBatch(idx);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->input.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(b->target.equal(at::tensor(std::vector<int64_t>{5, 0, 3})));
  EXPECT_TRUE(b->input.is_contiguous());
  ExpectError((*ds)->Get(6).status(), absl::StatusCode::kOutOfRange, "index 6");
  std::vector<int64_t> bad = {1, -1};
  ExpectError((*ds)->GetBatch(bad).status(), absl::StatusCode::kOutOfRange, "index -1");
}

TEST(TensorDatasetTest, RejectsMismatchedLengths) {
  ExpectError(TensorDataset::Create(at::zeros({3, 2}), at::zeros({4})).status(),
              absl::StatusCode::kInvalidArgument, "3 inputs but 4 targets");
  ExpectError(TensorDataset::Create(at::zeros({}), at::zeros({1})).status(),
              absl::StatusCode::kInvalidArgument, "leading example dimension");
}

// ---------------------------------------------------------------- Synthetic

TEST(SyntheticDatasetTest, MatchesPythonGenerator) {
  // Golden "synthetic" lines: seed length size classes x... | y...
  std::ifstream in(TestDataPath("sampler_golden.txt"));
  ASSERT_TRUE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.rfind("synthetic ", 0) != 0) continue;
    std::istringstream ss(line.substr(10));
    SyntheticDataOptions o;
    ss >> o.seed >> o.length >> o.size >> o.classes;
    std::vector<float> x;
    std::vector<int64_t> y;
    std::string tok;
    bool targets = false;
    while (ss >> tok) {
      if (tok == "|") {
        targets = true;
      } else if (targets) {
        y.push_back(std::stoll(tok));
      } else {
        x.push_back(std::stof(tok));
      }
    }
    auto ds = MakeSyntheticDataset(o);
    ASSERT_TRUE(ds.ok()) << ds.status();
    at::Tensor inputs = (*ds)->inputs().flatten();
    ASSERT_EQ(inputs.numel(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(inputs[static_cast<int64_t>(i)].item<float>(), x[i], 1e-6) << i;
    }
    at::Tensor t = (*ds)->targets();
    ASSERT_EQ(t.scalar_type(), at::kLong);
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_EQ(t[static_cast<int64_t>(i)].item<int64_t>(), y[i]);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(SyntheticDatasetTest, ClassicExampleShapesAndRegression) {
  SyntheticDataOptions o;  // defaults: 100 x 5, 2 classes
  auto ds = MakeSyntheticDataset(o);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->inputs().sizes(), (std::vector<int64_t>{100, 5}));
  EXPECT_EQ((*ds)->targets().min().item<int64_t>(), 0);
  EXPECT_EQ((*ds)->targets().max().item<int64_t>(), 1);
  auto again = MakeSyntheticDataset(o);
  EXPECT_TRUE((*ds)->inputs().equal((*again)->inputs()));

  o.task = SyntheticTask::kRegression;
  o.target_dim = 3;
  auto reg = MakeSyntheticDataset(o);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ((*reg)->targets().sizes(), (std::vector<int64_t>{100, 3}));
  EXPECT_EQ((*reg)->targets().scalar_type(), at::kFloat);

  o.size = 0;
  ExpectError(MakeSyntheticDataset(o).status(), absl::StatusCode::kInvalidArgument, "size");
  o.size = 5;
  o.length = -1;
  ExpectError(MakeSyntheticDataset(o).status(), absl::StatusCode::kInvalidArgument, "length");
  o.length = 5;
  o.task = SyntheticTask::kClassification;
  o.classes = 0;
  ExpectError(MakeSyntheticDataset(o).status(), absl::StatusCode::kInvalidArgument, "classes");
}

// ---------------------------------------------------------------------- IDX

std::string Be32(uint32_t v) {
  std::string s(4, '\0');
  s[0] = static_cast<char>(v >> 24);
  s[1] = static_cast<char>(v >> 16);
  s[2] = static_cast<char>(v >> 8);
  s[3] = static_cast<char>(v);
  return s;
}

// n images of h x w where pixel p of image i is (i * 16 + p) % 256.
std::string IdxImages(uint32_t n, uint32_t h, uint32_t w) {
  std::string s = std::string("\0\0\x08\x03", 4) + Be32(n) + Be32(h) + Be32(w);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t p = 0; p < h * w; ++p) s.push_back(static_cast<char>((i * 16 + p) % 256));
  }
  return s;
}

std::string IdxLabels(const std::vector<uint8_t>& labels) {
  std::string s = std::string("\0\0\x08\x01", 4) + Be32(static_cast<uint32_t>(labels.size()));
  for (uint8_t l : labels) s.push_back(static_cast<char>(l));
  return s;
}

TEST(IdxDatasetTest, LoadsPlainAndGzipped) {
  TempDir dir;
  WriteFile(dir.File("img"), IdxImages(3, 2, 4));
  WriteGzipFile(dir.File("img.gz"), IdxImages(3, 2, 4));
  WriteFile(dir.File("lbl"), IdxLabels({7, 0, 9}));
  WriteGzipFile(dir.File("lbl.gz"), IdxLabels({7, 0, 9}));
  for (const auto& [img, lbl] : std::vector<std::pair<std::string, std::string>>{
           {"img", "lbl"}, {"img.gz", "lbl.gz"}, {"img.gz", "lbl"}}) {
    auto ds = LoadIdxDataset({dir.File(img), dir.File(lbl), 10, 0});
    ASSERT_TRUE(ds.ok()) << ds.status();
    const at::Tensor& x = (*ds)->inputs();
    EXPECT_EQ(x.sizes(), (std::vector<int64_t>{3, 1, 2, 4}));
    EXPECT_EQ(x.scalar_type(), at::kFloat);
    EXPECT_FLOAT_EQ(x[1][0][1][2].item<float>(), (16 + 6) / 255.0f);
    EXPECT_TRUE((*ds)->targets().equal(at::tensor(std::vector<int64_t>{7, 0, 9})));
  }
  auto limited = LoadIdxDataset({dir.File("img"), dir.File("lbl"), 10, 2});
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ((*limited)->size(), 2);
}

TEST(IdxDatasetTest, BadFilesAreClearErrors) {
  TempDir dir;
  WriteFile(dir.File("img"), IdxImages(3, 2, 4));
  WriteFile(dir.File("lbl"), IdxLabels({1, 2, 3}));
  const std::string img = dir.File("img"), lbl = dir.File("lbl");

  ExpectError(LoadIdxDataset({dir.File("nope"), lbl}).status(), absl::StatusCode::kNotFound,
              "nope");
  ExpectError(LoadIdxDataset({img, dir.File("nope")}).status(), absl::StatusCode::kNotFound,
              "IDX labels file");
  ExpectError(LoadIdxDataset({dir.File(""), lbl}).status(), absl::StatusCode::kInvalidArgument,
              "not a regular file");

  const std::string full = IdxImages(3, 2, 4);
  WriteFile(dir.File("trunc"), full.substr(0, full.size() - 1));
  ExpectError(LoadIdxDataset({dir.File("trunc"), lbl}).status(), absl::StatusCode::kInvalidArgument,
              "truncated");
  WriteFile(dir.File("trunc_header"), full.substr(0, 9));
  ExpectError(LoadIdxDataset({dir.File("trunc_header"), lbl}).status(),
              absl::StatusCode::kInvalidArgument, "truncated inside its header");

  WriteGzipFile(dir.File("full.gz"), full);
  std::ifstream gz(dir.File("full.gz"), std::ios::binary);
  std::string gz_bytes((std::istreambuf_iterator<char>(gz)), {});
  WriteFile(dir.File("trunc.gz"), gz_bytes.substr(0, gz_bytes.size() / 2));
  ExpectError(LoadIdxDataset({dir.File("trunc.gz"), lbl}).status(),
              absl::StatusCode::kInvalidArgument, "corrupt or truncated");

  // A decompression bomb: a header declaring 3x2x4 bytes followed by 32 MiB
  // of zeros that compress to a few KiB. Inflation stops at the declared size.
  WriteGzipFile(dir.File("bomb.gz"), full + std::string(32u << 20, '\0'));
  ExpectError(LoadIdxDataset({dir.File("bomb.gz"), lbl}).status(),
              absl::StatusCode::kInvalidArgument,
              "inflates to more than the 40 bytes its header declares");

  WriteFile(dir.File("magic"), "PK\x03\x04 definitely not idx");
  ExpectError(LoadIdxDataset({dir.File("magic"), lbl}).status(), absl::StatusCode::kInvalidArgument,
              "bad magic");
  ExpectError(LoadIdxDataset({lbl, lbl}).status(), absl::StatusCode::kInvalidArgument,
              "1 dimensions, expected 3");
  WriteFile(dir.File("int_type"), std::string("\0\0\x0c\x03", 4) + Be32(1) + Be32(1) + Be32(1));
  ExpectError(LoadIdxDataset({dir.File("int_type"), lbl}).status(),
              absl::StatusCode::kInvalidArgument, "element type");
  // A huge header on a tiny file must not allocate or crash.
  WriteFile(dir.File("huge"), std::string("\0\0\x08\x03", 4) + Be32(0xffffffff) + Be32(0xffffffff) +
                                  Be32(0xffffffff));
  ExpectError(LoadIdxDataset({dir.File("huge"), lbl}).status(), absl::StatusCode::kInvalidArgument,
              "truncated");

  WriteFile(dir.File("lbl2"), IdxLabels({1, 2}));
  ExpectError(LoadIdxDataset({img, dir.File("lbl2")}).status(), absl::StatusCode::kInvalidArgument,
              "3 images but labels file");
  WriteFile(dir.File("lbl_big"), IdxLabels({1, 12, 3}));
  ExpectError(LoadIdxDataset({img, dir.File("lbl_big"), 10}).status(),
              absl::StatusCode::kInvalidArgument, "the label of example 1 is outside [0, 10)");
  EXPECT_TRUE(LoadIdxDataset({img, dir.File("lbl_big"), 0}).ok());
  ExpectError(LoadIdxDataset({img, lbl, -1}).status(), absl::StatusCode::kInvalidArgument,
              "classes");
}

// ---------------------------------------------------------------------- CSV

TEST(CsvDatasetTest, LoadsByNameAndIndex) {
  TempDir dir;
  WriteFile(dir.File("a.csv"),
            "x1, x2 ,label,x3\r\n"
            "1.5,2,1,-3e-1\r\n"
            "\n"
            "\"4\",5,0,6\n"
            "7,8,2,9");
  CsvDataOptions o;
  o.path = dir.File("a.csv");
  o.label_column = "label";
  o.classes = 3;
  auto ds = LoadCsvDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->size(), 3);
  EXPECT_TRUE((*ds)->inputs().allclose(
      at::tensor(std::vector<float>{1.5f, 2, -0.3f, 4, 5, 6, 7, 8, 9}).reshape({3, 3})));
  EXPECT_TRUE((*ds)->targets().equal(at::tensor(std::vector<int64_t>{1, 0, 2})));

  // Same column by index, as regression targets.
  o.label_column.clear();
  o.label_column_index = 2;
  o.classes = 0;
  ds = LoadCsvDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->targets().sizes(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ((*ds)->targets().scalar_type(), at::kFloat);

  // No header, default label = last column.
  WriteFile(dir.File("b.csv"), "1;2;3\n4;5;6\n");
  CsvDataOptions b;
  b.path = dir.File("b.csv");
  b.has_header = false;
  b.delimiter = ';';
  ds = LoadCsvDataset(b);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE((*ds)->targets().flatten().equal(at::tensor(std::vector<float>{3, 6})));
}

TEST(CsvDatasetTest, BadFilesAreClearErrors) {
  TempDir dir;
  CsvDataOptions o;
  o.path = dir.File("missing.csv");
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kNotFound, "missing.csv");

  WriteFile(dir.File("text.csv"), "a,b,y\n1,2,0\n3,abc,1\n");
  o.path = dir.File("text.csv");
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "line 3 column 2: not a finite number");

  WriteFile(dir.File("ragged.csv"), "a,b,y\n1,2,0\n3,1\n");
  o.path = dir.File("ragged.csv");
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "line 3: expected 3 fields, got 2");

  WriteFile(dir.File("ok.csv"), "a,b,y\n1,2,0\n3,4,5\n");
  o.path = dir.File("ok.csv");
  o.label_column = "target";
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "label_column 'target' is not in the header");
  o.label_column = "y";
  o.classes = 3;
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "line 3 column 3: the label is not a class id in [0, 3)");
  o.label_column.clear();
  o.label_column_index = 7;
  o.classes = 0;
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "label_column_index 7");

  WriteFile(dir.File("header_only.csv"), "a,b,y\n");
  o.path = dir.File("header_only.csv");
  o.label_column_index = -1;
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument, "no data rows");

  WriteFile(dir.File("nan.csv"), "1,nan,0\n");
  o.path = dir.File("nan.csv");
  o.has_header = false;
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument, "line 1 column 2");
  o.label_column = "y";
  ExpectError(LoadCsvDataset(o).status(), absl::StatusCode::kInvalidArgument, "has_header");
}

// ------------------------------------------------------------- torch.save

TEST(TensorFileDatasetTest, LoadsDictTupleAndViewsSavedByPython) {
  const at::Tensor x = at::arange(24, at::kFloat).reshape({6, 4}).div(10);
  const at::Tensor y = at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2});
  for (const char* name : {"tensors_dict.pt", "tensors_tuple.pt"}) {
    auto ds = LoadTensorFileDataset({TestDataPath(name)});
    ASSERT_TRUE(ds.ok()) << name << ": " << ds.status();
    EXPECT_TRUE((*ds)->inputs().equal(x)) << name;
    EXPECT_TRUE((*ds)->targets().equal(y)) << name;
  }
  auto view = LoadTensorFileDataset({TestDataPath("tensors_view.pt")});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE((*view)->inputs().equal(x.slice(0, 0, 6, 2)));
  EXPECT_TRUE((*view)->inputs().is_contiguous());
  EXPECT_TRUE((*view)->targets().equal(y.slice(0, 0, 6, 2)));
}

TEST(TensorFileDatasetTest, BadFilesAreClearErrors) {
  TempDir dir;
  ExpectError(LoadTensorFileDataset({dir.File("none.pt")}).status(), absl::StatusCode::kNotFound,
              "none.pt");
  WriteFile(dir.File("text.pt"), "hello");
  ExpectError(LoadTensorFileDataset({dir.File("text.pt")}).status(),
              absl::StatusCode::kInvalidArgument, "not a torch.save zip archive");
  // A truncated archive.
  std::ifstream in(TestDataPath("tensors_dict.pt"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(bytes.size(), 100u);
  WriteFile(dir.File("trunc.pt"), bytes.substr(0, bytes.size() / 2));
  ExpectError(LoadTensorFileDataset({dir.File("trunc.pt")}).status(),
              absl::StatusCode::kInvalidArgument, "cannot be loaded");
  // Wrong keys.
  TensorFileDataOptions o{TestDataPath("tensors_dict.pt"), "x", "targets"};
  ExpectError(LoadTensorFileDataset(o).status(), absl::StatusCode::kInvalidArgument,
              "has no key 'x'");
}

TEST(TensorFileDatasetTest, DamagedArchivesNeverCrash) {
  TempDir dir;
  std::ifstream in(TestDataPath("tensors_tuple.pt"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string path = dir.File("damaged.pt");
  int errors = 0;
  for (size_t cut = 0; cut < bytes.size(); cut += 23) {
    WriteFile(path, bytes.substr(0, cut));
    auto ds = LoadTensorFileDataset({path});
    if (!ds.ok()) {
      ++errors;
      EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
    }
  }
  for (size_t pos = 0; pos < bytes.size(); pos += 11) {
    std::string flipped = bytes;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0x5a);
    WriteFile(path, flipped);
    auto ds = LoadTensorFileDataset({path});  // may load (a flipped data byte) or fail
    if (!ds.ok()) {
      ++errors;
      EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace trainctl::engine

// The torch-free format readers on hand-made bytes, including the inputs the
// fuzz targets (fuzz/fuzz_idx.cc, fuzz/fuzz_csv.cc) found or were seeded with.
#include "worker/engine/dataset_formats.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace trainctl::engine {
namespace {

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

TEST(DatasetFormatsTest, IdxLabelsDecode) {
  auto a = DecodeIdx(Bytes(std::string("\0\0\x08\x01\0\0\0\x03\x01\x02\0", 11)), 1, "l.idx",
                     "IDX labels file");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dims, std::vector<int64_t>{3});
  EXPECT_EQ(a->data_offset, 8u);
}

TEST(DatasetFormatsTest, IdxErrorsNameTheFileAndReason) {
  auto bad = DecodeIdx(Bytes("PK\x03\x04"), 1, "l.idx", "IDX labels file");
  EXPECT_EQ(bad.status().message(),
            "IDX labels file 'l.idx' is not an IDX file (bad magic number)");
  auto truncated =
      DecodeIdx(Bytes(std::string("\0\0\x08\x01\0\0\0\x09\x01", 9)), 1, "l.idx", "IDX labels file");
  EXPECT_TRUE(absl::StrContains(truncated.status().message(), "is truncated"))
      << truncated.status();
  auto header = DecodeIdx(Bytes(std::string("\0\0\x08\x03\0\0", 6)), 3, "i.idx", "IDX images file");
  EXPECT_TRUE(absl::StrContains(header.status().message(), "inside its header")) << header.status();
  // A gzip header with nothing valid after it.
  auto gz = DecodeIdx(Bytes(std::string("\x1f\x8b\x08\0\0\0\0\0\0\x03garbage", 17)), 1, "l.idx.gz",
                      "IDX labels file");
  EXPECT_EQ(gz.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DatasetFormatsTest, CsvParsesHeaderQuotesAndCrLf) {
  CsvDataOptions o;
  o.path = "d.csv";
  o.label_column = "label";
  o.classes = 2;
  auto t = ParseCsv("a, \"label\" ,b\r\n1,\"1\",3\r\n\n4,0,6\r\n", o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rows, 2);
  EXPECT_EQ(t->columns, 3);
  EXPECT_EQ(t->features, (std::vector<float>{1, 3, 4, 6}));
  EXPECT_EQ(t->class_labels, (std::vector<int64_t>{1, 0}));
}

TEST(DatasetFormatsTest, CsvErrorsNameLineAndColumn) {
  CsvDataOptions o;
  o.path = "d.csv";
  o.has_header = false;
  EXPECT_EQ(ParseCsv("1,2\n3,x\n", o).status().message(),
            "CSV file 'd.csv' line 2 column 2: not a finite number");
  EXPECT_EQ(ParseCsv("1,2\n3\n", o).status().message(),
            "CSV file 'd.csv' line 2: expected 2 fields, got 1");
  EXPECT_EQ(ParseCsv("\n \n", o).status().message(), "CSV file 'd.csv' has no data rows");
}

// A data path may name a file that is not the job's (a secret): errors go
// to every viewer of the job, so they say where and why, never what.
TEST(DatasetFormatsTest, CsvErrorsNeverEchoTheFilesContent) {
  CsvDataOptions o;
  o.path = "secret.csv";
  o.has_header = false;
  absl::Status s = ParseCsv("TOPSECRET-password-abc\n", o).status();
  EXPECT_EQ(s.message(),
            "CSV file 'secret.csv' line 1: need at least 2 columns (features and a label), got 1");
  for (const char* text :
       {"1,TOPSECRET-password-abc\n", "TOPSECRET,password\n", "1,2\n3,TOPSECRET\n"}) {
    s = ParseCsv(text, o).status();
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.message().find("TOPSECRET"), absl::string_view::npos) << s.message();
    EXPECT_EQ(s.message().find("password"), absl::string_view::npos) << s.message();
  }
  o.classes = 2;
  s = ParseCsv("1,7\n", o).status();
  EXPECT_EQ(s.message(),
            "CSV file 'secret.csv' line 1 column 2: the label is not a class id in [0, 2)");
}

}  // namespace
}  // namespace trainctl::engine

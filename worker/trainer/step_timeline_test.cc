// The comm timeline (step_timeline.h) through a real Trainer: one
// well-formed JSON line per optimizer step, every bucket's moments in order,
// and no file at all when it is off.
#include "worker/trainer/step_timeline.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/dist/rendezvous_store.h"
#include "worker/engine/dataset.h"
#include "worker/trainer/trainer.h"
#if TRAINCTL_HAVE_GLOO
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/single_rank_gloo.h"
#endif

namespace trainctl::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A small strict JSON reader: enough to check that a line parses as one
// object and to read its fields. Throws std::runtime_error on bad input.
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& k) const {
    auto it = fields.find(k);
    if (it == fields.end()) throw std::runtime_error("no field " + k);
    return it->second;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : s_(text) {}
  Json ReadDocument() {
    Json v = Value();
    Space();
    if (i_ != s_.size()) Fail("trailing text");
    return v;
  }

 private:
  [[noreturn]] void Fail(const std::string& why) {
    throw std::runtime_error(why + " at " + std::to_string(i_));
  }
  void Space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void Expect(char c) {
    if (!Eat(c)) Fail(std::string("expected ") + c);
  }
  bool Word(const char* w) {
    const std::string word(w);
    if (s_.compare(i_, word.size(), word) != 0) return false;
    i_ += word.size();
    return true;
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') ++i_;
      if (i_ >= s_.size()) Fail("bad escape");
      out += s_[i_++];
    }
    if (i_ >= s_.size()) Fail("unterminated string");
    ++i_;
    return out;
  }
  Json Value() {
    Space();
    Json v;
    if (i_ >= s_.size()) Fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::kObject;
      if (Eat('}')) return v;
      do {
        Space();
        std::string key = String();
        Expect(':');
        if (!v.fields.emplace(key, Value()).second) Fail("duplicate key " + key);
      } while (Eat(','));
      Expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Json::kArray;
      if (Eat(']')) return v;
      do {
        v.items.push_back(Value());
      } while (Eat(','));
      Expect(']');
    } else if (c == '"') {
      v.kind = Json::kString;
      v.str = String();
    } else if (Word("null")) {
      v.kind = Json::kNull;
    } else if (Word("true")) {
      v.kind = Json::kBool;
      v.b = true;
    } else if (Word("false")) {
      v.kind = Json::kBool;
    } else {
      size_t used = 0;
      try {
        v.num = std::stod(s_.substr(i_), &used);
      } catch (const std::exception&) {
        Fail("bad value");
      }
      v.kind = Json::kNumber;
      i_ += used;
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::shared_ptr<engine::Model> Mlp() {
  torch::manual_seed(0);
  engine::ModelOptions o;
  o.name = "mlp";
  o.mlp.input_dim = 5;
  o.mlp.hidden_sizes = {16, 16};
  o.mlp.output_dim = 2;
  auto m = engine::CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

std::shared_ptr<const engine::Dataset> Synthetic(int64_t length) {
  engine::SyntheticDataOptions o;
  o.length = length;
  o.size = 5;
  o.seed = 3;
  o.classes = 2;
  return std::shared_ptr<const engine::Dataset>(engine::MakeSyntheticDataset(o).value());
}

// 4 steps of batch 30 per epoch, 2 epochs: 8 optimizer steps.
TrainerSetup TimelineSetup(const std::string& prefix) {
  TrainerSetup s;
  s.options.epochs = 2;
  s.options.optimizer.kind = OptimizerKind::kSgd;
  s.options.optimizer.lr = 0.1;
  s.options.data.batch_size = 30;
  s.options.metrics_every_steps = 2;
  // Tiny buckets: each of the 6 parameters closes its own bucket.
  s.options.ddp.first_bucket_bytes = 4;
  s.options.ddp.bucket_cap_mb = 1e-6;
  s.comm_timeline_prefix = prefix;
  return s;
}

struct TrainRun {
  absl::StatusOr<TrainResult> result;
  std::vector<std::string> logs;
};

TrainRun Train(const TrainerSetup& setup, std::shared_ptr<dist::Collectives> comm) {
  TrainRun r;
  TrainerCallbacks cb;
  cb.on_log = [&r](const std::string& line) { r.logs.push_back(line); };
  auto t = Trainer::Create(setup, Mlp(), Synthetic(120), nullptr, std::move(comm), cb);
  if (!t.ok()) {
    r.result = t.status();
    return r;
  }
  r.result = (*t)->Run();
  return r;
}

std::string TempDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/step_timeline_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

double Ms(const Json& v) {
  EXPECT_EQ(v.kind, Json::kNumber);
  return v.num;
}

// Every step: the loop's moments in order, and (with buckets) each bucket's.
void CheckStep(const Json& s, int64_t step, size_t buckets, int64_t floats) {
  SCOPED_TRACE(step);
  ASSERT_EQ(s.kind, Json::kObject);
  EXPECT_EQ(s["step"].num, step);
  EXPECT_EQ(s["micro_batches"].num, 1);
  EXPECT_GT(s["t0_ns"].num, 0);
  const char* order[] = {"start",           "backward_start", "backward_end", "finalize_end",
                         "optimizer_start", "optimizer_end",  "end"};
  for (size_t k = 1; k < std::size(order); ++k) {
    EXPECT_LE(Ms(s[order[k - 1]]), Ms(s[order[k]])) << order[k - 1] << " then " << order[k];
  }
  const Json& b = s["buckets"];
  ASSERT_EQ(b.kind, Json::kArray);
  ASSERT_EQ(b.items.size(), buckets);
  if (buckets == 0) {
    EXPECT_EQ(s["wait_start"].kind, Json::kNull);
    return;
  }
  EXPECT_TRUE(s["synced"].b);
  EXPECT_LE(Ms(s["backward_end"]), Ms(s["wait_start"]));
  EXPECT_LE(Ms(s["wait_end"]), Ms(s["finalize_end"]));
  int64_t bytes = 0;
  for (size_t i = 0; i < buckets; ++i) {
    SCOPED_TRACE(i);
    const Json& x = b.items[i];
    EXPECT_EQ(x["bucket"].num, static_cast<double>(i));
    EXPECT_EQ(x["params"].num, 1);
    bytes += static_cast<int64_t>(x["bytes"].num);
    EXPECT_LE(Ms(s["backward_start"]), Ms(x["ready"]));
    EXPECT_LE(Ms(x["ready"]), Ms(x["issued"]));
    EXPECT_LE(Ms(x["issued"]), Ms(x["started"]));
    EXPECT_LE(Ms(x["started"]), Ms(x["finished"]));
    EXPECT_LE(Ms(x["finished"]), Ms(x["waited"]));
    EXPECT_LE(Ms(s["wait_start"]), Ms(x["waited"]));
    EXPECT_LE(Ms(x["waited"]), Ms(s["wait_end"]));
    // Launched in bucket order, by the backward's hooks.
    EXPECT_TRUE(x["from_hook"].b);
    if (i > 0) {
      EXPECT_LE(Ms(b.items[i - 1]["issued"]), Ms(x["issued"]));
    }
  }
  EXPECT_EQ(bytes, floats * 4);
}

#if TRAINCTL_HAVE_GLOO
using dist::testing::SingleRankGloo;

TEST(StepTimelineTest, OneLinePerStepWithEveryBucketInOrder) {
  const std::string dir = TempDir("on");
  const std::string prefix = dir + "/tl";
  TrainRun r = Train(TimelineSetup(prefix), SingleRankGloo());
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  EXPECT_EQ(r.result->global_step, 8);
  const std::string path = StepTimeline::PathFor(prefix, 0);
  EXPECT_EQ(path, prefix + ".rank0.jsonl");
  EXPECT_THAT(r.logs, ::testing::Contains(HasSubstr("comm timeline: 8 steps written to " + path)));
  const std::vector<std::string> lines = Lines(path);
  ASSERT_EQ(lines.size(), 8u);
  // 5*16+16 + 16*16+16 + 16*2+2 floats in 6 one-parameter buckets.
  const int64_t floats = 96 + 272 + 34;
  for (size_t k = 0; k < lines.size(); ++k) {
    Json s;
    ASSERT_NO_THROW(s = JsonReader(lines[k]).ReadDocument()) << lines[k];
    EXPECT_EQ(s["rank"].num, 0);
    EXPECT_EQ(s["comm"].str, "gloo");
    CheckStep(s, static_cast<int64_t>(k) + 1, 6, floats);
  }
  fs::remove_all(dir);
}
#endif

// Without collectives (world size 1, as trainctl-rank runs it) the loop's
// moments are still there: the 1-rank baseline of the study.
TEST(StepTimelineTest, WithoutCollectivesStepsHaveNoBuckets) {
  const std::string dir = TempDir("none");
  const std::string prefix = dir + "/tl";
  TrainRun r = Train(TimelineSetup(prefix), nullptr);
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  const std::vector<std::string> lines = Lines(StepTimeline::PathFor(prefix, 0));
  ASSERT_EQ(lines.size(), 8u);
  for (size_t k = 0; k < lines.size(); ++k) {
    Json s;
    ASSERT_NO_THROW(s = JsonReader(lines[k]).ReadDocument()) << lines[k];
    EXPECT_EQ(s["comm"].str, "none");
    CheckStep(s, static_cast<int64_t>(k) + 1, 0, 0);
  }
  fs::remove_all(dir);
}

TEST(StepTimelineTest, OffWritesNothing) {
  const std::string dir = TempDir("off");
  TrainRun r = Train(TimelineSetup(""), nullptr);
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  EXPECT_TRUE(fs::is_empty(dir));
  for (const std::string& line : r.logs) EXPECT_THAT(line, ::testing::Not(HasSubstr("timeline")));
  fs::remove_all(dir);
}

// A timeline that cannot be written is logged; the run still succeeds.
TEST(StepTimelineTest, UnwritableTimelineIsLoggedNotFatal) {
  const std::string dir = TempDir("bad");
  TrainRun r = Train(TimelineSetup(dir + "/missing/tl"), nullptr);
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  EXPECT_THAT(r.logs, ::testing::Contains(HasSubstr("comm timeline: not written")));
  fs::remove_all(dir);
}

TEST(StepTimelineTest, StepsBeyondTheCapAreCountedNotKept) {
  StepTimeline t("unused", 0, 1, "none");
  for (size_t i = 0; i < StepTimeline::kMaxSteps + 3; ++i) {
    t.BeginStep(static_cast<int64_t>(i) + 1);
    t.EndStep();
  }
  EXPECT_EQ(t.steps(), StepTimeline::kMaxSteps);
  EXPECT_EQ(t.dropped(), 3u);
}

}  // namespace
}  // namespace trainctl::trainer

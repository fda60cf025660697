// `trainctl metrics JOB`: a job's stored metric points (also after it
// ended) as a table, CSV (for a spreadsheet or pandas) or JSON.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"

namespace trainctl::cli {
namespace {

struct MetricsFlags {
  std::string job_id;
  std::optional<int> rank;
  std::string kind;
};

std::string G(double v) { return absl::StrFormat("%.6g", v); }

// Every custom scalar name (MetricPoint.scalars) the points carry, sorted:
// a column each, after the fixed ones.
std::vector<std::string> ScalarNames(const std::vector<v1::MetricBatch>& batches) {
  std::set<std::string> names;
  for (const v1::MetricBatch& b : batches) {
    for (const v1::MetricPoint& p : b.points()) {
      for (const auto& [name, value] : p.scalars()) names.insert(name);
    }
  }
  return {names.begin(), names.end()};
}

// Who reads the cells: a person (the table: accuracy in percent, as every
// other line the CLI prints) or a program (the CSV: the stored fraction, a
// number pandas reads as it is).
enum class Reader { kPerson, kProgram };

std::vector<std::string> FixedColumns(int32_t attempt, const v1::MetricPoint& p, Reader reader);

// One row per point; the same columns in the table and the CSV.
std::vector<std::string> Row(int32_t attempt, const v1::MetricPoint& p,
                             const std::vector<std::string>& scalars, Reader reader) {
  std::vector<std::string> row = FixedColumns(attempt, p, reader);
  row.pop_back();  // the time goes last
  for (const std::string& name : scalars) {
    auto it = p.scalars().find(name);
    row.push_back(it == p.scalars().end() ? "" : G(it->second));
  }
  row.push_back(FormatTimestamp(p.time()));
  return row;
}

const char* KindName(v1::MetricPoint::Kind kind) {
  switch (kind) {
    case v1::MetricPoint::KIND_EPOCH_END:
    case v1::MetricPoint::KIND_EVAL:
      return "eval";
    default:
      return "train";
  }
}

// The columns every point has, its time last; "" for a field the point
// does not carry (a script's report names only what it has).
std::vector<std::string> FixedColumns(int32_t attempt, const v1::MetricPoint& p, Reader reader) {
  auto real = [](bool has, double v, const absl::FormatSpec<double>& format) {
    return has ? absl::StrFormat(format, v) : std::string();
  };
  const v1::EvalResult& e = p.eval();
  return {absl::StrCat(attempt),
          absl::StrCat(p.rank()),
          KindName(p.kind()),
          absl::StrCat(p.epoch() + 1),
          absl::StrCat(p.step()),
          real(p.has_loss(), p.loss(), "%.6g"),
          real(p.has_lr(), p.lr(), "%.6g"),
          real(p.has_samples_per_sec(), p.samples_per_sec(), "%.1f"),
          real(p.has_data_ms(), p.data_ms(), "%.2f"),
          real(p.has_compute_ms(), p.compute_ms(), "%.2f"),
          real(p.has_comm_ms(), p.comm_ms(), "%.2f"),
          real(p.has_loss_scale(), p.loss_scale(), "%.6g"),
          real(p.has_eval() && e.has_loss(), e.loss(), "%.6g"),
          reader == Reader::kPerson
              ? real(p.has_eval() && e.has_accuracy(), e.accuracy() * 100, "%.2f%%")
              : real(p.has_eval() && e.has_accuracy(), e.accuracy(), "%.4f"),
          FormatTimestamp(p.time())};
}

int RunMetrics(CliContext& ctx, const MetricsFlags& flags) {
  MetricsOptions options;
  options.rank = flags.rank;
  if (flags.kind == "train") options.kind = v1::MetricPoint::KIND_TRAIN;
  if (flags.kind == "eval") options.kind = v1::MetricPoint::KIND_EPOCH_END;
  return ConnectCallPrint(
      ctx, [&](Client& client) { return ResolveJob(ctx, client, flags.job_id); },
      [&](Client& client, v1::Job& job) -> int {
        absl::StatusOr<std::vector<v1::MetricBatch>> batches = client.Metrics(job.id(), options);
        if (!batches.ok()) return ctx.Fail(batches.status());
        if (flags.kind == "eval") {
          // Evaluations are the engine's epoch ends and a script's eval reports
          // (a job has one or the other): both, in that order.
          options.kind = v1::MetricPoint::KIND_EVAL;
          absl::StatusOr<std::vector<v1::MetricBatch>> reported = client.Metrics(job.id(), options);
          if (!reported.ok()) return ctx.Fail(reported.status());
          batches->insert(batches->end(), reported->begin(), reported->end());
        }
        if (ctx.json())
          return PrintJsonList(ctx, *batches, &v1::GetMetricsResponse::mutable_batches);
        const std::vector<std::string> scalars = ScalarNames(*batches);
        if (ctx.output == "csv") {
          // Scalar names hold no comma or quote (IsScalarName): no quoting needed.
          ctx.out << "attempt,rank,kind,epoch,step,loss,lr,samples_per_sec,data_ms,compute_ms,comm_"
                     "ms,loss_scale,"
                     "eval_loss,eval_accuracy,"
                  << absl::StrJoin(scalars, ",") << (scalars.empty() ? "" : ",") << "time\n";
          for (const v1::MetricBatch& b : *batches) {
            for (const v1::MetricPoint& p : b.points())
              ctx.out << absl::StrJoin(Row(b.attempt(), p, scalars, Reader::kProgram), ",") << "\n";
          }
          ctx.out << std::flush;
          return kExitOk;
        }
        size_t n = 0;
        for (const v1::MetricBatch& b : *batches) n += static_cast<size_t>(b.points_size());
        if (n == 0) {
          ctx.out << "job " << job.id() << " has no stored metric points"
                  << (flags.rank.has_value() || !flags.kind.empty() ? " that match" : "") << "\n";
          return kExitOk;
        }
        std::vector<std::string> headers = {
            "ATTEMPT",   "RANK",    "KIND",       "EPOCH",   "STEP",       "LOSS",      "LR",
            "SAMPLES/S", "DATA_MS", "COMPUTE_MS", "COMM_MS", "LOSS_SCALE", "EVAL_LOSS", "EVAL_ACC"};
        headers.insert(headers.end(), scalars.begin(), scalars.end());
        headers.push_back("TIME");
        Table t(headers);
        for (const v1::MetricBatch& b : *batches) {
          for (const v1::MetricPoint& p : b.points()) {
            std::vector<std::string> row = Row(b.attempt(), p, scalars, Reader::kPerson);
            for (std::string& cell : row) {
              if (cell.empty()) cell = "-";
            }
            t.AddRow(std::move(row));
          }
        }
        t.Print(ctx.out);
        ctx.out << std::flush;
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddMetricsVerb(CLI::App& app, CliContext& ctx) {
  auto flags = std::make_shared<MetricsFlags>();
  CLI::App* sub =
      AddVerb(app, "metrics",
              "Print a job's stored metric points (loss, lr, throughput, step time, eval), also "
              "after it ended",
              "  trainctl metrics mlp-synthetic-7f3a2c --rank 0 --kind eval\n"
              "  trainctl metrics mlp-synthetic-7f3a2c -o csv > metrics.csv\n"
              "EPOCH counts from 1; STEP is the optimizer step within the epoch. Old train points "
              "of a long\n"
              "job are downsampled by the coordinator (min/max/last loss per bucket).\n");
  sub->add_option("JOB", flags->job_id, kJobRefOrRunHelp);
  sub->add_option("--rank", flags->rank, "Only this rank")->check(CLI::NonNegativeNumber);
  sub->add_option(
         "--kind", flags->kind,
         "Only train windows, or evaluations (end-of-epoch points and a script's eval reports)")
      ->check(CLI::IsMember({"train", "eval"}));
  return [&ctx, flags] { return RunMetrics(ctx, *flags); };
}

}  // namespace trainctl::cli

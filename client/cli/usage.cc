// trainctl usage: slot time and measured use per queue, owner and slot kind,
// job or attempt (a viewer's); docs/operator.md says how to bill from it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "common/format_bytes.h"
#include "common/time_util.h"

namespace trainctl::cli {
namespace {

struct UsageArgs {
  std::string queue;
  std::string owner;
  std::string since;
  std::string until;
  std::string by;
};

// A CSV field: quoted when it holds a comma, quote or line break (owners
// are token names, free text).
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// A figure that may be unknown (0): `unknown` then ("-" in a table, empty
// in CSV), else `known`.
std::string OrUnknown(bool known, const std::string& value, const std::string& unknown) {
  return known ? value : unknown;
}

// RFC 3339 in UTC (CSV: sortable, what a billing import expects); empty when unset.
std::string Rfc3339(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", FromTimestamp(ts), absl::UTCTimeZone());
}

absl::StatusOr<v1::UsageGrouping> ParseUsageGrouping(const std::string& by) {
  if (by.empty()) return v1::USAGE_GROUPING_UNSPECIFIED;
  if (by == "queue") return v1::USAGE_GROUPING_QUEUE;
  if (by == "owner") return v1::USAGE_GROUPING_OWNER;
  if (by == "job") return v1::USAGE_GROUPING_JOB;
  if (by == "attempt") return v1::USAGE_GROUPING_ATTEMPT;
  return absl::InvalidArgumentError("--by: '" + by + "' is not one of queue, owner, job, attempt");
}

void PrintAttemptsCsv(CliContext& ctx, const v1::GetUsageResponse& usage) {
  ctx.out << "job_id,attempt,owner,queue,kind,slots,cpus_per_rank,memory_limit_bytes,start,end,"
             "wall_seconds,slot_seconds,gpu_seconds,cpu_seconds,peak_memory_bytes,ranks_measured,"
             "state\n";
  for (const v1::AttemptUsage& a : usage.attempts()) {
    const bool measured = a.ranks_measured() > 0;
    ctx.out
        << CsvField(a.job_id()) << "," << a.attempt() << "," << CsvField(a.owner()) << ","
        << CsvField(a.queue()) << "," << a.kind() << "," << a.slots() << ","
        << OrUnknown(a.cpus_per_rank() > 0, absl::StrFormat("%g", a.cpus_per_rank()), "") << ","
        << OrUnknown(a.memory_limit_bytes() > 0, absl::StrCat(a.memory_limit_bytes()), "") << ","
        << Rfc3339(a.start_time()) << "," << Rfc3339(a.end_time()) << ","
        << absl::StrFormat("%.3f,%.3f,%.3f", a.wall_seconds(), a.slot_seconds(), a.gpu_seconds())
        << ","
        << OrUnknown(measured && a.cpu_seconds() > 0, absl::StrFormat("%.3f", a.cpu_seconds()), "")
        << ","
        << OrUnknown(measured && a.peak_memory_bytes() > 0, absl::StrCat(a.peak_memory_bytes()), "")
        << "," << a.ranks_measured() << "," << a.state() << "\n";
  }
}

void PrintAttemptsTable(CliContext& ctx, const v1::GetUsageResponse& usage) {
  Table t({"JOB", "ATTEMPT", "OWNER", "QUEUE", "KIND", "SLOTS", "CPUS", "MEM-LIMIT", "START", "END",
           "WALL-S", "GPU-S", "CPU-S", "MAX-MEM", "STATE"});
  for (const v1::AttemptUsage& a : usage.attempts()) {
    const bool measured = a.ranks_measured() > 0;
    t.AddRow(
        {a.job_id(), absl::StrCat(a.attempt()), a.owner().empty() ? "-" : a.owner(), a.queue(),
         a.kind(), absl::StrCat(a.slots()),
         OrUnknown(a.cpus_per_rank() > 0, absl::StrFormat("%g", a.cpus_per_rank()), "-"),
         OrUnknown(a.memory_limit_bytes() > 0, FormatBytes(a.memory_limit_bytes()), "-"),
         FormatTimestamp(a.start_time()), FormatTimestamp(a.end_time()),
         absl::StrFormat("%.1f", a.wall_seconds()),
         OrUnknown(a.kind() == "gpu", absl::StrFormat("%.0f", a.gpu_seconds()), "-"),
         OrUnknown(measured && a.cpu_seconds() > 0, absl::StrFormat("%.1f", a.cpu_seconds()), "-"),
         OrUnknown(measured && a.peak_memory_bytes() > 0, FormatBytes(a.peak_memory_bytes()), "-"),
         a.state()});
  }
  t.Print(ctx.out);
}

int RunUsage(CliContext& ctx, const UsageArgs& a) {
  v1::GetUsageRequest req;
  req.set_queue(a.queue);
  req.set_owner(a.owner);
  absl::StatusOr<v1::UsageGrouping> by = ParseUsageGrouping(a.by);
  if (!by.ok()) return ctx.Fail(by.status());
  req.set_by(*by);
  const absl::Time now = absl::Now();
  if (!a.since.empty()) {
    absl::StatusOr<absl::Time> since = ParseSince(a.since, now);
    if (!since.ok()) return ctx.Fail(since.status());
    SetTimestamp(*since, req.mutable_since());
  }
  if (!a.until.empty()) {
    absl::StatusOr<absl::Time> until = ParseSince(a.until, now, "--until");
    if (!until.ok()) return ctx.Fail(until.status());
    if (req.has_since() && *until <= FromTimestamp(req.since())) {
      return ctx.Fail(
          absl::InvalidArgumentError("--until: '" + a.until + "' is not after --since"));
    }
    SetTimestamp(*until, req.mutable_until());
  }
  const bool by_job = *by == v1::USAGE_GROUPING_JOB;
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.GetUsage(req); },
      [&](v1::GetUsageResponse& usage) -> int {
        if (ctx.json()) {
          ctx.PrintJson(usage);
          return kExitOk;
        }
        if (ctx.output == "csv") {
          if (*by == v1::USAGE_GROUPING_ATTEMPT) {
            PrintAttemptsCsv(ctx, usage);
            ctx.out << std::flush;
            return kExitOk;
          }
          ctx.out
              << (by_job ? "job_id," : "")
              << "queue,owner,kind,slot_seconds,slot_hours,attempts,jobs,gpu_seconds,wall_seconds,"
                 "cpu_seconds,peak_memory_bytes\n";
          for (const v1::UsageRow& r : usage.rows()) {
            if (by_job) ctx.out << CsvField(r.job_id()) << ",";
            ctx.out << CsvField(r.queue()) << "," << CsvField(r.owner()) << "," << r.kind() << ","
                    << absl::StrFormat("%.3f,%.6f", r.slot_seconds(), r.slot_seconds() / 3600)
                    << "," << r.attempts() << "," << r.jobs() << ","
                    << absl::StrFormat("%.3f,%.3f", r.gpu_seconds(), r.wall_seconds()) << ","
                    << OrUnknown(r.cpu_seconds() > 0, absl::StrFormat("%.3f", r.cpu_seconds()), "")
                    << ","
                    << OrUnknown(r.peak_memory_bytes() > 0, absl::StrCat(r.peak_memory_bytes()), "")
                    << "\n";
          }
          ctx.out << std::flush;
          return kExitOk;
        }
        const std::string window =
            absl::StrCat(usage.has_since() ? absl::StrCat("since ", FormatTimestamp(usage.since()))
                                           : std::string("since the first job"),
                         ", until ", FormatTimestamp(usage.until()));
        if (usage.rows_size() == 0 && usage.attempts_size() == 0) {
          ctx.out << "no slot time " << window
                  << (a.queue.empty() && a.owner.empty() ? "" : " that matches") << "\n";
          return kExitOk;
        }
        if (*by == v1::USAGE_GROUPING_ATTEMPT) {
          PrintAttemptsTable(ctx, usage);
          ctx.out << "(" << window << "; - = unknown or not applicable)\n";
          return kExitOk;
        }
        std::vector<std::string> head = {"QUEUE",      "OWNER",       "KIND",        "SLOT-SECONDS",
                                         "SLOT-HOURS", "GPU-SECONDS", "CPU-SECONDS", "MAX-MEM",
                                         "ATTEMPTS",   "JOBS"};
        if (by_job) head.insert(head.begin(), "JOB");
        Table t(head);
        for (const v1::UsageRow& r : usage.rows()) {
          std::vector<std::string> row = {
              r.queue().empty() ? "-" : r.queue(),
              r.owner().empty() ? "-" : r.owner(),
              r.kind(),
              absl::StrFormat("%.0f", r.slot_seconds()),
              absl::StrFormat("%.2f", r.slot_seconds() / 3600),
              OrUnknown(r.kind() == "gpu", absl::StrFormat("%.0f", r.gpu_seconds()), "-"),
              OrUnknown(r.cpu_seconds() > 0, absl::StrFormat("%.1f", r.cpu_seconds()), "-"),
              OrUnknown(r.peak_memory_bytes() > 0, FormatBytes(r.peak_memory_bytes()), "-"),
              absl::StrCat(r.attempts()),
              absl::StrCat(r.jobs())};
          if (by_job) row.insert(row.begin(), r.job_id());
          t.AddRow(row);
        }
        t.Print(ctx.out);
        ctx.out << "(" << window << "; - = unknown or not applicable)\n";
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddUsageVerb(CLI::App& app, CliContext& ctx) {
  CLI::App* sub =
      AddVerb(app, "usage",
              "Slot time, GPU-seconds, CPU-seconds and peak memory the jobs' attempts used, per "
              "queue, owner and "
              "slot kind, per job or per attempt (docs/queues.md, docs/operator.md)",
              "  trainctl usage\n"
              "  trainctl usage --queue research --since 7d\n"
              "  trainctl usage --owner alice --since 2026-05-01T00:00:00Z -o csv > usage.csv\n"
              "  trainctl usage --by attempt --since 2026-05-01T00:00:00Z --until "
              "2026-06-01T00:00:00Z -o csv\n",
              "Examples:");
  auto args = std::make_shared<UsageArgs>();
  sub->add_option("--queue", args->queue,
                  "Only this queue's jobs (a job naming none counts as default)")
      ->type_name("Q");
  sub->add_option("--owner", args->owner, "Only jobs of this owner (the submitting token's name)")
      ->type_name("O");
  sub->add_option("--since", args->since,
                  "Only slot time after this: a duration back from now (7d, 12h, 30m, 45s, 2w) or "
                  "an RFC 3339 "
                  "time (default: since the first job)")
      ->type_name("WHEN");
  sub->add_option("--until", args->until,
                  "Only slot time before this, as --since takes it (default: now)")
      ->type_name("WHEN");
  sub->add_option(
         "--by", args->by,
         "Rows per queue, owner, job or attempt (default: per queue, owner and slot kind); "
         "attempt rows are the billing records")
      ->type_name("queue|owner|job|attempt");
  return [&ctx, args] { return RunUsage(ctx, *args); };
}

}  // namespace trainctl::cli

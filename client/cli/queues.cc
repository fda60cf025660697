// trainctl queue create|list|describe|delete (docs/queues.md). Create and
// delete need an admin token; list and describe a viewer's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/context.h"
#include "client/cli/format.h"
#include "client/cli/queue_text.h"
#include "common/format_bytes.h"
#include "common/jobspec/spec_fields.h"
#include "common/time_util.h"

namespace trainctl::cli {

namespace {

struct QueueArgs {
  std::string name;
  // -1 (also when omitted): unlimited, sent unset.
  int gpu = -1;
  int cpu = -1;
  // Queue.borrowing_limit_* / lending_limit_*: -1 (also when omitted): no
  // limit, sent unset.
  int borrowing_limit_gpu = -1;
  int borrowing_limit_cpu = -1;
  int lending_limit_gpu = -1;
  int lending_limit_cpu = -1;
  // Queue.nominal_cpus / borrowing_limit_cpus / lending_limit_cpus and the
  // *_memory_bytes ones: -1 / "" (also when omitted): unlimited or no
  // limit, sent unset; memory as --default-memory ("-1" as omitted).
  double nominal_cpus = -1;
  double borrowing_limit_cpus = -1;
  double lending_limit_cpus = -1;
  std::string nominal_memory;
  std::string borrowing_limit_memory;
  std::string lending_limit_memory;
  std::string cohort;
  int max_job_size = 0;
  // Queue.max_running_jobs_per_owner / max_slots_per_owner (0: no limit).
  int max_jobs_per_owner = 0;
  int max_slots_per_owner = 0;
  int default_priority = 0;
  // Queue.default_resources: per rank, 0 / "" = none.
  double default_cpus = 0;
  std::string default_memory;
  int64_t default_pids = 0;
  bool update = false;
  // Queue.default_queue.
  bool make_default = false;
  // Queue.nominal_gpu_flavors, borrowing_limit_gpu_flavors and
  // lending_limit_gpu_flavors ("FLAVOR=N" each).
  std::vector<std::string> gpu_flavor_quotas;
  std::vector<std::string> gpu_flavor_borrowing_limits;
  std::vector<std::string> gpu_flavor_lending_limits;
  // Queue.weight (0: unset, 1) and owner_weights ("OWNER=W" each).
  double weight = 0;
  std::vector<std::string> owner_weights;
  // Queue.default_max_runtime_s / max_runtime_s (0: none).
  double default_max_runtime_s = 0;
  double max_runtime_s = 0;
};

// A memory quota flag's bytes into `out` (left empty for "" or "-1":
// unset); false with `error` set when it does not parse.
bool ParseMemoryQuota(const char* flag, const std::string& text, std::optional<int64_t>& out,
                      std::string& error) {
  out.reset();
  if (text.empty() || text == "-1") return true;
  out = jobspec::ParseByteQuantity(text);
  if (out.has_value()) return true;
  error =
      absl::StrCat(flag,
                   ": must be a byte quantity (512Mi, 64Gi, 2G or plain bytes; -1 = unlimited), "
                   "got '",
                   text, "'");
  return false;
}

int RunQueueCreate(CliContext& ctx, const QueueArgs& a) {
  v1::Queue q;
  q.set_name(a.name);
  if (a.gpu != -1) q.set_nominal_gpu(a.gpu);
  if (a.cpu != -1) q.set_nominal_cpu(a.cpu);
  if (a.borrowing_limit_gpu != -1) q.set_borrowing_limit_gpu(a.borrowing_limit_gpu);
  if (a.borrowing_limit_cpu != -1) q.set_borrowing_limit_cpu(a.borrowing_limit_cpu);
  if (a.lending_limit_gpu != -1) q.set_lending_limit_gpu(a.lending_limit_gpu);
  if (a.lending_limit_cpu != -1) q.set_lending_limit_cpu(a.lending_limit_cpu);
  if (a.nominal_cpus != -1) q.set_nominal_cpus(a.nominal_cpus);
  if (a.borrowing_limit_cpus != -1) q.set_borrowing_limit_cpus(a.borrowing_limit_cpus);
  if (a.lending_limit_cpus != -1) q.set_lending_limit_cpus(a.lending_limit_cpus);
  for (const auto& [flag, text, setter] :
       {std::tuple<const char*, const std::string&, void (v1::Queue::*)(int64_t)>{
            "--nominal-memory", a.nominal_memory, &v1::Queue::set_nominal_memory_bytes},
        std::tuple<const char*, const std::string&, void (v1::Queue::*)(int64_t)>{
            "--borrowing-limit-memory", a.borrowing_limit_memory,
            &v1::Queue::set_borrowing_limit_memory_bytes},
        std::tuple<const char*, const std::string&, void (v1::Queue::*)(int64_t)>{
            "--lending-limit-memory", a.lending_limit_memory,
            &v1::Queue::set_lending_limit_memory_bytes}}) {
    std::optional<int64_t> bytes;
    std::string error;
    if (!ParseMemoryQuota(flag, text, bytes, error)) {
      return ctx.Fail(absl::InvalidArgumentError(error));
    }
    if (bytes.has_value()) (q.*setter)(*bytes);
  }
  q.set_cohort(a.cohort);
  q.set_max_job_size(a.max_job_size);
  q.set_max_running_jobs_per_owner(a.max_jobs_per_owner);
  q.set_max_slots_per_owner(a.max_slots_per_owner);
  q.set_default_priority(a.default_priority);
  q.set_default_queue(a.make_default);
  q.set_weight(a.weight);
  q.set_default_max_runtime_s(a.default_max_runtime_s);
  q.set_max_runtime_s(a.max_runtime_s);
  for (const auto& [flag, values, field] :
       {std::tuple<const char*, const std::vector<std::string>&,
                   google::protobuf::Map<std::string, int32_t>*>{
            "--nominal-gpus-flavor", a.gpu_flavor_quotas, q.mutable_nominal_gpu_flavors()},
        std::tuple<const char*, const std::vector<std::string>&,
                   google::protobuf::Map<std::string, int32_t>*>{
            "--borrowing-limit-gpus-flavor", a.gpu_flavor_borrowing_limits,
            q.mutable_borrowing_limit_gpu_flavors()},
        std::tuple<const char*, const std::vector<std::string>&,
                   google::protobuf::Map<std::string, int32_t>*>{
            "--lending-limit-gpus-flavor", a.gpu_flavor_lending_limits,
            q.mutable_lending_limit_gpu_flavors()}}) {
    std::map<std::string, int> counts;
    if (absl::Status s = ParseFlavorCounts(flag, values, counts); !s.ok()) return ctx.Fail(s);
    for (const auto& [flavor, n] : counts) (*field)[flavor] = n;
  }
  for (const std::string& ow : a.owner_weights) {
    // OWNER=WEIGHT; the owner (a token name) may itself hold '=': split at the last.
    const size_t eq = ow.rfind('=');
    double w = 0;
    if (eq == std::string::npos || !absl::SimpleAtod(ow.substr(eq + 1), &w)) {
      return ctx.Fail(absl::InvalidArgumentError(
          absl::StrCat("--owner-weight: must be OWNER=WEIGHT (e.g. alice=2), got '", ow, "'")));
    }
    (*q.mutable_owner_weights())[ow.substr(0, eq)] = w;
  }
  if (!a.default_memory.empty()) {
    // As job.yaml's resources.memory: 512Mi, 4Gi, 2G or plain bytes.
    std::optional<int64_t> bytes = jobspec::ParseByteQuantity(a.default_memory);
    if (!bytes.has_value()) {
      return ctx.Fail(absl::InvalidArgumentError(absl::StrCat(
          "--default-memory: must be a byte quantity (512Mi, 4Gi, 2G or plain bytes), got '",
          a.default_memory, "'")));
    }
    q.mutable_default_resources()->set_memory(*bytes);
  }
  if (a.default_cpus != 0) q.mutable_default_resources()->set_cpus(a.default_cpus);
  if (a.default_pids != 0) q.mutable_default_resources()->set_pids(a.default_pids);
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.CreateQueue(q, a.update); },
      [&](v1::Queue& made) -> int {
        if (ctx.json()) {
          ctx.PrintJson(made);
          return kExitOk;
        }
        // Says what each slot kind means, so that `--cpu 2` alone is not read as
        // a limit on GPUs too.
        ctx.out
            << "queue " << made.name() << (a.update ? " created or updated" : " created") << ": "
            << NominalMeaning("GPUs", "--gpu", made.has_nominal_gpu(), made.nominal_gpu())
            << (GpuLimits(made).empty() ? "" : absl::StrCat(" (", GpuLimits(made), ")")) << ", "
            << NominalMeaning("CPUs", "--cpu", made.has_nominal_cpu(), made.nominal_cpu())
            << (CpuLimits(made).empty() ? "" : absl::StrCat(" (", CpuLimits(made), ")"))
            << (ResourceQuotaText(made).empty() ? "" : absl::StrCat(", ", ResourceQuotaText(made)))
            << (FlavorQuotaText(made).empty() ? ""
                                              : absl::StrCat(", by flavor ", FlavorQuotaText(made)))
            << (made.cohort().empty() ? "" : absl::StrCat(", cohort ", made.cohort()))
            << (made.max_job_size() > 0 ? absl::StrCat(", max job size ", made.max_job_size()) : "")
            << ", default priority " << made.default_priority()
            << (made.weight() > 0 && made.weight() != 1 ? absl::StrCat(", weight ", made.weight())
                                                        : "")
            << (made.has_default_resources()
                    ? absl::StrCat(", default resources ", ResourcesText(made.default_resources()))
                    : "")
            << (made.default_max_runtime_s() > 0 || made.max_runtime_s() > 0
                    ? absl::StrCat(", runtime ", RuntimeLimitText(made))
                    : "")
            << "\n";
        if (made.default_queue()) {
          ctx.out << made.name() << " is the default queue: jobs that name no queue go here\n";
        }
        return kExitOk;
      });
}

int RunQueueList(CliContext& ctx) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.ListQueues(); },
      [&](std::vector<v1::QueueStatus>& queues) -> int {
        if (ctx.json()) return PrintJsonList(ctx, queues, &v1::ListQueuesResponse::mutable_queues);
        if (queues.empty()) {
          ctx.out << "no queues (every job runs as before queues: one unlimited queue)\n";
          return kExitOk;
        }
        // The CPUS/MEMORY column (used/nominal) only when some queue has
        // such a quota; GPU flavors are describe's.
        const bool resource_quotas = std::any_of(
            queues.begin(), queues.end(),
            [](const v1::QueueStatus& s) { return !ResourceQuotaText(s.queue()).empty(); });
        std::vector<std::string> header = {"NAME", "COHORT", "GPU", "CPU"};
        if (resource_quotas) header.push_back("CPUS/MEMORY");
        for (const char* h : {"MAX-JOB", "PRIORITY", "PENDING", "RUNNING", "DEFAULT"}) {
          header.push_back(h);
        }
        Table t(header);
        for (const v1::QueueStatus& s : queues) {
          const v1::Queue& q = s.queue();
          std::vector<std::string> row = {
              q.name(), q.cohort().empty() ? "-" : q.cohort(),
              QuotaText(s.used_gpu(), q.has_nominal_gpu(), q.nominal_gpu(), GpuLimits(q)),
              QuotaText(s.used_cpu(), q.has_nominal_cpu(), q.nominal_cpu(), CpuLimits(q))};
          if (resource_quotas) row.push_back(ResourceUseCell(s));
          for (std::string cell :
               {q.max_job_size() > 0 ? absl::StrCat(q.max_job_size()) : std::string("-"),
                absl::StrCat(q.default_priority()), absl::StrCat(s.pending_jobs()),
                absl::StrCat(s.running_jobs()), std::string(q.default_queue() ? "yes" : "-")}) {
            row.push_back(std::move(cell));
          }
          t.AddRow(row);
        }
        t.Print(ctx.out);
        return kExitOk;
      });
}

int RunQueueDescribe(CliContext& ctx, const std::string& name) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.GetQueue(name); },
      [&](v1::QueueStatus& s) -> int {
        if (ctx.json()) {
          ctx.PrintJson(s);
          return kExitOk;
        }
        const v1::Queue& q = s.queue();
        Table t({"", ""});
        t.AddRow({"Name:", q.name()});
        t.AddRow(
            {"Default queue:", q.default_queue() ? "yes (jobs that name no queue go here)" : "no"});
        t.AddRow({"Cohort:", q.cohort().empty() ? "- (lends and borrows nothing)" : q.cohort()});
        // Each quota dimension the queue has or uses: used of nominal.
        t.AddRow({"GPU slots:", GpuSlotsUse(s)});
        t.AddRow({"CPU slots:", CpuSlotsUse(s)});
        if (!CpusUse(s).empty()) t.AddRow({"CPUs:", CpusUse(s)});
        if (!MemoryUse(s).empty()) t.AddRow({"Memory:", MemoryUse(s)});
        for (const auto& [flavor, use] : FlavorUses(s)) {
          t.AddRow({absl::StrCat("GPU flavor ", flavor, ":"), use});
        }
        t.AddRow({"Max job size:",
                  q.max_job_size() > 0 ? absl::StrCat(q.max_job_size(), " ranks") : "no limit"});
        t.AddRow({"Default priority:", absl::StrCat(q.default_priority())});
        t.AddRow({"Per owner:", OwnerLimitsText(q)});
        t.AddRow({"Runtime limit:", RuntimeLimitText(q)});
        std::vector<std::string> owners;
        for (const auto& [owner, w] : q.owner_weights())
          owners.push_back(absl::StrCat(owner, "=", w));
        std::sort(owners.begin(), owners.end());
        t.AddRow(
            {"Fair-share weight:",
             absl::StrCat(q.weight() > 0 ? q.weight() : 1.0,
                          owners.empty()
                              ? ""
                              : absl::StrCat(" (owners: ", absl::StrJoin(owners, ", "), ")"))});
        t.AddRow({"Default resources:",
                  absl::StrCat(ResourcesText(q.default_resources()),
                               q.has_default_resources() ? " (jobs that ask for none)" : "")});
        t.AddRow(
            {"Jobs:", absl::StrCat(s.pending_jobs(), " pending, ", s.running_jobs(), " running")});
        t.AddRow({"Created:", FormatTimestamp(q.create_time())});
        std::ostringstream body;
        t.Print(body);
        const std::string text = body.str();
        ctx.out << text.substr(text.find('\n') + 1);
        return kExitOk;
      });
}

int RunQueueDelete(CliContext& ctx, const std::string& name) {
  return ConnectCallPrint(
      ctx, [&](Client& client) { return client.DeleteQueue(name); },
      [&]() -> int {
        if (!ctx.json()) ctx.out << "queue " << name << " deleted\n";
        return kExitOk;
      });
}

}  // namespace

VerbRunner AddQueueVerb(CLI::App& app, CliContext& ctx) {
  CLI::App* sub = AddVerb(
      app, "queue", "Create, list, describe and delete queues (docs/queues.md)",
      "  trainctl queue create research --gpu 16 --cohort lab --default-priority 10\n"
      "  trainctl queue create research --gpu 24 --cohort lab --update\n"
      "  trainctl queue create team-a --gpu 8 --cpu 32 --default\n"
      "  trainctl queue create team-b --gpu 8 --cohort lab --borrowing-limit-gpu 4 "
      "--lending-limit-gpu 2\n"
      "  trainctl queue create batch --cpu 64 --default-cpus 2 --default-memory 4Gi\n"
      "  trainctl queue create team-c --cohort lab --nominal-cpus 64 --nominal-memory 256Gi "
      "--borrowing-limit-memory 64Gi\n"
      "  trainctl queue list\n"
      "  trainctl queue describe research\n"
      "  trainctl queue delete research\n",
      "Examples:");
  sub->require_subcommand(1, 1);
  auto create = std::make_shared<QueueArgs>();
  auto name = std::make_shared<std::string>();
  auto which = std::make_shared<std::string>();
  CLI::App* c =
      sub->add_subcommand("create", "Define a queue, or with --update replace one (admin)");
  c->add_option("NAME", create->name, "Queue name: [a-z0-9-], at most 63 characters")->required();
  c->add_option("--gpu", create->gpu,
                "Nominal GPU slots its jobs may hold (default: unlimited; -1 = unlimited)")
      ->type_name("N");
  c->add_option("--cpu", create->cpu,
                "Nominal CPU slots its jobs may hold (default: unlimited; -1 = unlimited)")
      ->type_name("N");
  c->add_option("--borrowing-limit-gpu", create->borrowing_limit_gpu,
                "Most GPU slots beyond --gpu it may borrow from its cohort (default: no limit)")
      ->type_name("N");
  c->add_option("--borrowing-limit-cpu", create->borrowing_limit_cpu,
                "Most CPU slots beyond --cpu it may borrow from its cohort (default: no limit)")
      ->type_name("N");
  c->add_option("--lending-limit-gpu", create->lending_limit_gpu,
                "Most of its --gpu it lends to its cohort; the rest stays reserved for it "
                "(default: no limit)")
      ->type_name("N");
  c->add_option("--lending-limit-cpu", create->lending_limit_cpu,
                "Most of its --cpu it lends to its cohort; the rest stays reserved for it "
                "(default: no limit)")
      ->type_name("N");
  c->add_option(
       "--nominal-gpus-flavor", create->gpu_flavor_quotas,
       "FLAVOR=N, repeatable: nominal GPU slots of that flavor (resources.gpu_flavor) its "
       "jobs may hold, lent to and borrowed from its cohort as --gpu (default: no limit by "
       "flavor)")
      ->type_name("FLAVOR=N");
  c->add_option("--borrowing-limit-gpus-flavor", create->gpu_flavor_borrowing_limits,
                "FLAVOR=N, repeatable: most GPU slots of that flavor beyond its "
                "--nominal-gpus-flavor it may borrow from its cohort (default: no limit)")
      ->type_name("FLAVOR=N");
  c->add_option("--lending-limit-gpus-flavor", create->gpu_flavor_lending_limits,
                "FLAVOR=N, repeatable: most of its --nominal-gpus-flavor of that flavor it lends "
                "to its cohort; the rest stays reserved for it (default: no limit)")
      ->type_name("FLAVOR=N");
  c->add_option("--nominal-cpus", create->nominal_cpus,
                "Nominal CPUs its jobs may hold, counted as resources.cpus x ranks (default: "
                "unlimited; -1 = unlimited)")
      ->type_name("CPUS");
  c->add_option("--nominal-memory", create->nominal_memory,
                "Nominal memory its jobs may hold, counted as resources.memory x ranks: 512Mi, "
                "64Gi, 2G or bytes (default: unlimited; -1 = unlimited)")
      ->type_name("BYTES");
  c->add_option("--borrowing-limit-cpus", create->borrowing_limit_cpus,
                "Most CPUs beyond --nominal-cpus it may borrow from its cohort (default: no limit)")
      ->type_name("CPUS");
  c->add_option("--borrowing-limit-memory", create->borrowing_limit_memory,
                "Most memory beyond --nominal-memory it may borrow from its cohort (default: no "
                "limit)")
      ->type_name("BYTES");
  c->add_option("--lending-limit-cpus", create->lending_limit_cpus,
                "Most of its --nominal-cpus it lends to its cohort; the rest stays reserved for it "
                "(default: no limit)")
      ->type_name("CPUS");
  c->add_option("--lending-limit-memory", create->lending_limit_memory,
                "Most of its --nominal-memory it lends to its cohort; the rest stays reserved for "
                "it (default: no limit)")
      ->type_name("BYTES");
  c->add_option("--cohort", create->cohort,
                "Queues of one cohort lend each other idle quota and reclaim it by preemption");
  c->add_option(
       "--max-job-size", create->max_job_size,
       "Refuse jobs of more ranks (elastic: min_ranks) at submission (default 0: no limit)")
      ->type_name("N");
  c->add_option(
       "--max-jobs-per-owner", create->max_jobs_per_owner,
       "Most jobs one owner may have running in the queue; more wait (default 0: no limit)")
      ->type_name("N");
  c->add_option(
       "--max-slots-per-owner", create->max_slots_per_owner,
       "Most slots one owner's jobs may hold in the queue; more wait (default 0: no limit)")
      ->type_name("N");
  c->add_option("--default-priority", create->default_priority,
                "Priority of a job submitted here without one (default 0)")
      ->type_name("P");
  c->add_option("--default-cpus", create->default_cpus,
                "CPUs per rank for a job that asks for no resources (default 0: none)")
      ->type_name("N");
  c->add_option("--default-memory", create->default_memory,
                "Memory per rank for a job that asks for no resources: 512Mi, 4Gi, 2G or bytes "
                "(default: none)")
      ->type_name("BYTES");
  c->add_option("--default-pids", create->default_pids,
                "Processes per rank for a job that asks for no resources (default 0: none)")
      ->type_name("N");
  c->add_option(
       "--default-max-runtime-s", create->default_max_runtime_s,
       "scheduling.max_runtime_s of a job that gives none (Slurm's DefaultTime; default 0: "
       "the --max-runtime-s, else none)")
      ->type_name("SECONDS");
  c->add_option("--max-runtime-s", create->max_runtime_s,
                "Refuse jobs asking more scheduling.max_runtime_s at submission (Slurm's MaxTime; "
                "default 0: no limit)")
      ->type_name("SECONDS");
  c->add_option("--weight", create->weight,
                "Fair-share weight: queues get idle capacity in proportion to it (default 1)")
      ->type_name("W");
  c->add_option(
       "--owner-weight", create->owner_weights,
       "OWNER=WEIGHT, repeatable: an owner's fair-share weight within the queue (default 1 each)")
      ->type_name("OWNER=W");
  c->add_flag("--update", create->update,
              "Replace the queue if it exists (else create it); the whole queue: give --default "
              "again to keep it "
              "the default");
  c->add_flag("--default", create->make_default,
              "Make it the cluster's default queue: jobs that name no queue (from tokens bound to "
              "none) go here; "
              "the previous default is un-marked");
  c->callback([which] { *which = "create"; });
  CLI::App* l = sub->add_subcommand("list",
                                    "List queues with their use (GPU and CPU slots, CPUs/memory: "
                                    "used/nominal, - = unlimited) and which is the default");
  l->callback([which] { *which = "list"; });
  CLI::App* d = sub->add_subcommand(
      "describe",
      "Show one queue in full, with its use of each quota (slots, CPUs, memory, flavors)");
  d->add_option("NAME", *name, "Queue name")->required();
  d->callback([which] { *which = "describe"; });
  CLI::App* del =
      sub->add_subcommand("delete", "Delete a queue that has no pending or running job (admin)");
  del->add_option("NAME", *name, "Queue name")->required();
  del->callback([which] { *which = "delete"; });
  return [&ctx, create, name, which] {
    if (*which == "create") return RunQueueCreate(ctx, *create);
    if (*which == "list") return RunQueueList(ctx);
    if (*which == "describe") return RunQueueDescribe(ctx, *name);
    return RunQueueDelete(ctx, *name);
  };
}

}  // namespace trainctl::cli

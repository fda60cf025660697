#include "client/cli/queue_text.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli/format.h"
#include "common/format_bytes.h"

namespace trainctl::cli {

namespace {

// "borrows at most 2, lends at most 1" from texts of the set limits.
std::string JoinLimits(bool has_borrow, const std::string& borrow, bool has_lend,
                       const std::string& lend) {
  std::vector<std::string> parts;
  if (has_borrow) parts.push_back(absl::StrCat("borrows at most ", borrow));
  if (has_lend) parts.push_back(absl::StrCat("lends at most ", lend));
  return absl::StrJoin(parts, ", ");
}

bool HasCpusQuota(const v1::Queue& q) { return q.has_nominal_cpus() && q.nominal_cpus() >= 0; }
bool HasMemoryQuota(const v1::Queue& q) {
  return q.has_nominal_memory_bytes() && q.nominal_memory_bytes() >= 0;
}
std::string CpusLimits(const v1::Queue& q) {
  return JoinLimits(q.has_borrowing_limit_cpus() && q.borrowing_limit_cpus() >= 0,
                    absl::StrCat(q.borrowing_limit_cpus()),
                    q.has_lending_limit_cpus() && q.lending_limit_cpus() >= 0,
                    absl::StrCat(q.lending_limit_cpus()));
}
std::string MemoryLimits(const v1::Queue& q) {
  return JoinLimits(q.has_borrowing_limit_memory_bytes() && q.borrowing_limit_memory_bytes() >= 0,
                    FormatBytes(q.borrowing_limit_memory_bytes()),
                    q.has_lending_limit_memory_bytes() && q.lending_limit_memory_bytes() >= 0,
                    FormatBytes(q.lending_limit_memory_bytes()));
}
// A flavor's limits: "borrows at most 2, lends at most 1", "" for none.
std::string FlavorLimits(const v1::Queue& q, const std::string& flavor) {
  auto borrow = q.borrowing_limit_gpu_flavors().find(flavor);
  auto lend = q.lending_limit_gpu_flavors().find(flavor);
  const bool has_borrow = borrow != q.borrowing_limit_gpu_flavors().end();
  const bool has_lend = lend != q.lending_limit_gpu_flavors().end();
  return JoinLimits(has_borrow, has_borrow ? absl::StrCat(borrow->second) : "", has_lend,
                    has_lend ? absl::StrCat(lend->second) : "");
}
// Memory held: "0" rather than "0 bytes" (a table cell reads "0/16 GiB").
std::string MemoryAmount(int64_t bytes) { return bytes == 0 ? "0" : FormatBytes(bytes); }

// "3 used of 2 (1 borrowed; borrows at most 1)": `nominal` "" = unlimited,
// `borrowed` "" = nothing borrowed.
std::string UseText(const std::string& used, const std::string& nominal,
                    const std::string& borrowed, const std::string& limits) {
  std::vector<std::string> notes;
  if (!borrowed.empty()) notes.push_back(absl::StrCat(borrowed, " borrowed"));
  if (!limits.empty()) notes.push_back(limits);
  return absl::StrCat(used, " used of ", nominal.empty() ? "unlimited" : nominal,
                      notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(notes, "; "), ")"));
}

std::string SlotsUse(int used, bool has_nominal, int nominal, int borrowed,
                     const std::string& limits) {
  return UseText(absl::StrCat(used), has_nominal && nominal >= 0 ? absl::StrCat(nominal) : "",
                 borrowed > 0 ? absl::StrCat(borrowed) : "", limits);
}

}  // namespace

std::string RuntimeLimitText(const v1::Queue& q) {
  std::vector<std::string> parts;
  if (q.default_max_runtime_s() > 0) {
    parts.push_back(
        absl::StrCat("default ", HumanDuration(absl::Seconds(q.default_max_runtime_s()))));
  }
  if (q.max_runtime_s() > 0) {
    parts.push_back(absl::StrCat("at most ", HumanDuration(absl::Seconds(q.max_runtime_s()))));
  }
  if (parts.empty()) return "no limit";
  return absl::StrJoin(parts, ", ");
}

std::string ResourcesText(const v1::ResourceSpec& r) {
  std::vector<std::string> parts;
  if (r.cpus() > 0) parts.push_back(absl::StrCat(r.cpus(), r.cpus() == 1 ? " cpu" : " cpus"));
  if (r.memory() > 0) parts.push_back(absl::StrCat(FormatBytes(r.memory()), " memory"));
  if (r.pids() > 0) parts.push_back(absl::StrCat(r.pids(), " pids"));
  if (parts.empty()) return "none";
  return absl::StrCat(absl::StrJoin(parts, ", "), " per rank");
}

std::string NominalMeaning(const char* kind, const char* flag, bool has_nominal, int nominal) {
  if (!has_nominal) return absl::StrCat(kind, " unlimited (no ", flag, ")");
  if (nominal == 0) return absl::StrCat(kind, " 0 (none of its own: only what its cohort lends)");
  return absl::StrCat(kind, " ", nominal);
}

std::string OwnerLimitsText(const v1::Queue& q) {
  std::vector<std::string> parts;
  if (q.max_running_jobs_per_owner() > 0) {
    parts.push_back(absl::StrCat(q.max_running_jobs_per_owner(), " running jobs"));
  }
  if (q.max_slots_per_owner() > 0) parts.push_back(absl::StrCat(q.max_slots_per_owner(), " slots"));
  if (parts.empty()) return "no limit";
  return absl::StrCat("at most ", absl::StrJoin(parts, ", "));
}

std::string GpuLimits(const v1::Queue& q) {
  return JoinLimits(q.has_borrowing_limit_gpu() && q.borrowing_limit_gpu() >= 0,
                    absl::StrCat(q.borrowing_limit_gpu()),
                    q.has_lending_limit_gpu() && q.lending_limit_gpu() >= 0,
                    absl::StrCat(q.lending_limit_gpu()));
}
std::string CpuLimits(const v1::Queue& q) {
  return JoinLimits(q.has_borrowing_limit_cpu() && q.borrowing_limit_cpu() >= 0,
                    absl::StrCat(q.borrowing_limit_cpu()),
                    q.has_lending_limit_cpu() && q.lending_limit_cpu() >= 0,
                    absl::StrCat(q.lending_limit_cpu()));
}

std::string ResourceQuotaText(const v1::Queue& q) {
  std::vector<std::string> parts;
  auto one = [&](const char* what, const std::string& nominal, const std::string& limits) {
    parts.push_back(
        absl::StrCat(what, " ", nominal, limits.empty() ? "" : absl::StrCat(" (", limits, ")")));
  };
  if (HasCpusQuota(q)) one("cpus", absl::StrCat(q.nominal_cpus()), CpusLimits(q));
  if (HasMemoryQuota(q)) one("memory", FormatBytes(q.nominal_memory_bytes()), MemoryLimits(q));
  return absl::StrJoin(parts, ", ");
}

std::string FlavorQuotaText(const v1::Queue& q) {
  std::map<std::string, int> sorted(q.nominal_gpu_flavors().begin(), q.nominal_gpu_flavors().end());
  std::vector<std::string> parts, limits;
  for (const auto& [flavor, n] : sorted) {
    parts.push_back(absl::StrCat(flavor, " ", n));
    if (std::string l = FlavorLimits(q, flavor); !l.empty())
      limits.push_back(absl::StrCat(flavor, " ", l));
  }
  if (parts.empty()) return "";
  return absl::StrCat(absl::StrJoin(parts, ", "), " gpus",
                      limits.empty() ? "" : absl::StrCat("; ", absl::StrJoin(limits, "; ")));
}

absl::Status ParseFlavorCounts(const char* flag, const std::vector<std::string>& values,
                               std::map<std::string, int>& out) {
  for (const std::string& value : values) {
    const size_t eq = value.find('=');
    int n = 0;
    if (eq == std::string::npos || eq == 0 || !absl::SimpleAtoi(value.substr(eq + 1), &n) ||
        n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": must be FLAVOR=N with N >= 0 (e.g. h100=4), got '", value, "'"));
    }
    out[value.substr(0, eq)] = n;
  }
  return absl::OkStatus();
}

std::string QuotaText(int used, bool has_nominal, int nominal, const std::string& limits) {
  return absl::StrCat(used, "/", has_nominal ? absl::StrCat(nominal) : std::string("-"),
                      limits.empty() ? "" : absl::StrCat(" (", limits, ")"));
}

std::string GpuSlotsUse(const v1::QueueStatus& s) {
  const v1::Queue& q = s.queue();
  return SlotsUse(s.used_gpu(), q.has_nominal_gpu(), q.nominal_gpu(), s.borrowed_gpu(),
                  GpuLimits(q));
}

std::string CpuSlotsUse(const v1::QueueStatus& s) {
  const v1::Queue& q = s.queue();
  return SlotsUse(s.used_cpu(), q.has_nominal_cpu(), q.nominal_cpu(), s.borrowed_cpu(),
                  CpuLimits(q));
}

std::string CpusUse(const v1::QueueStatus& s) {
  const v1::Queue& q = s.queue();
  if (!HasCpusQuota(q) && s.used_cpus() <= 0) return "";
  return UseText(absl::StrCat(s.used_cpus()), HasCpusQuota(q) ? absl::StrCat(q.nominal_cpus()) : "",
                 s.borrowed_cpus() > 0 ? absl::StrCat(s.borrowed_cpus()) : "", CpusLimits(q));
}

std::string MemoryUse(const v1::QueueStatus& s) {
  const v1::Queue& q = s.queue();
  if (!HasMemoryQuota(q) && s.used_memory_bytes() <= 0) return "";
  return UseText(MemoryAmount(s.used_memory_bytes()),
                 HasMemoryQuota(q) ? FormatBytes(q.nominal_memory_bytes()) : "",
                 s.borrowed_memory_bytes() > 0 ? FormatBytes(s.borrowed_memory_bytes()) : "",
                 MemoryLimits(q));
}

std::vector<std::pair<std::string, std::string>> FlavorUses(const v1::QueueStatus& s) {
  // Flavor -> nominal (-1: none).
  std::map<std::string, int> flavors;
  for (const auto& [flavor, slots] : s.used_gpu_flavors()) flavors.emplace(flavor, -1);
  for (const auto& [flavor, nominal] : s.queue().nominal_gpu_flavors()) flavors[flavor] = nominal;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [flavor, nominal] : flavors) {
    auto used = s.used_gpu_flavors().find(flavor);
    auto borrowed = s.borrowed_gpu_flavors().find(flavor);
    out.emplace_back(flavor,
                     UseText(absl::StrCat(used == s.used_gpu_flavors().end() ? 0 : used->second),
                             nominal >= 0 ? absl::StrCat(nominal) : "",
                             borrowed != s.borrowed_gpu_flavors().end() && borrowed->second > 0
                                 ? absl::StrCat(borrowed->second)
                                 : "",
                             FlavorLimits(s.queue(), flavor)));
  }
  return out;
}

std::string ResourceUseCell(const v1::QueueStatus& s) {
  const v1::Queue& q = s.queue();
  std::vector<std::string> parts;
  auto one = [&](const char* what, const std::string& used, const std::string& nominal,
                 const std::string& limits) {
    parts.push_back(absl::StrCat(what, " ", used, "/", nominal,
                                 limits.empty() ? "" : absl::StrCat(" (", limits, ")")));
  };
  if (HasCpusQuota(q) || s.used_cpus() > 0) {
    one("cpus", absl::StrCat(s.used_cpus()), HasCpusQuota(q) ? absl::StrCat(q.nominal_cpus()) : "-",
        CpusLimits(q));
  }
  if (HasMemoryQuota(q) || s.used_memory_bytes() > 0) {
    one("memory", MemoryAmount(s.used_memory_bytes()),
        HasMemoryQuota(q) ? FormatBytes(q.nominal_memory_bytes()) : "-", MemoryLimits(q));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

}  // namespace trainctl::cli

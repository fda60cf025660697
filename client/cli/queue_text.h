// How `trainctl queue` (queues.cc) words a queue and its use: quotas,
// limits and what the queue's jobs hold in each quota dimension (slots,
// CPUs, memory, GPU slots by flavor), for create's message, list's table
// and describe's lines; and how it reads the per-flavor flags.
//
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

#include "trainctl/v1/queue.pb.h"

namespace trainctl::cli {

// "default 1h, at most 2h", "at most 10m", or "no limit".
std::string RuntimeLimitText(const v1::Queue& q);
// "2 cpus, 4 GiB memory, 512 pids per rank", or "none".
std::string ResourcesText(const v1::ResourceSpec& r);
// What a nominal quota of one slot kind means, for the create message:
// "GPUs unlimited (no --gpu)", "CPUs 2", "GPUs 0 (none of its own: ...)".
std::string NominalMeaning(const char* kind, const char* flag, bool has_nominal, int nominal);
// "at most 2 running jobs, 8 slots", or "no limit".
std::string OwnerLimitsText(const v1::Queue& q);
// A slot kind's borrowing and lending limits: "borrows at most 2, lends at
// most 1", "" when neither is set (-1 reads as unset).
std::string GpuLimits(const v1::Queue& q);
std::string CpuLimits(const v1::Queue& q);
// The CPU and memory quotas (Queue fields 20-25) where set: "cpus 32
// (borrows at most 8), memory 64 GiB (lends at most 16 GiB)", "" when the
// queue has neither.
std::string ResourceQuotaText(const v1::Queue& q);
// "a100 2, h100 4 gpus" (by flavor), then each flavor's limits where set
// ("a100 2, h100 4 gpus; h100 borrows at most 2, lends at most 1"), or ""
// when the queue has none.
std::string FlavorQuotaText(const v1::Queue& q);
// The values of a repeatable FLAVOR=N flag (--nominal-gpus-flavor h100=4)
// into `out` (a flavor given twice: the last wins). InvalidArgument naming
// `flag` and the value for anything but FLAVOR=N with N >= 0; the flavor
// name itself is the coordinator's to check.
absl::Status ParseFlavorCounts(const char* flag, const std::vector<std::string>& values,
                               std::map<std::string, int>& out);
// "used/nominal", "-" for an unlimited nominal ("3/-"), then the limits
// when any: "3/2 (borrows at most 1)".
std::string QuotaText(int used, bool has_nominal, int nominal, const std::string& limits);

// What the queue's jobs hold of each quota dimension, as describe's lines
// say it: "3 used of 2 (1 borrowed; borrows at most 1)", "0 used of
// unlimited". The CPU and memory ones are "" when the queue has no such
// quota and holds none.
std::string GpuSlotsUse(const v1::QueueStatus& s);
std::string CpuSlotsUse(const v1::QueueStatus& s);
std::string CpusUse(const v1::QueueStatus& s);
std::string MemoryUse(const v1::QueueStatus& s);
// Per GPU flavor with a quota or a slot held, sorted: {"h100", "5 used of
// 4 (1 borrowed; borrows at most 2, lends at most 1)"}, {"a100", "1 used of
// unlimited"}.
std::vector<std::pair<std::string, std::string>> FlavorUses(const v1::QueueStatus& s);
// List's CPUS/MEMORY cell: "cpus 3.5/2.5 (lends at most 2), memory
// 12 GiB/8 GiB" (used/nominal as the slot columns, "-" unlimited) for each
// of the two the queue has a quota of or holds; "-" when neither.
std::string ResourceUseCell(const v1::QueueStatus& s);

}  // namespace trainctl::cli

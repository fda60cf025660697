// GradientBucketer's PowerSGD state for checkpoints (gradient_bucketer.h:
// SavePowerSgdState, RestorePowerSgdState), apart from the step's hot path
// in gradient_bucketer.cc. The trainer calls them at its checkpoint points
// and after a resume (docs/ddp.md, "State and restarts").
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/dist/gradient_bucketer.h"
#include "worker/dist/tensor_collectives.h"

namespace trainctl::dist {

std::string GradientBucketer::PowerSgdLayoutLocked() const {
  std::vector<std::string> lines;
  for (const auto& b : buckets_) {
    if (b.powersgd != nullptr) lines.push_back(b.powersgd->Layout());
  }
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<PowerSgdState> GradientBucketer::SavePowerSgdState(bool keep_errors) {
  absl::MutexLock l(&mu_);
  if (options_.comm_hook != CommHook::kPowerSgd) {
    return absl::FailedPreconditionError(
        "GradientBucketer: no PowerSGD state: comm_hook is not powersgd");
  }
  if (step_started_) {
    return absl::FailedPreconditionError(
        "GradientBucketer: PowerSGD's state is saved between steps, not inside one");
  }
  PowerSgdState s;
  s.iter = synced_steps_;
  std::ostringstream rng;
  rng << powersgd_rng_;
  s.rng = rng.str();
  s.layout = PowerSgdLayoutLocked();
  s.world_size = comm_->world_size();
  // Before the first PowerSGD step the errors are zero and there is no Q:
  // the count says it all (the same on every rank, so every rank skips the
  // broadcasts alike).
  if (synced_steps_ <= options_.powersgd.start_iter) return s;
  c10::NoGradGuard no_grad;
  std::vector<PowerSgdBucket*> psgd;
  for (auto& b : buckets_) {
    if (b.powersgd == nullptr) continue;
    psgd.push_back(b.powersgd.get());
    s.q.push_back(b.powersgd->q().cpu().clone());
    s.has_q = s.has_q || b.powersgd->has_q();
  }
  if (!options_.powersgd.use_error_feedback || psgd.empty()) return s;
  // Every bucket's error of one rank travels as one buffer; each rank in
  // turn is the root. A non-writer's copy is dropped at once.
  std::vector<int64_t> sizes;
  for (PowerSgdBucket* b : psgd) sizes.push_back(b->error().numel());
  const int world = comm_->world_size();
  if (keep_errors) s.errors.resize(static_cast<size_t>(world));
  for (int root = 0; root < world; ++root) {
    at::Tensor flat;
    if (root == comm_->rank()) {
      std::vector<at::Tensor> mine;
      for (PowerSgdBucket* b : psgd) mine.push_back(b->error());
      flat = at::cat(mine);
    } else {
      flat = at::empty({std::accumulate(sizes.begin(), sizes.end(), int64_t{0})},
                       psgd.front()->error().options());
    }
    TRAINCTL_RETURN_IF_ERROR(Broadcast(*comm_, flat, root)->Wait());
    if (!keep_errors) continue;
    at::Tensor host = flat.to(at::kCPU);
    int64_t off = 0;
    for (int64_t n : sizes) {
      s.errors[static_cast<size_t>(root)].push_back(host.narrow(0, off, n).clone());
      off += n;
    }
  }
  return s;
}

std::string GradientBucketer::RestorePowerSgdState(const PowerSgdState& s) {
  absl::MutexLock l(&mu_);
  if (options_.comm_hook != CommHook::kPowerSgd)
    return "powersgd: not in use; its state is ignored";
  synced_steps_ = s.iter;
  std::vector<std::string> reset;  // what starts afresh, and why
  {
    std::istringstream in(s.rng);
    std::mt19937_64 rng;
    if (in >> rng) {
      powersgd_rng_ = rng;
    } else {
      reset.push_back("the random-Q generator is reseeded (unreadable in the checkpoint)");
    }
  }
  std::vector<PowerSgdBucket*> psgd;
  for (auto& b : buckets_) {
    if (b.powersgd != nullptr) psgd.push_back(b.powersgd.get());
  }
  bool fits = !s.q.empty() && s.layout == PowerSgdLayoutLocked() && s.q.size() == psgd.size();
  for (size_t i = 0; fits && i < psgd.size(); ++i) {
    fits = s.q[i].defined() && s.q[i].numel() == psgd[i]->q().numel();
  }
  const bool ran = !s.q.empty();  // PowerSGD had run when it was saved
  bool errors_restored = false;
  if (ran && !fits) {
    reset.push_back(
        "the gradient buckets differ from the checkpoint's (another model, powersgd rank, "
        "min_compression_rate or bucket sizes): Q is drawn afresh and the error feedback starts "
        "at zero");
  } else if (ran) {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < psgd.size(); ++i) psgd[i]->RestoreQ(s.q[i], s.has_q);
    const size_t me = static_cast<size_t>(comm_->rank());
    if (!options_.powersgd.use_error_feedback) {
      // Nothing to restore into.
    } else if (s.errors.empty()) {
      reset.push_back("the checkpoint holds no error feedback: it starts at zero");
    } else if (s.world_size != comm_->world_size()) {
      reset.push_back(absl::StrCat("the error feedback was saved by ", s.world_size,
                                   " ranks, this attempt has ", comm_->world_size(),
                                   ": it starts at zero"));
    } else {
      bool ok = me < s.errors.size() && s.errors[me].size() == psgd.size();
      for (size_t i = 0; ok && i < psgd.size(); ++i) {
        ok = s.errors[me][i].defined() && s.errors[me][i].numel() == psgd[i]->error().numel();
      }
      if (ok) {
        for (size_t i = 0; i < psgd.size(); ++i) psgd[i]->RestoreError(s.errors[me][i]);
        errors_restored = true;
      } else {
        reset.push_back(
            "this rank's error feedback in the checkpoint does not fit: it starts at zero");
      }
    }
  }
  std::string line =
      absl::StrCat("powersgd: resumed at step ", s.iter, " (",
                   s.iter >= options_.powersgd.start_iter
                       ? "warm-up over"
                       : absl::StrCat("warm-up until step ", options_.powersgd.start_iter),
                   ")");
  if (ran && fits) {
    absl::StrAppend(&line, ", Q restored",
                    errors_restored ? " with this rank's error feedback" : "");
  }
  if (!reset.empty()) absl::StrAppend(&line, "; ", absl::StrJoin(reset, "; "));
  return line;
}

}  // namespace trainctl::dist

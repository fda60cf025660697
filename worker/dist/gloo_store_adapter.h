// GlooStoreAdapter: gloo_collectives.cc's bridge from Gloo's rendezvous to
// the attempt's RendezvousStore. Include only where Gloo's headers are
// (TRAINCTL_HAVE_GLOO).
//
// Threading: as the RendezvousStore it forwards to.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist {

// Gloo's rendezvous speaks to a gloo::rendezvous::Store; this forwards it to
// the attempt's RendezvousStore (hosted by rank 0), under a key prefix. Gloo
// expects exceptions; their text keeps "timed out" for StatusFromCommException.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(RendezvousStore& store, std::string prefix, absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(s.ToString());
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_.Get(prefix_ + key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    for (const auto& k : keys) {
      absl::StatusOr<std::string> v =
          store_.Get(prefix_ + k, std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (!v.ok()) throw std::runtime_error(v.status().ToString());
    }
  }

 private:
  RendezvousStore& store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace trainctl::dist

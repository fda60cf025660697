// Test support: a one-rank Gloo group in this process (its rendezvous store
// on a free loopback port), for tests that need the real collectives and
// bucketing without peers. A setup failure is a test failure (EXPECT); the
// group is then null.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/dist/gloo_collectives.h"
#include "worker/dist/rendezvous_store.h"

namespace trainctl::dist::testing {

inline std::shared_ptr<Collectives> SingleRankGloo() {
  auto store = RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(5), NewRendezvousSecret());
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  GlooOptions o;
  o.timeout = absl::Seconds(5);
  auto comm = CreateGlooCollectives(o, *store);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *comm : nullptr;
}

}  // namespace trainctl::dist::testing

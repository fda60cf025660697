// LiveCalls with a real TokenAuthority (temporary database, fake clock): a
// revoked or expired token ends exactly its own calls, once, with
// UNAUTHENTICATED naming why; the bootstrap admin and certificate workers
// are not tokens and stay; a removed call is never ended.
#include "coordinator/auth/live_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "common/temp_dir.h"

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

const Principal kRoot{"admin-file", "admin-file", v1::ROLE_ADMIN};

class LiveCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    auto store = StateStore::Open(dir_.File("state.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auth_ = std::make_unique<TokenAuthority>(store_.get(), &clock_);
    ASSERT_TRUE(auth_->Load().ok());
    auth_->SetBootstrapAdmin("bootstrap-secret");
  }

  Principal Token(v1::Role role, const std::string& name, int64_t ttl_s = 0) {
    v1::CreateTokenRequest req;
    req.set_role(role);
    req.set_name(name);
    req.mutable_ttl()->set_seconds(ttl_s);
    absl::StatusOr<v1::CreateTokenResponse> made = auth_->Create(req, kRoot);
    EXPECT_TRUE(made.ok()) << made.status();
    absl::StatusOr<Principal> who = auth_->Authenticate("Bearer " + made->secret());
    EXPECT_TRUE(who.ok()) << who.status();
    return *who;
  }

  // Adds a call of `who` whose end is recorded under `name`.
  LiveCalls::Id Track(LiveCalls& live, const Principal& who, const std::string& name) {
    return live.Add(who, [this, name](const absl::Status& why) { ended_[name].push_back(why); });
  }

  ScopedTempDir dir_{"live_calls_test"};  // declared first: goes after the store
  FakeClock clock_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<TokenAuthority> auth_;
  std::map<std::string, std::vector<absl::Status>> ended_;
};

TEST_F(LiveCallsTest, RevokedAndExpiredTokensEndTheirCallsOnce) {
  LiveCalls live(auth_.get());
  const Principal viewer = Token(v1::ROLE_VIEWER, "watcher");
  const Principal worker = Token(v1::ROLE_WORKER, "gpu-1");
  const Principal brief = Token(v1::ROLE_SUBMITTER, "brief", /*ttl_s=*/60);
  Track(live, viewer, "viewer-logs");
  Track(live, viewer, "viewer-watch");
  Track(live, worker, "worker-session");
  Track(live, brief, "brief-watch");
  Track(live, kRoot, "admin-watch");
  Track(live, Principal{TokenAuthority::CertBinding("w-1"), "w-1", v1::ROLE_WORKER},
        "cert-session");
  const LiveCalls::Id gone = Track(live, viewer, "viewer-finished");
  live.Remove(gone);
  EXPECT_EQ(live.Sweep(), 0) << "every token still holds";
  EXPECT_TRUE(ended_.empty());

  std::vector<std::string> announced;
  auth_->OnRevoke([&](const std::string& id) { announced.push_back(id); });
  ASSERT_TRUE(auth_->Revoke(viewer.token_id).ok());
  EXPECT_THAT(announced, ::testing::ElementsAre(viewer.token_id)) << "a revocation is announced";
  EXPECT_EQ(live.Sweep(), 2);
  ASSERT_EQ(ended_["viewer-logs"].size(), 1u);
  EXPECT_EQ(ended_["viewer-logs"][0].code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(ended_["viewer-logs"][0].message(), HasSubstr("was revoked"));
  EXPECT_EQ(ended_["viewer-watch"].size(), 1u);
  EXPECT_FALSE(ended_.count("viewer-finished")) << "a finished call is not ended again";
  EXPECT_EQ(live.Sweep(), 0) << "an ended call is forgotten";
  EXPECT_EQ(ended_["viewer-logs"].size(), 1u);

  clock_.Advance(absl::Seconds(61));
  EXPECT_EQ(live.Sweep(), 1);
  ASSERT_EQ(ended_["brief-watch"].size(), 1u);
  EXPECT_THAT(ended_["brief-watch"][0].message(), HasSubstr("expired"));

  ASSERT_TRUE(auth_->Revoke(worker.token_id).ok());
  EXPECT_EQ(live.Sweep(), 1);
  EXPECT_EQ(ended_["worker-session"].size(), 1u);
  EXPECT_FALSE(ended_.count("admin-watch")) << "the bootstrap admin is not a revocable token";
  EXPECT_FALSE(ended_.count("cert-session")) << "a certificate is not a token";
  EXPECT_EQ(live.size(), 2u);
}

TEST_F(LiveCallsTest, StillValidNamesWhy) {
  const Principal viewer = Token(v1::ROLE_VIEWER, "v");
  EXPECT_TRUE(auth_->StillValid(viewer).ok());
  EXPECT_TRUE(auth_->StillValid(kRoot).ok());
  absl::Status unknown = auth_->StillValid(Principal{"t-00000000", "x", v1::ROLE_VIEWER});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(unknown.message(), HasSubstr("t-00000000"));
  ASSERT_TRUE(auth_->Revoke(viewer.token_id).ok());
  absl::Status revoked = auth_->StillValid(viewer);
  EXPECT_EQ(revoked.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(revoked.message(), HasSubstr("(v) was revoked"));
  auth_->SetBootstrapAdmin("");
  EXPECT_EQ(auth_->StillValid(kRoot).code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace trainctl::coordinator

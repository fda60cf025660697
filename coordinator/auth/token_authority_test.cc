// TokenAuthority with a real (temporary) database and a fake clock: hashed
// storage, constant-time lookup by id, revocation, expiry, roles, worker-id
// bindings, and all of it surviving a reopen.
#include "coordinator/auth/token_authority.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/auth/secret.h"
#include "common/temp_dir.h"

namespace trainctl::coordinator {
namespace {

using ::testing::HasSubstr;

const Principal kRoot{"admin-file", "admin-file", v1::ROLE_ADMIN};

// A database path in a scratch directory removed at the end of the test.
class TempDb : public ScopedTempDir {
 public:
  TempDb() : ScopedTempDir("token_authority_test") {}
  std::string db() const { return File("state.db"); }
};

v1::CreateTokenRequest Req(v1::Role role, const std::string& name, int64_t ttl_s = 0) {
  v1::CreateTokenRequest r;
  r.set_role(role);
  r.set_name(name);
  r.mutable_ttl()->set_seconds(ttl_s);
  return r;
}

TEST(SecretTest, HashesCompareAndCarryTheirId) {
  std::string secret = auth::NewSecret("t-0011aabb");
  EXPECT_EQ(auth::TokenIdOfSecret(secret), "t-0011aabb");
  EXPECT_EQ(auth::TokenIdOfSecret("no-prefix"), "");
  EXPECT_EQ(auth::Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(auth::SecretMatches(secret, auth::Sha256Hex(secret)));
  EXPECT_FALSE(auth::SecretMatches(secret + "x", auth::Sha256Hex(secret)));
  EXPECT_NE(auth::NewSecret("t-1"), auth::NewSecret("t-1")) << "random part";
}

TEST(TokenAuthorityTest, CreateAuthenticateRevokeExpireAndReload) {
  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  std::string viewer_secret, short_secret, revoked_id;
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    auth.SetBootstrapAdmin("bootstrap-secret");

    absl::StatusOr<Principal> root = auth.Authenticate("Bearer bootstrap-secret");
    ASSERT_TRUE(root.ok()) << root.status();
    EXPECT_EQ(root->role, v1::ROLE_ADMIN);

    auto viewer = auth.Create(Req(v1::ROLE_VIEWER, "carol"), kRoot);
    ASSERT_TRUE(viewer.ok()) << viewer.status();
    viewer_secret = viewer->secret();
    EXPECT_EQ(viewer->token().created_by(), "admin-file");
    absl::StatusOr<Principal> who = auth.Authenticate("Bearer " + viewer_secret);
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(who->name, "carol");
    EXPECT_EQ(who->role, v1::ROLE_VIEWER);

    auto shortlived = auth.Create(Req(v1::ROLE_SUBMITTER, "", 60), kRoot);
    ASSERT_TRUE(shortlived.ok());
    short_secret = shortlived->secret();
    EXPECT_EQ(shortlived->token().name(), shortlived->token().id())
        << "the name defaults to the id";
    EXPECT_TRUE(auth.Authenticate("Bearer " + short_secret).ok());
    clock.Advance(absl::Seconds(61));
    absl::StatusOr<Principal> expired = auth.Authenticate("Bearer " + short_secret);
    EXPECT_EQ(expired.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(expired.status().message(), HasSubstr("expired"));

    auto doomed = auth.Create(Req(v1::ROLE_SUBMITTER, "mallory"), kRoot);
    ASSERT_TRUE(doomed.ok());
    revoked_id = doomed->token().id();
    ASSERT_TRUE(auth.Revoke(revoked_id).ok());
    ASSERT_TRUE(auth.Revoke(revoked_id).ok()) << "idempotent";
    absl::StatusOr<Principal> revoked = auth.Authenticate("Bearer " + doomed->secret());
    EXPECT_EQ(revoked.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(revoked.status().message(), HasSubstr("revoked"));
    EXPECT_EQ(auth.Revoke("t-nothere").status().code(), absl::StatusCode::kNotFound);

    EXPECT_EQ(auth.List(false).size(), 1u) << "only carol is live";
    EXPECT_EQ(auth.List(true).size(), 3u);
  }
  // The database holds hashes, never secrets.
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(raw, "SELECT secret_hash, blob FROM tokens", -1, &st, nullptr),
              SQLITE_OK);
    int rows = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
      ++rows;
      std::string hash(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
      std::string blob(static_cast<const char*>(sqlite3_column_blob(st, 1)),
                       sqlite3_column_bytes(st, 1));
      EXPECT_EQ(hash.size(), 64u);
      EXPECT_EQ(blob.find(viewer_secret.substr(15)), std::string::npos);
    }
    EXPECT_EQ(rows, 3);
    sqlite3_finalize(st);
    sqlite3_close(raw);
  }
  // Reopened: the same answers.
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  TokenAuthority auth(store->get(), &clock);
  ASSERT_TRUE(auth.Load().ok());
  EXPECT_TRUE(auth.Authenticate("Bearer " + viewer_secret).ok());
  EXPECT_EQ(auth.Authenticate("Bearer " + short_secret).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authenticate("Bearer bootstrap-secret").status().code(),
            absl::StatusCode::kUnauthenticated)
      << "the bootstrap secret is not stored: without SetBootstrapAdmin it is unknown";
}

TEST(TokenAuthorityTest, RefusesMissingMalformedAndForgedTokens) {
  TempDb tmp;
  auto store = StateStore::Open(tmp.db());
  ASSERT_TRUE(store.ok());
  FakeClock clock;
  TokenAuthority auth(store->get(), &clock);
  ASSERT_TRUE(auth.Load().ok());
  auto tok = auth.Create(Req(v1::ROLE_WORKER, "w"), kRoot);
  ASSERT_TRUE(tok.ok());
  EXPECT_THAT(auth.Authenticate("").status().message(), HasSubstr("no token"));
  EXPECT_THAT(auth.Authenticate("Basic abc").status().message(), HasSubstr("Bearer"));
  // The right id with a wrong random part.
  std::string forged = absl::StrCat("tct_", tok->token().id(), "_", std::string(64, '0'));
  absl::StatusOr<Principal> f = auth.Authenticate("Bearer " + forged);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(f.status().message(), HasSubstr("unknown token"));
  // Bad requests name the field.
  EXPECT_THAT(auth.Create(Req(v1::ROLE_UNSPECIFIED, "x"), kRoot).status().message(),
              HasSubstr("role"));
  EXPECT_THAT(auth.Create(Req(v1::ROLE_VIEWER, "no spaces"), kRoot).status().message(),
              HasSubstr("name"));
  EXPECT_THAT(auth.Create(Req(v1::ROLE_VIEWER, "x", -5), kRoot).status().message(),
              HasSubstr("ttl"));
}

TEST(TokenAuthorityTest, RolesAndWorkerBindings) {
  Principal viewer{"t-1", "carol", v1::ROLE_VIEWER};
  absl::Status denied =
      TokenAuthority::Authorize(viewer, "SubmitJob", {v1::ROLE_ADMIN, v1::ROLE_SUBMITTER});
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.message(), HasSubstr("SubmitJob needs role admin or submitter"));
  EXPECT_THAT(denied.message(), HasSubstr("has role viewer"));
  EXPECT_TRUE(TokenAuthority::Authorize(viewer, "GetJob", {v1::ROLE_VIEWER}).ok());

  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  Principal w1{"t-a", "a", v1::ROLE_WORKER}, w2{"t-b", "b", v1::ROLE_WORKER};
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok());
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    EXPECT_TRUE(auth.CheckWorker("gpu-1", w2).ok()) << "unbound ids are free";
    ASSERT_TRUE(auth.BindWorker("gpu-1", w1).ok());
    EXPECT_TRUE(auth.BindWorker("gpu-1", w1).ok()) << "rebinding to the same token is fine";
    EXPECT_EQ(auth.BindWorker("gpu-1", w2).code(), absl::StatusCode::kPermissionDenied);
  }
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  TokenAuthority auth(store->get(), &clock);
  ASSERT_TRUE(auth.Load().ok());
  absl::Status taken = auth.CheckWorker("gpu-1", w2);
  EXPECT_EQ(taken.code(), absl::StatusCode::kPermissionDenied) << "bindings survive a restart";
  EXPECT_THAT(taken.message(), HasSubstr("gpu-1"));
  EXPECT_TRUE(auth.CheckWorker("gpu-1", w1).ok());
}

// Join tokens are one-time and always expire; a use survives a reopen; a
// second use is refused naming the reason; other roles cannot be one-time.
TEST(TokenAuthorityTest, JoinTokensAreOneTimeAndExpire) {
  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  std::string secret, id;
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    v1::CreateTokenRequest worker = Req(v1::ROLE_WORKER, "w");
    worker.set_one_time(true);
    absl::StatusOr<v1::CreateTokenResponse> refused = auth.Create(worker, kRoot);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("one_time: only join tokens"));

    auto join = auth.Create(Req(v1::ROLE_JOIN, "rack-3"), kRoot);
    ASSERT_TRUE(join.ok()) << join.status();
    EXPECT_TRUE(join->token().one_time()) << "join tokens are one-time even when not asked";
    ASSERT_TRUE(join->token().has_expire_time());
    EXPECT_EQ(join->token().expire_time().seconds() - join->token().create_time().seconds(),
              absl::ToInt64Seconds(TokenAuthority::kDefaultJoinTtl));
    secret = join->secret();
    id = join->token().id();
    absl::StatusOr<Principal> who = auth.Authenticate("Bearer " + secret);
    ASSERT_TRUE(who.ok()) << who.status();
    EXPECT_EQ(who->role, v1::ROLE_JOIN);
    EXPECT_TRUE(auth.ConsumeOneTime(id).ok());
    absl::Status again = auth.ConsumeOneTime(id);
    EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(again.message(), HasSubstr("already used"));
    EXPECT_EQ(auth.ConsumeOneTime("t-nope").code(), absl::StatusCode::kInvalidArgument);

    auto brief = auth.Create(Req(v1::ROLE_JOIN, "brief", 60), kRoot);
    ASSERT_TRUE(brief.ok());
    clock.Advance(absl::Seconds(61));
    absl::StatusOr<Principal> expired = auth.Authenticate("Bearer " + brief->secret());
    EXPECT_EQ(expired.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(expired.status().message(), HasSubstr("expired"));
  }
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  TokenAuthority reopened(store->get(), &clock);
  ASSERT_TRUE(reopened.Load().ok());
  absl::StatusOr<Principal> used = reopened.Authenticate("Bearer " + secret);
  EXPECT_EQ(used.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(used.status().message(), HasSubstr("already used"));
  EXPECT_EQ(ParseRole("join").value(), v1::ROLE_JOIN);
}

// The addresses an admin authorises with a join or worker token are stored
// with it and come back on its principal; other roles cannot carry them.
TEST(TokenAuthorityTest, JoinAndWorkerTokensCarryTheAddressesTheAdminAuthorised) {
  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  std::string secret;
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    v1::CreateTokenRequest join = Req(v1::ROLE_JOIN, "gpu-07");
    join.add_addresses("10.0.3.7");
    join.add_addresses("gpu-07.lan");
    auto made = auth.Create(join, kRoot);
    ASSERT_TRUE(made.ok()) << made.status();
    EXPECT_THAT(made->token().addresses(), ::testing::ElementsAre("10.0.3.7", "gpu-07.lan"));
    secret = made->secret();

    v1::CreateTokenRequest viewer = Req(v1::ROLE_VIEWER, "v");
    viewer.add_addresses("10.0.3.7");
    absl::StatusOr<v1::CreateTokenResponse> refused = auth.Create(viewer, kRoot);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("addresses: only join and worker tokens"));
    v1::CreateTokenRequest bad = Req(v1::ROLE_WORKER, "w");
    bad.add_addresses("evil host/x");
    refused = auth.Create(bad, kRoot);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("addresses[0]: 'evil host/x'"));
  }
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  TokenAuthority reopened(store->get(), &clock);
  ASSERT_TRUE(reopened.Load().ok());
  absl::StatusOr<Principal> who = reopened.Authenticate("Bearer " + secret);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_THAT(who->addresses, ::testing::ElementsAre("10.0.3.7", "gpu-07.lan"));
}

// A submitter token bound to queues keeps them across a reopen and hands
// them to the Principal (ResolveQueue's input); bad lists are refused.
TEST(TokenAuthorityTest, SubmitterTokensCarryTheirQueues) {
  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  std::string secret;
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    v1::CreateTokenRequest req = Req(v1::ROLE_SUBMITTER, "team-a");
    req.add_queues("a");
    req.add_queues("not-defined-yet");
    auto made = auth.Create(req, kRoot);
    ASSERT_TRUE(made.ok()) << made.status() << " (queues need not exist when the token is made)";
    EXPECT_THAT(made->token().queues(), ::testing::ElementsAre("a", "not-defined-yet"));
    secret = made->secret();

    auto refused = [&](v1::CreateTokenRequest r) {
      absl::StatusOr<v1::CreateTokenResponse> out = auth.Create(r, kRoot);
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      return std::string(out.status().message());
    };
    v1::CreateTokenRequest viewer = Req(v1::ROLE_VIEWER, "v");
    viewer.add_queues("a");
    EXPECT_EQ(refused(viewer), "queues: only submitter and admin tokens name queues");
    v1::CreateTokenRequest worker = Req(v1::ROLE_WORKER, "w");
    worker.add_queues("a");
    EXPECT_EQ(refused(worker), "queues: only submitter and admin tokens name queues");
    v1::CreateTokenRequest bad = Req(v1::ROLE_SUBMITTER, "s");
    bad.add_queues("a");
    bad.add_queues("Bad Name");
    EXPECT_THAT(refused(bad), HasSubstr("queues[1]: must be lower-case"));
    v1::CreateTokenRequest twice = Req(v1::ROLE_SUBMITTER, "s");
    twice.add_queues("a");
    twice.add_queues("a");
    EXPECT_EQ(refused(twice), "queues[1]: 'a' is named twice");
    v1::CreateTokenRequest many = Req(v1::ROLE_ADMIN, "s");
    for (int i = 0; i < 17; ++i) many.add_queues(absl::StrCat("q", i));
    EXPECT_EQ(refused(many), "queues: at most 16, got 17");
    many.mutable_queues()->RemoveLast();
    EXPECT_TRUE(auth.Create(many, kRoot).ok()) << "16 is allowed, and admins may have queues";
  }
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  TokenAuthority reopened(store->get(), &clock);
  ASSERT_TRUE(reopened.Load().ok());
  absl::StatusOr<Principal> who = reopened.Authenticate("Bearer " + secret);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_THAT(who->queues, ::testing::ElementsAre("a", "not-defined-yet"));
  EXPECT_EQ(reopened.List(false).size(), 2u);
}

// A revoked worker certificate is refused by id and by serial, survives a
// reopen, and revoking twice is harmless.
TEST(TokenAuthorityTest, RevokedWorkerCertificatesStayRevoked) {
  TempDb tmp;
  std::string db = tmp.db();
  FakeClock clock;
  {
    auto store = StateStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    TokenAuthority auth(store->get(), &clock);
    ASSERT_TRUE(auth.Load().ok());
    auth.NoteCertSerial("w-1", "0abc");
    EXPECT_TRUE(auth.CheckCert("w-1", "0abc").ok());
    absl::StatusOr<v1::RevokeWorkerResponse> r = auth.RevokeWorkerCert("w-1");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->newly_revoked());
    EXPECT_THAT(r->serials(), ::testing::ElementsAre("0abc"));
    absl::Status refused = auth.CheckCert("w-1", "0def");
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(refused.message(), HasSubstr("certificate of worker 'w-1'"));
    EXPECT_THAT(refused.message(), HasSubstr("was revoked"));
    EXPECT_FALSE(auth.RevokeWorkerCert("w-1")->newly_revoked());
    EXPECT_TRUE(auth.CheckCert("w-2", "0fff").ok());
    EXPECT_EQ(auth.RevokeWorkerCert("").status().code(), absl::StatusCode::kInvalidArgument);
    // The id is checked as registration checks it (#45 item 7: "\n\x02" was answered OK).
    for (const std::string& bad : {std::string("\n\x02"), std::string("w 1"), std::string(129, 'w'),
                                   std::string("../w-1")}) {
      absl::Status s = auth.RevokeWorkerCert(bad).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_THAT(s.message(), HasSubstr("worker_id: 1 to 128 of [A-Za-z0-9._-]"));
    }
    EXPECT_TRUE(auth.CheckCert("w-3", "0fff").ok()) << "nothing was stored for a refused id";
  }
  auto store = StateStore::Open(db);
  ASSERT_TRUE(store.ok());
  TokenAuthority reopened(store->get(), &clock);
  ASSERT_TRUE(reopened.Load().ok());
  EXPECT_EQ(reopened.CheckCert("w-1", "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reopened.CheckCert("renamed", "0abc").code(), absl::StatusCode::kPermissionDenied)
      << "a known revoked serial is refused under any name";
}

}  // namespace
}  // namespace trainctl::coordinator

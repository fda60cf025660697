// The rank rendezvous store: keys round-trip between host and clients, and a
// connection that does not prove the attempt's secret is closed before it can
// read or write anything (raw sockets speaking the wire protocol by hand).
#include "worker/dist/rendezvous_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <thread>

#include "absl/time/clock.h"

namespace trainctl::dist {
namespace {

std::shared_ptr<RendezvousStore> HostOrDie(const std::string& secret,
                                           absl::Duration timeout = absl::Seconds(5)) {
  auto host = RendezvousStore::Host("127.0.0.1", 0, timeout, secret);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *host : nullptr;
}

uint16_t PortOf(const RendezvousStore& s) {
  std::string h;
  uint16_t port = 0;
  EXPECT_TRUE(RendezvousStore::ParseAddress(s.address(), &h, &port).ok());
  return port;
}

// A raw TCP connection to ip:port; -1 when refused.
int Dial(const char* ip, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads until the peer closes or 10 s pass; returns what arrived and whether
// the peer closed.
std::string ReadUntilClosed(int fd, bool* closed) {
  std::string got;
  *closed = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

bool ReadN(int fd, size_t n, std::string* out) {
  out->clear();
  while (out->size() < n) {
    char buf[256];
    ssize_t r = recv(fd, buf, std::min(sizeof buf, n - out->size()), 0);
    if (r <= 0) return false;
    out->append(buf, static_cast<size_t>(r));
  }
  return true;
}

void SendAll(int fd, const std::string& s) { (void)!send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

// A SET request for key=value in the store's framing (what an attacker who
// read the header would send).
std::string SetFrame(const std::string& key, const std::string& value) {
  std::string f(1, '\x01');
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  u32(static_cast<uint32_t>(key.size()));
  f += key;
  u32(static_cast<uint32_t>(value.size()));
  f += value;
  return f;
}

TEST(RendezvousStoreTest, HostAndConnectShareKeys) {
  const std::string secret = NewRendezvousSecret();
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_NE(secret, NewRendezvousSecret());
  auto host = HostOrDie(secret);
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(host->address().rfind("127.0.0.1:", 0), 0u) << host->address();
  auto client = RendezvousStore::Connect(host->address(), absl::Seconds(5), secret);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(host->Set("k", "v1").ok());
  auto v = (*client)->Get("k");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v1");
  ASSERT_TRUE((*client)->Set("from-client", std::string(100000, 'x')).ok());
  EXPECT_EQ(host->Get("from-client")->size(), 100000u);
  EXPECT_EQ(*(*client)->Add("n", 2), 2);
  EXPECT_EQ(*host->Add("n", 3), 5);
  EXPECT_EQ(host->rejected_connections(), 0);
}

TEST(RendezvousStoreTest, GetWaitsForALaterSetAndTimesOut) {
  const std::string secret = NewRendezvousSecret();
  auto host = HostOrDie(secret, absl::Seconds(1));
  ASSERT_NE(host, nullptr);
  auto client = RendezvousStore::Connect(host->address(), absl::Seconds(1), secret);
  ASSERT_TRUE(client.ok()) << client.status();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(host->Set("later", "x").ok());
  });
  EXPECT_EQ(*(*client)->Get("later", absl::Seconds(5)), "x");
  setter.join();
  const absl::Time start = absl::Now();
  EXPECT_EQ((*client)->Get("never-set").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(host->Get("never-set").status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  // The connection is still usable after a timed-out get.
  EXPECT_EQ(*(*client)->Get("later"), "x");
}

TEST(RendezvousStoreTest, BindsOnlyTheAdvertisedAddress) {
  auto host = HostOrDie(NewRendezvousSecret());
  ASSERT_NE(host, nullptr);
  const uint16_t port = PortOf(*host);
  int ok = Dial("127.0.0.1", port);
  EXPECT_GE(ok, 0);
  if (ok >= 0) close(ok);
  // 127.0.0.2 reaches this host too, but nothing listens there for the store.
  EXPECT_EQ(Dial("127.0.0.2", port), -1);
}

TEST(RendezvousStoreTest, RawClientWithoutTheSecretIsClosedWithNothingWritten) {
  auto host = HostOrDie(NewRendezvousSecret());
  ASSERT_NE(host, nullptr);
  ASSERT_TRUE(host->Set("/trainctl/job/1/resume_from", "/good.ckpt").ok());
  int fd = Dial("127.0.0.1", PortOf(*host));
  ASSERT_GE(fd, 0);
  // A client that reads the greeting, then sends a request instead of a proof.
  std::string hello;
  ASSERT_TRUE(ReadN(fd, 8 + kRendezvousNonceBytes, &hello));
  SendAll(fd, SetFrame("/trainctl/job/1/resume_from", "/evil.ckpt") + std::string(64, '\0'));
  bool closed = false;
  EXPECT_EQ(ReadUntilClosed(fd, &closed), "");  // no reply, no key
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(*host->Get("/trainctl/job/1/resume_from"), "/good.ckpt");

  // One that says nothing is closed after the handshake timeout.
  fd = Dial("127.0.0.1", PortOf(*host));
  ASSERT_GE(fd, 0);
  ReadUntilClosed(fd, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(host->rejected_connections(), 2);
}

TEST(RendezvousStoreTest, WrongSecretIsClosedBeforeAnyRequest) {
  const std::string secret = NewRendezvousSecret();
  auto host = HostOrDie(secret);
  ASSERT_NE(host, nullptr);
  ASSERT_TRUE(host->Set("key", "victim").ok());
  const std::string wrong = NewRendezvousSecret();

  // By hand: a well-formed handshake with the wrong key, then a SET.
  int fd = Dial("127.0.0.1", PortOf(*host));
  ASSERT_GE(fd, 0);
  std::string hello;
  ASSERT_TRUE(ReadN(fd, 8 + kRendezvousNonceBytes, &hello));
  EXPECT_EQ(hello.substr(0, 8), std::string(kRendezvousMagic, 8));
  const std::string sn = hello.substr(8);
  const std::string cn(kRendezvousNonceBytes, 'c');
  SendAll(fd, cn + RendezvousMac(wrong, "client" + sn + cn) + SetFrame("key", "evil"));
  bool closed = false;
  EXPECT_EQ(ReadUntilClosed(fd, &closed), "");  // no server proof, no reply
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(*host->Get("key"), "victim");

  // A replayed proof from another session does not work either: the nonce differs.
  fd = Dial("127.0.0.1", PortOf(*host));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadN(fd, 8 + kRendezvousNonceBytes, &hello));
  SendAll(fd, cn + RendezvousMac(secret, "client" + sn + cn) + SetFrame("key", "evil"));
  EXPECT_EQ(ReadUntilClosed(fd, &closed), "");
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(*host->Get("key"), "victim");

  // Through the client: PermissionDenied at once, not a retry until the timeout.
  const absl::Time start = absl::Now();
  auto client = RendezvousStore::Connect(host->address(), absl::Seconds(20), wrong);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(host->rejected_connections(), 3);

  // With the right secret by hand, the same SET goes through.
  fd = Dial("127.0.0.1", PortOf(*host));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(ReadN(fd, 8 + kRendezvousNonceBytes, &hello));
  const std::string sn2 = hello.substr(8);
  SendAll(fd, cn + RendezvousMac(secret, "client" + sn2 + cn) + SetFrame("key", "mine"));
  std::string proof_and_reply;
  ASSERT_TRUE(ReadN(fd, kRendezvousMacBytes + 5, &proof_and_reply));
  EXPECT_EQ(proof_and_reply.substr(0, kRendezvousMacBytes),
            RendezvousMac(secret, "server" + sn2 + cn));
  EXPECT_EQ(proof_and_reply[kRendezvousMacBytes], '\0');  // OK
  close(fd);
  EXPECT_EQ(*host->Get("key"), "mine");
}

TEST(RendezvousStoreTest, ClientRefusesAListenerWithoutTheSecret) {
  // A listener that greets correctly but cannot prove the secret.
  auto impostor = HostOrDie(NewRendezvousSecret());
  ASSERT_NE(impostor, nullptr);
  auto client =
      RendezvousStore::Connect(impostor->address(), absl::Seconds(5), NewRendezvousSecret());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(RendezvousStoreTest, BadArgumentsAreInvalidArgument) {
  const std::string secret = NewRendezvousSecret();
  for (const char* a : {"", "localhost", ":123", "host:", "host:0", "host:70000", "host:x"}) {
    EXPECT_EQ(RendezvousStore::Connect(a, absl::Seconds(1), secret).status().code(),
              absl::StatusCode::kInvalidArgument)
        << a;
  }
  EXPECT_EQ(RendezvousStore::Host("127.0.0.1", 0, absl::Seconds(1), "short").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousStore::Host("", 0, absl::Seconds(1), secret).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousStore::Connect("127.0.0.1:1", absl::Seconds(1), "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainctl::dist

// The rendezvous store's wire format and socket helpers, shared by its
// server (rendezvous_store_server.cc) and its client (rendezvous_store.cc).
// Internal to trainctl_rendezvous.
//
// Handshake (rendezvous_store.h): the server sends the magic and its nonce;
// the client its nonce and its MAC over ("client", both nonces); the server
// its MAC over ("server", both nonces). Then requests: op (1 byte), key
// length (u32 LE), key, value length (u32 LE), value; replies: code (1
// byte), payload length (u32 LE), payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace trainctl::dist::wire {

inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = 16u << 20;
// An unauthenticated connection must finish the handshake within this.
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);

enum Op : uint8_t { kOpSet = 1, kOpGet = 2, kOpAdd = 3 };
enum Code : uint8_t { kOk = 0, kTimedOut = 1, kBadRequest = 2 };

void PutU32(std::string* out, uint32_t v);
uint32_t GetU32(const char* p);
void PutI64(std::string* out, int64_t v);
int64_t GetI64(const std::string& s);

// Writes all of `data`; false when the peer went away.
bool WriteAll(int fd, const std::string& data);
// Reads exactly n bytes before `deadline` (InfiniteFuture = no deadline).
// DeadlineExceeded when it passed, Unavailable when the peer closed.
absl::Status ReadExactly(int fd, size_t n, std::string* out, absl::Time deadline);

// What a side's MAC covers: who, then both nonces.
std::string HandshakeMessage(const char* who, const std::string& server_nonce,
                             const std::string& client_nonce);
// Constant-time comparison of two MACs.
bool MacEquals(const std::string& a, const std::string& b);

}  // namespace trainctl::dist::wire

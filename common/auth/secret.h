// Bearer-token secrets and the client side of authentication: what the
// coordinator (token store), the CLI, the client library and the worker
// daemon share.
//
// A secret is "tct_<id>_<64 hex>": the id is public (ListTokens shows it) and
// lets the coordinator find the one stored SHA-256 to compare, in constant
// time. Secrets read from a file (the bootstrap admin token) may be any
// printable string.
//
// Thread-safe: free functions without state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_env.h"

namespace grpc {
class Channel;
class ChannelArguments;
namespace experimental {
class ClientInterceptorFactoryInterface;
}
}  // namespace grpc

namespace trainctl::auth {

// `bytes` random bytes from OpenSSL's CSPRNG, as lowercase hex.
std::string RandomHex(int bytes);
// A new token id ("t-" + 8 hex) and a secret carrying it.
std::string NewTokenId();
std::string NewSecret(absl::string_view token_id);
// The id a secret carries, or "" when it is not of the "tct_" form.
std::string TokenIdOfSecret(absl::string_view secret);
// Lowercase hex SHA-256.
std::string Sha256Hex(absl::string_view data);
// SHA-256(secret) == expected_hex, compared in constant time.
bool SecretMatches(absl::string_view secret, absl::string_view expected_hex);

// Reads a token file: its first line, trimmed. InvalidArgument naming the
// path when it is missing, unreadable or empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// Reads the file at `path`, or when it does not exist creates it (mode 0600,
// parent directories 0700) holding a new random secret. *created tells which.
absl::StatusOr<std::string> ReadOrCreateTokenFile(const std::string& path, bool* created);
// Writes `contents` to `path` with mode 0600 (atomically: temp + rename).
// Errors as common/safe_file.h's (RESOURCE_EXHAUSTED for a full disk,
// PERMISSION_DENIED, ..., the errno attached); a directory that cannot be
// created is INVALID_ARGUMENT naming the path. `env`: the file system's
// calls (common/file_env.h; null: the real ones).
absl::Status WritePrivateFile(const std::string& path, absl::string_view contents,
                              FileEnv* env = nullptr);
// The whole file; NotFound / InvalidArgument naming the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Whether `address` reaches only this host: "HOST:PORT" (or a bare host)
// whose host is localhost, an address in 127.0.0.0/8 or ::1 (also as
// "[::1]:P" or ::ffff:127.x), or a Unix socket ("unix:PATH"). gRPC's
// "dns:///", "ipv4:" and "ipv6:" prefixes are looked through; any other
// name or scheme is not loopback. The one rule for clear text: the
// coordinator listens without TLS only on such an address (else
// --insecure), and clients send a token without TLS only to one.
bool IsLoopbackAddress(absl::string_view address);

// True for an IP address in 127.0.0.0/8 or ::1 (also ::ffff:127.x); a name
// (even "localhost") is not an address.
bool IsLoopbackIp(absl::string_view ip);

// OK unless `token` would cross the network in clear text: a token is set,
// no CA file (so no TLS), and `address` is not loopback. Then
// FailedPrecondition naming the address and the ways to give the CA
// (--ca, $TRAINCTL_CA, `ca:` in the config file). Nothing has been sent.
absl::Status CheckTokenTransport(absl::string_view address, absl::string_view token,
                                 absl::string_view ca_file);

// How a client reaches the coordinator.
struct ChannelSecurity {
  // Sent as `authorization: Bearer <token>` on every call; "" sends none.
  std::string token;
  // PEM file of the cluster CA: TLS, verifying the server against it.
  // "" = plaintext (loopback or --insecure coordinators only).
  std::string ca_file;
  // With ca_file: this client's certificate and key (mutual TLS, workers).
  std::string cert_file;
  std::string key_file;
  // TLS target name override (the certificate's SAN to expect), tests only.
  std::string server_name_override;
};

// A channel to `target` with the credentials `security` asks for and a
// bearer-token interceptor. InvalidArgument naming the file when a PEM file
// cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           grpc::ChannelArguments args);

// Interceptor factories that send `authorization: Bearer <token>` on every
// call (for channels made elsewhere, e.g. a server's in-process channel).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
BearerInterceptors(const std::string& token);

}  // namespace trainctl::auth

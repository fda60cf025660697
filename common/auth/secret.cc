#include "common/auth/secret.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/safe_file.h"

namespace trainctl::auth {

std::string RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    // The CSPRNG failing is not something to limp on with weaker randomness.
    std::abort();
  }
  return absl::BytesToHexString(raw);
}

std::string NewTokenId() { return absl::StrCat("t-", RandomHex(4)); }

std::string NewSecret(absl::string_view token_id) {
  return absl::StrCat("tct_", token_id, "_", RandomHex(32));
}

std::string TokenIdOfSecret(absl::string_view secret) {
  if (!absl::ConsumePrefix(&secret, "tct_")) return "";
  size_t sep = secret.rfind('_');
  if (sep == absl::string_view::npos || sep == 0) return "";
  return std::string(secret.substr(0, sep));
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) std::abort();
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), len));
}

bool SecretMatches(absl::string_view secret, absl::string_view expected_hex) {
  std::string got = Sha256Hex(secret);
  if (got.size() != expected_hex.size()) return false;
  return CRYPTO_memcmp(got.data(), expected_hex.data(), got.size()) == 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", text.status().message()));
  }
  std::string first(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  if (first.empty())
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": empty"));
  return first;
}

absl::Status WritePrivateFile(const std::string& path, absl::string_view contents, FileEnv* env) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path() && !fs::exists(p.parent_path(), ec)) {
    fs::create_directories(p.parent_path(), ec);
    if (ec)
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot create its directory: ", ec.message()));
    fs::permissions(p.parent_path(), fs::perms::owner_all, ec);
  }
  // Created without following links (a link planted at the name or a
  // temporary name is never written through), 0600 from the first byte.
  // Its errors keep their class and errno (a full disk is not a bad
  // argument): common/safe_file.h.
  SafeWriteOptions options = PrivateFile();
  options.env = env;
  return WriteFileSafely(path, contents, options);
}

absl::StatusOr<std::string> ReadOrCreateTokenFile(const std::string& path, bool* created) {
  *created = false;
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return ReadTokenFile(path);
  std::string secret = NewSecret("admin");
  absl::Status s = WritePrivateFile(path, absl::StrCat(secret, "\n"));
  if (!s.ok()) return s;
  *created = true;
  return secret;
}

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:"))
    return true;
  if (!absl::ConsumePrefix(&address, "dns:///")) {
    if (!absl::ConsumePrefix(&address, "ipv4:")) absl::ConsumePrefix(&address, "ipv6:");
  }
  std::string host(address);
  if (!host.empty() && host.front() == '[') {
    size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));  // host:port; more colons: a bare IPv6 address
  }
  return absl::EqualsIgnoreCase(host, "localhost") || IsLoopbackIp(host);
}

bool IsLoopbackIp(absl::string_view ip) {
  absl::ConsumePrefix(&ip, "::ffff:");
  const std::string text(ip);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, text.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::Status CheckTokenTransport(absl::string_view address, absl::string_view token,
                                 absl::string_view ca_file) {
  if (token.empty() || !ca_file.empty() || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to send the token in clear text to ", address,
      ": it is not a loopback address and no CA is set; give the cluster CA (ca.crt) with --ca "
      "FILE, "
      "$TRAINCTL_CA or `ca:` in the config file (trainctl login --ca writes it) to use TLS"));
}

namespace {

class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  const std::string header_;
};

class BearerFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerFactory(std::string token) : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(header_);
  }

 private:
  const std::string header_;  // Outlives every interceptor: the channel owns the factory.
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
BearerInterceptors(const std::string& token) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) interceptors.push_back(std::make_unique<BearerFactory>(token));
  return interceptors;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (security.ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile(security.ca_file);
    if (!ca.ok())
      return absl::InvalidArgumentError(absl::StrCat("CA file ", ca.status().message()));
    ssl.pem_root_certs = *ca;
    if (!security.cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(security.cert_file);
      if (!cert.ok())
        return absl::InvalidArgumentError(absl::StrCat("certificate ", cert.status().message()));
      absl::StatusOr<std::string> key = ReadFile(security.key_file);
      if (!key.ok())
        return absl::InvalidArgumentError(absl::StrCat("key ", key.status().message()));
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
    if (!security.server_name_override.empty()) {
      args.SetSslTargetNameOverride(security.server_name_override);
    }
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, creds, args, BearerInterceptors(security.token));
}

}  // namespace trainctl::auth

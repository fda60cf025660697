// The cluster PKI: a CA signs a CSR into a certificate that OpenSSL verifies
// against the CA, with the CN the signer chose and the SANs asked for; a
// tampered CSR or another CA's certificate does not verify.
#include "common/auth/pki.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace trainctl::auth {
namespace {

using ::testing::HasSubstr;

X509* Parse(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return x;
}

// X509_verify_cert of `leaf` against `ca` only; true when it chains.
bool Verifies(const std::string& leaf_pem, const std::string& ca_pem, const std::string& host = "") {
  X509* leaf = Parse(leaf_pem);
  X509* ca = Parse(ca_pem);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  if (!host.empty()) X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(ctx), host.c_str(), 0);
  bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(leaf);
  X509_free(ca);
  return ok;
}

TEST(PkiTest, CaSignsACsrIntoAVerifiableCertificate) {
  absl::StatusOr<KeyAndCert> ca = NewCa("trainctl test CA", absl::Hours(1));
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<std::string> key = NewPrivateKey();
  ASSERT_TRUE(key.ok());
  absl::StatusOr<std::string> csr = NewCsr(*key, "asked-for-name");
  ASSERT_TRUE(csr.ok()) << csr.status();
  absl::StatusOr<std::string> cert =
      SignCsr(*ca, *csr, "worker-7", {"localhost", "127.0.0.1", "gpu-07.example"}, absl::Hours(1));
  ASSERT_TRUE(cert.ok()) << cert.status();
  EXPECT_EQ(*CertCommonName(*cert), "worker-7") << "the signer decides the identity, not the CSR";
  EXPECT_TRUE(Verifies(*cert, ca->cert_pem));
  EXPECT_TRUE(Verifies(*cert, ca->cert_pem, "gpu-07.example"));
  EXPECT_FALSE(Verifies(*cert, ca->cert_pem, "other.example")) << "SANs are what was asked";

  absl::StatusOr<KeyAndCert> other = NewCa("another CA", absl::Hours(1));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(Verifies(*cert, other->cert_pem));
}

TEST(PkiTest, RefusesGarbageAndTamperedCsrs) {
  absl::StatusOr<KeyAndCert> ca = NewCa("trainctl test CA", absl::Hours(1));
  ASSERT_TRUE(ca.ok());
  absl::StatusOr<std::string> bad = SignCsr(*ca, "not a csr", "w", {}, absl::Hours(1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("csr"));
  std::string csr = *NewCsr(*NewPrivateKey(), "w");
  // Flip a character inside the base64 body: parse or signature fails.
  size_t mid = csr.size() / 2;
  csr[mid] = csr[mid] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(SignCsr(*ca, csr, "w", {}, absl::Hours(1)).ok());
  EXPECT_FALSE(NewCsr("garbage", "w").ok());
}

}  // namespace
}  // namespace trainctl::auth

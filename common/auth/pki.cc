#include "common/auth/pki.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <ctime>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainctl::auth {

namespace {

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Req = std::unique_ptr<X509_REQ, Deleter<X509_REQ, X509_REQ_free>>;

std::string OpenSslError(absl::string_view what) {
  unsigned long e = ERR_get_error();
  char buf[256] = {0};
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return absl::StrCat(what, e != 0 ? absl::StrCat(": ", buf) : "");
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

Key GenerateKey() { return Key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")); }

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)) {
    return absl::InternalError(OpenSslError("write private key"));
  }
  return BioText(bio.get());
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert))
    return absl::InternalError(OpenSslError("write certificate"));
  return BioText(bio.get());
}

Key ParseKey(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return Key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

Cert ParseCert(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `subject_key`, valid from now for `validity`, with a
// random serial and subject CN=<cn>; issuer fields are set by the caller.
Cert NewCert(EVP_PKEY* subject_key, const std::string& cn, absl::Duration validity) {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  // Back-dated for clocks a little behind (5 min; a quarter of a short
  // validity, so that its renewal point stays where the validity says).
  X509_gmtime_adj(X509_getm_notBefore(cert.get()),
                  -std::min<int64_t>(300, absl::ToInt64Seconds(validity) / 4));
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity));
  X509_set_pubkey(cert.get(), subject_key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

}  // namespace

absl::StatusOr<std::string> NewPrivateKey() {
  Key key = GenerateKey();
  if (!key) return absl::InternalError(OpenSslError("generate EC P-256 key"));
  return KeyPem(key.get());
}

absl::StatusOr<KeyAndCert> NewCa(const std::string& common_name, absl::Duration validity) {
  Key key = GenerateKey();
  if (!key) return absl::InternalError(OpenSslError("generate CA key"));
  Cert cert = NewCert(key.get(), common_name, validity);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  if (!AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
      !AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash")) {
    return absl::InternalError(OpenSslError("CA extensions"));
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0)
    return absl::InternalError(OpenSslError("sign CA"));
  KeyAndCert out;
  auto k = KeyPem(key.get());
  if (!k.ok()) return k.status();
  auto c = CertPem(cert.get());
  if (!c.ok()) return c.status();
  out.key_pem = *k;
  out.cert_pem = *c;
  return out;
}

absl::StatusOr<std::string> NewCsr(const std::string& key_pem, const std::string& common_name) {
  Key key = ParseKey(key_pem);
  if (!key) return absl::InvalidArgumentError(OpenSslError("private key: cannot parse"));
  Req req(X509_REQ_new());
  X509_REQ_set_version(req.get(), 0);
  X509_NAME* name = X509_REQ_get_subject_name(req.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509_REQ_set_pubkey(req.get(), key.get());
  if (X509_REQ_sign(req.get(), key.get(), EVP_sha256()) == 0)
    return absl::InternalError(OpenSslError("sign CSR"));
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509_REQ(bio.get(), req.get()))
    return absl::InternalError(OpenSslError("write CSR"));
  return BioText(bio.get());
}

std::string WorkerUri(const std::string& worker_id) {
  return absl::StrCat("spiffe://trainctl/worker/", worker_id);
}

namespace {

// The CSR in `csr_pem`, parsed and self-signature checked, with its key's
// strength checked; InvalidArgument naming `field` otherwise.
absl::StatusOr<Req> ParseCheckedCsr(const std::string& csr_pem, const std::string& field) {
  Bio bio(BIO_new_mem_buf(csr_pem.data(), static_cast<int>(csr_pem.size())));
  Req req(PEM_read_bio_X509_REQ(bio.get(), nullptr, nullptr, nullptr));
  if (!req)
    return absl::InvalidArgumentError(
        OpenSslError(absl::StrCat(field, ": not a PEM certificate request")));
  Key pub(X509_REQ_get_pubkey(req.get()));
  if (!pub || X509_REQ_verify(req.get(), pub.get()) != 1) {
    return absl::InvalidArgumentError(
        OpenSslError(absl::StrCat(field, ": signature does not verify")));
  }
  // A weak key makes the certificate's holder anyone who factors it: an
  // RSA-512 key falls in hours on one machine.
  switch (EVP_PKEY_get_base_id(pub.get())) {
    case EVP_PKEY_RSA: {
      int bits = EVP_PKEY_get_bits(pub.get());
      if (bits < 2048) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": an RSA key of ", bits,
                         " bits is too weak (at least 2048; or EC P-256/P-384)"));
      }
      return req;
    }
    case EVP_PKEY_EC: {
      char group[64] = {0};
      size_t len = 0;
      if (EVP_PKEY_get_group_name(pub.get(), group, sizeof group, &len) != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": an EC key on an unnamed curve (use P-256 or P-384)"));
      }
      std::string g(group, len);
      if (g != "prime256v1" && g != "P-256" && g != "secp384r1" && g != "P-384") {
        return absl::InvalidArgumentError(absl::StrCat(field, ": an EC key on curve ", g,
                                                       " is not accepted (use P-256 or P-384)"));
      }
      return req;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": a ", OBJ_nid2sn(EVP_PKEY_get_base_id(pub.get())),
                       " key is not accepted (EC P-256/P-384, or RSA >= 2048)"));
  }
}

}  // namespace

absl::Status CheckCsr(const std::string& csr_pem, const std::string& field) {
  return ParseCheckedCsr(csr_pem, field).status();
}

absl::StatusOr<std::string> SignCsr(const KeyAndCert& ca, const std::string& csr_pem,
                                    const std::string& common_name,
                                    const std::vector<std::string>& sans, absl::Duration validity,
                                    CertPurpose purpose) {
  Key ca_key = ParseKey(ca.key_pem);
  Cert ca_cert = ParseCert(ca.cert_pem);
  if (!ca_key || !ca_cert)
    return absl::FailedPreconditionError(OpenSslError("CA key or certificate: cannot parse"));
  absl::StatusOr<Req> req = ParseCheckedCsr(csr_pem, "csr");
  if (!req.ok()) return req.status();
  Key pub(X509_REQ_get_pubkey(req->get()));
  Cert cert = NewCert(pub.get(), common_name, validity);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  std::vector<std::string> alt;
  for (const std::string& s : sans) {
    unsigned char buf[16];
    bool ip = inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
    alt.push_back(absl::StrCat(ip ? "IP:" : absl::StartsWith(s, "spiffe://") ? "URI:" : "DNS:", s));
  }
  // An EC key signs (ECDHE); an RSA key may also encipher (RSA key exchange).
  const bool rsa = EVP_PKEY_get_base_id(pub.get()) == EVP_PKEY_RSA;
  if (!AddExtension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExtension(
          cert.get(), ca_cert.get(), NID_key_usage,
          rsa ? "critical,digitalSignature,keyEncipherment" : "critical,digitalSignature") ||
      !AddExtension(cert.get(), ca_cert.get(), NID_ext_key_usage,
                    purpose == CertPurpose::kServer ? "serverAuth" : "clientAuth") ||
      !AddExtension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always") ||
      (!alt.empty() &&
       !AddExtension(cert.get(), ca_cert.get(), NID_subject_alt_name, absl::StrJoin(alt, ",")))) {
    return absl::InvalidArgumentError(
        OpenSslError("certificate extensions (a SAN that is not a host name?)"));
  }
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0)
    return absl::InternalError(OpenSslError("sign certificate"));
  return CertPem(cert.get());
}

absl::StatusOr<std::string> CertCommonName(const std::string& cert_pem) {
  Cert cert = ParseCert(cert_pem);
  if (!cert) return absl::InvalidArgumentError(OpenSslError("certificate: cannot parse"));
  char cn[256] = {0};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, cn, sizeof cn) <
      0) {
    return absl::InvalidArgumentError("certificate: no CN");
  }
  return std::string(cn);
}

absl::StatusOr<std::string> CertSerialHex(const std::string& cert_pem) {
  Cert cert = ParseCert(cert_pem);
  if (!cert) return absl::InvalidArgumentError(OpenSslError("certificate: cannot parse"));
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert.get()), nullptr);
  if (bn == nullptr) return absl::InvalidArgumentError("certificate: bad serial number");
  char* hex = BN_bn2hex(bn);
  BN_free(bn);
  std::string out = absl::AsciiStrToLower(hex != nullptr ? hex : "");
  OPENSSL_free(hex);
  return out;
}

absl::StatusOr<CertValidity> CertValidityOf(const std::string& cert_pem) {
  Cert cert = ParseCert(cert_pem);
  if (!cert) return absl::InvalidArgumentError(OpenSslError("certificate: cannot parse"));
  auto to_time = [](const ASN1_TIME* t, absl::Time* out) {
    struct tm tm {};
    if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return false;
    *out = absl::FromTimeT(timegm(&tm));
    return true;
  };
  CertValidity v;
  if (!to_time(X509_get0_notBefore(cert.get()), &v.not_before) ||
      !to_time(X509_get0_notAfter(cert.get()), &v.not_after)) {
    return absl::InvalidArgumentError("certificate: bad validity dates");
  }
  return v;
}

absl::StatusOr<std::string> NewRsaCsrForTest(int bits, const std::string& common_name) {
  Key key(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(bits)));
  if (!key) return absl::InternalError(OpenSslError("generate RSA key"));
  absl::StatusOr<std::string> pem = KeyPem(key.get());
  if (!pem.ok()) return pem.status();
  return NewCsr(*pem, common_name);
}

}  // namespace trainctl::auth

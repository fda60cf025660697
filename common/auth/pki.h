// The cluster's small PKI (OpenSSL): a CA, certificates it signs from CSRs,
// and the files `trainctl-coordinator init` writes. Keys are EC P-256, PEM.
// Certificates are issued by purpose (CertPurpose): the coordinator's for
// TLS servers, workers' for TLS clients only (docs/security.md).
//
// Used by the coordinator's init step (coordinator/main.cc) and, for worker
// certificates, by whoever signs a worker's CSR. Thread-safe: no shared state.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainctl::auth {

struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

// A new private key (PEM, PKCS#8).
absl::StatusOr<std::string> NewPrivateKey();
// A self-signed CA certificate ("CN=<common_name>", CA:TRUE) with a new key.
absl::StatusOr<KeyAndCert> NewCa(const std::string& common_name, absl::Duration validity);
// A CSR for `key_pem` with subject CN=<common_name>.
absl::StatusOr<std::string> NewCsr(const std::string& key_pem, const std::string& common_name);
// What a certificate is for: its extended key usage, which every TLS stack
// (OpenSSL's X509_PURPOSE_SSL_SERVER/CLIENT, as gRPC's handshake uses it)
// checks. A worker's certificate is kClient only, so no client (CLI, client
// library, worker) accepts it as the coordinator even when one of its names
// matches the address dialled.
enum class CertPurpose {
  kServer,  // serverAuth: the coordinator's serving certificate.
  kClient,  // clientAuth: a worker's certificate (joined or worker-cert).
};

// The URI SAN a worker certificate carries besides its addresses:
// "spiffe://trainctl/worker/<id>" (a SPIFFE-style identity; the SAN
// extension is never empty, and gRPC's own name check then never falls
// back to the CN, the worker id a joiner may choose).
std::string WorkerUri(const std::string& worker_id);

// OK when `csr_pem`'s public key is strong enough: RSA of at least 2048
// bits, or EC on P-256 or P-384. InvalidArgument naming `field` otherwise
// (and for a CSR that does not parse or whose signature does not verify).
absl::Status CheckCsr(const std::string& csr_pem, const std::string& field = "csr_pem");

// Signs `csr_pem` with the CA for `purpose`: the certificate's CN is
// `common_name` (the CSR's subject and extensions are ignored: the signer
// decides the identity), its SANs are `sans` (IP addresses where they parse
// as one, "spiffe://..." URIs, DNS names otherwise). InvalidArgument (from
// CheckCsr) for a CSR that does not parse, whose signature does not verify,
// or whose key is weak.
absl::StatusOr<std::string> SignCsr(const KeyAndCert& ca, const std::string& csr_pem,
                                    const std::string& common_name,
                                    const std::vector<std::string>& sans, absl::Duration validity,
                                    CertPurpose purpose);
// The subject CN of a PEM certificate.
absl::StatusOr<std::string> CertCommonName(const std::string& cert_pem);
// The serial number of a PEM certificate, lowercase hex without leading
// zeros (as `openssl x509 -serial` prints it, lowercased).
absl::StatusOr<std::string> CertSerialHex(const std::string& cert_pem);

// When a PEM certificate starts and stops being valid.
struct CertValidity {
  absl::Time not_before;
  absl::Time not_after;
};
absl::StatusOr<CertValidity> CertValidityOf(const std::string& cert_pem);

// Test helper for weak-key refusals: a CSR for a new RSA key of `bits`.
absl::StatusOr<std::string> NewRsaCsrForTest(int bits, const std::string& common_name);

}  // namespace trainctl::auth

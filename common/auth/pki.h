// The cluster's small PKI (OpenSSL): a CA, certificates it signs from CSRs,
// and the files `trainctl-coordinator init` writes. Keys are EC P-256, PEM.
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
// Signs `csr_pem` with the CA: the certificate's CN is `common_name` (the
// CSR's subject is ignored: the signer decides the identity), its SANs are
// `sans` (IP addresses where they parse as one, DNS names otherwise), usable
// for TLS server and client authentication. InvalidArgument for a CSR that
// does not parse or whose signature does not verify.
absl::StatusOr<std::string> SignCsr(const KeyAndCert& ca, const std::string& csr_pem,
                                    const std::string& common_name,
                                    const std::vector<std::string>& sans, absl::Duration validity);
// The subject CN of a PEM certificate.
absl::StatusOr<std::string> CertCommonName(const std::string& cert_pem);

}  // namespace trainctl::auth

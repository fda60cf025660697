// `trainctl-coordinator init` and `worker-cert`: the files a cluster starts
// from (the CA, the coordinator's certificate, the admin and worker tokens,
// a CLI config) and a worker's own certificate. The binary's flags are read
// in coordinator/main.cc and passed here as values.
#pragma once

#include <string>
#include <vector>

namespace trainctl::coordinator {

struct ClusterInitOptions {
  // --dir: where every file is written (made owner-only).
  std::string dir;
  // --san: more names the coordinator's certificate is for.
  std::vector<std::string> sans;
  // --join-tokens, --join-ttl-h, --join-addresses.
  int join_tokens = 0;
  int join_ttl_h = 24;
  std::vector<std::string> join_addresses;
  // --listen as given (its port goes into trainctl.yaml); may be empty.
  std::string listen;
  // The store the worker token is written to (--store, else sqlite:--db),
  // or the error that naming it gave; and how the summary's start line
  // names it (" --db PATH", or " --store (the same as here)").
  std::string store_spec;
  std::string store_spec_error;
  std::string store_flag_text;
};

// Writes the cluster's files; 0 on success, 1 when a step failed, 2 on a
// usage error, each said on stderr. Refuses to replace an existing CA.
int RunClusterInit(const ClusterInitOptions& o);

struct WorkerCertOptions {
  std::string dir;        // --dir: the init directory (ca.key, ca.crt)
  std::string worker_id;  // --worker-id: the certificate's CN
  std::string out;        // --out: where ID.crt/ID.key go (default: dir)
  std::vector<std::string> sans;
};

// A key and a client certificate for worker_id, signed by dir's CA.
int RunWorkerCert(const WorkerCertOptions& o);

}  // namespace trainctl::coordinator

// Random secrets from the kernel's CSPRNG (getrandom), hex encoded. Used for
// the per-attempt rendezvous secret (coordinator, worker daemon, tests).
#pragma once

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"

namespace trainctl {

// `n` random bytes. getrandom does not fail on a booted Linux host; if it
// does, the host is broken and we abort rather than hand out a weak secret.
inline std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::perror("getrandom");
      std::abort();
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

// 32 random bytes as 64 hex digits.
inline std::string NewSecretHex() { return absl::BytesToHexString(RandomBytes(32)); }

}  // namespace trainctl

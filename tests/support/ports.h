// Loopback ports for tests: one the kernel just handed out and nothing
// listens on (to dial an unreachable address, or to listen on later).
//
// Thread-safe. Another process may take the port before the caller does;
// tests that listen prefer port 0.
#pragma once

namespace trainctl::testing {

// A 127.0.0.1 port that was free a moment ago; 0 if none could be bound.
int UnusedPort();

}  // namespace trainctl::testing

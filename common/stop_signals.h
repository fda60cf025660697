// How the daemons (trainctl-coordinator, trainctl-worker) take SIGTERM and
// SIGINT: blocked in every thread (block them with BlockStopSignals() before
// the first thread starts; the mask is inherited) and taken with sigwait()
// by main. No handler runs in signal context, so nothing async-signal-unsafe
// (a mutex, a Notification) is ever called from one.
//
// Threading: call BlockStopSignals() on the main thread before starting any
// other; WaitForStopSignal() from one thread.
#pragma once

#include <pthread.h>

#include <csignal>

namespace trainctl {

inline sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

inline void BlockStopSignals() {
  sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// Blocks until SIGTERM or SIGINT arrives; returns it.
inline int WaitForStopSignal() {
  sigset_t set = StopSignals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

// Waits at most `ms` milliseconds for SIGTERM or SIGINT: the signal, or 0
// when none came (a standby's poll interval, coordinator/main.cc).
inline int WaitForStopSignalFor(long ms) {
  sigset_t set = StopSignals();
  struct timespec timeout {
    ms / 1000, (ms % 1000) * 1000000
  };
  const int sig = sigtimedwait(&set, nullptr, &timeout);
  return sig > 0 ? sig : 0;
}

}  // namespace trainctl

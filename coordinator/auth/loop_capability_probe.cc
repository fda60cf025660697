// Compiled, never linked, by loop_capability_probe_test (clang builds only;
// coordinator/CMakeLists.txt, coordinator/auth/loop_capability_probe.sh): keeps
// the loop-ownership analysis (coordinator/core/on_loop.h) from quietly checking
// nothing. As written it touches a loop owner after AssertOnLoop and must
// compile; with PROBE_OFF_LOOP it touches it without, which clang's
// -Werror=thread-safety must refuse, naming kLoop.
#include <cstddef>

#include "coordinator/auth/live_calls.h"
#include "coordinator/core/on_loop.h"

namespace trainctl::coordinator {

size_t ProbeLiveCalls(LiveCalls& calls) {
#ifndef PROBE_OFF_LOOP
  AssertOnLoop(nullptr, "loop_capability_probe");
#endif
  return calls.size();
}

}  // namespace trainctl::coordinator

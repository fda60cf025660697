// "On the coordinator's loop" as clang's thread-safety analysis names it.
//
// The coordinator's owners call one another on the loop (a posted closure
// → JobManager → JobPlacer → JobBook → MetricsHub), and the analysis
// matches a capability by how it is written, not by the object it denotes:
// `book_->loop_` and `registry_->loop_` are two capabilities to it even when
// both point at the one EventLoop (the worker daemon's RankTable can name
// its own `loop_` because nothing else calls into it). So every loop-only
// field and function of coordinator/ names one capability, kLoop:
//
//   absl::btree_map<std::string, Entry> workers_ ABSL_GUARDED_BY(kLoop);
//   void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(kLoop);
//
// and code that gets onto the loop — a closure passed to EventLoop::Post,
// Every or RunSync, a stream reactor's callback the loop runs — calls
// AssertOnLoop(loop, what) once, first: it checks the thread at run time
// (EventLoop::CheckInLoop, in release builds too) and tells the analysis
// that kLoop is held for the rest of that function.
//
// kLoop is a name, not a lock: it has no state, and it stands for "this
// thread is the loop of the owners it touches". With two coordinators in one
// process (a test's active and standby) the analysis cannot tell their loops
// apart; the run-time check can, and does.
//
// Unit tests that drive the owners from the test thread, with no loop
// running, are compiled without the analysis (coordinator/CMakeLists.txt).
#pragma once

#include "absl/base/thread_annotations.h"
#include "common/event_loop.h"

namespace trainctl::coordinator {

class ABSL_LOCKABLE LoopCapability {};
inline LoopCapability kLoop;

// Checks that this thread is `loop`'s while it runs (else prints `what` and
// aborts) and asserts kLoop. `loop` null: an owner that was never bound to a
// loop (unit tests); nothing to check.
inline void AssertOnLoop(const EventLoop* loop, const char* what)
    ABSL_ASSERT_EXCLUSIVE_LOCK(kLoop) {
  if (loop != nullptr) loop->CheckInLoop(what);
}

}  // namespace trainctl::coordinator

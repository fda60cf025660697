// A STAND-IN for a standby coordinator, for the client-side failover tests
// (common/coordinator_failover.h) until the real standby mode of
// trainctl-coordinator is on this branch; then the tests that use it should
// start a real standby instead.
//
// It implements the contract the standby is built to, and nothing else: a
// real gRPC server on 127.0.0.1:0 whose standard health service answers
// NOT_SERVING, and whose every other method (any service, unary or
// stream) ends at once with UNAVAILABLE, the message "standby coordinator;
// the active coordinator is at HOST:PORT" (or "...; no active coordinator
// is known yet") and the trailing metadata `trainctl-active-coordinator:
// HOST:PORT` (absent when no active one is known). It runs nothing.
//
// With Mode::kLostAnswer it is instead a coordinator whose answers are all
// lost after the call arrived: every method ends UNAVAILABLE with neither
// the hint nor the standby's message (what a client sees when a connection
// breaks after sending), so a client must not assume the call did not run.
//
// Thread-safe: set_active and the counters may be used while calls arrive.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"

namespace trainctl::testing {

class StandbyStandIn {
 public:
  enum class Mode { kStandby, kLostAnswer };
  // `active`: HOST:PORT to name, "" for none. address() is empty when it
  // cannot listen.
  explicit StandbyStandIn(std::string active, Mode mode = Mode::kStandby);
  ~StandbyStandIn();
  StandbyStandIn(const StandbyStandIn&) = delete;
  StandbyStandIn& operator=(const StandbyStandIn&) = delete;

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  void set_active(std::string active);
  // Calls answered so far, in all and of one full method name
  // ("/trainctl.v1.JobService/SubmitJob").
  int64_t calls();
  int64_t calls(const std::string& method);

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace trainctl::testing

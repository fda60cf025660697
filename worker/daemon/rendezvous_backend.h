// RendezvousBackend: what rank 0's daemon makes so that an attempt's ranks
// can find each other, and what each rank is handed of it. One flow for
// every job (worker_daemon's OnStartRanks / OnRendezvous): the producing
// daemon (rank 0's) calls Produce before any rank starts and reports the
// result; every other daemon waits for the coordinator's delivery; each
// rank is then launched with ConfigureRank (engine ranks) and MasterEndpoint
// (every rank's MASTER_ADDR/MASTER_PORT). One implementation per backend:
//
//  - NCCL (engine, GPU): an NCCL unique id made here (ncclGetUniqueId).
//  - Gloo store (engine, CPU): rank 0's TCP store port, reserved here; if
//    the host refuses a reservation, rank 0 picks a port and reports its
//    store address on its status pipe (RankListening).
//  - MASTER_PORT (command jobs, torchrun's contract): a port reserved here
//    for the user's program; it cannot report one itself.
//
// The wire protocol is RendezvousReport / RendezvousDelivery (proto); the
// rank's side reads the run_keys of worker/protocol/rank_protocol.h.
//
// Not thread-safe: owned by one attempt on the daemon's EventLoop.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "trainctl/v1/worker_service.pb.h"
#include "worker/protocol/rank_protocol.h"

namespace trainctl::worker {

class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;

  // On rank 0's host, before any rank starts: the info to report to the
  // coordinator and launch the local ranks with; std::nullopt when rank 0
  // must make it itself (launch rank 0 alone, it reports through
  // RankListening); an error fails the attempt's local ranks.
  virtual absl::StatusOr<std::optional<v1::RendezvousInfo>> Produce(const std::string& address) = 0;

  // Rank 0 (on the producing host) says its store listens on `address`
  // ("host:port"): the reservation is let go; returns the info to report
  // when Produce did not report one, else std::nullopt; InvalidArgument when
  // `address` has no valid port (nothing is reported then).
  virtual absl::StatusOr<std::optional<v1::RendezvousInfo>> RankListening(
      const std::string& address) = 0;

  // An engine rank's rendezvous entries: `info` is unset only for rank 0
  // when Produce returned std::nullopt; `rank_zero_here` when the rank is
  // rank 0 on the producing host (it hosts the store).
  virtual void ConfigureRank(const std::optional<v1::RendezvousInfo>& info, bool rank_zero_here,
                             rankproto::FlatConfig& cfg) const = 0;
};

// The backend for an attempt: `gpu` when its slots are GPUs, `command` for
// a command job (its own program runs the collectives).
std::unique_ptr<RendezvousBackend> MakeRendezvousBackend(bool gpu, bool command);

// MASTER_ADDR and MASTER_PORT for a rank: the rendezvous's, or (before
// rank 0 made one) this host's `address` and port "0".
std::pair<std::string, std::string> MasterEndpoint(const std::optional<v1::RendezvousInfo>& info,
                                                   const std::string& address);

}  // namespace trainctl::worker

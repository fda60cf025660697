// Keepalive on trainctl's gRPC connections, in one place. The coordinator
// and each worker daemon ping each other on the Session stream every 10 s
// (a peer gone without a FIN is found within ~15 s, long before its lease
// matters); the CLI's channel pings every 30 s, and only during calls (its
// watch and log streams sit idle for minutes behind NATs and proxies); the
// coordinator accepts pings as often as once a second, without strikes.
//
// Header-only; any thread (it only fills in arguments).
#pragma once

#include <grpc/grpc.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace trainctl {

struct KeepaliveSettings {
  int time_ms;         // ping after this long without traffic
  int timeout_ms;      // a ping unanswered this long closes the connection
  bool without_calls;  // ping even with no call in flight
};

// The coordinator <-> worker Session, on both ends.
inline constexpr KeepaliveSettings kSessionKeepalive{10000, 5000, true};
// A client (the CLI, programs using client/) to the coordinator.
inline constexpr KeepaliveSettings kClientKeepalive{30000, 10000, false};

inline void SetKeepalive(grpc::ChannelArguments& args, const KeepaliveSettings& k) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, k.time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, k.timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, k.without_calls ? 1 : 0);
}

// The coordinator's end: pings as a session does, and accepts its peers'
// pings (kSessionKeepalive's and kClientKeepalive's) without closing them.
inline void SetServerKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kSessionKeepalive.time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kSessionKeepalive.timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                             kSessionKeepalive.without_calls ? 1 : 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace trainctl

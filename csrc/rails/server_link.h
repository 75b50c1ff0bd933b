// A rank's connections to the job's dedicated reduction servers (option
// reduction_servers): found through the job's store, greeted, admitted.
// The rail stage then sends its all-reduce pieces over them
// (rails/rail_stage.h).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <vector>

#include "rails/wire_codec.h"
#include "topology/topology.h"
#include "transport/channel.h"

namespace c10d {
class Store;
}

namespace fairring {

struct Config;

// A group uses its reduction servers only from this many nodes on.  At two,
// each worker's link carries S each way with or without them (2(N-1)/N = 1),
// and the hop through a server only adds latency (measured 5-6% slower at
// 25 MiB, 1 Gbit/s: docs/BENCHMARKS_HISTORY.md, "Dedicated reduction servers").
constexpr int kMinNodesForServers = 3;
bool uses_reduction_servers(const Config& config, int num_nodes);

// Connects this rank to servers 0..config.reduction_servers-1.  `store` is
// the group's (engine's) store: the rail's session id is agreed in it, the
// servers are found in the job's root store under it.  Waits for servers
// that have not joined yet up to min(timeout, 2 minutes), then fails with an
// error that says how many joined and how to start them.  Collective over
// the rank's rail.
// `max_message_bytes`: the largest contribution the rank will send (the
// server refuses larger ones).
std::vector<std::unique_ptr<Channel>> connect_reduction_servers(const c10::intrusive_ptr<c10d::Store>& store,
                                                                const Topology& topo, const Config& config,
                                                                WireDtype wire, int64_t max_message_bytes);

}  // namespace fairring

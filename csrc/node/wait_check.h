// What an engine thread checks, every few milliseconds, while it waits for a
// local peer or for the network.  Shared by the CPU and CUDA engines, so both
// give up for the same reasons with the same words.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "node/node_arena.h"
#include "topology/topology.h"

namespace fairring {

// False once `pid` has exited (a zombie not yet reaped counts as exited).
bool process_alive(int pid);

// The check for one wait of op `op_seq` (the engine's number; `op_name`
// "all_reduce", "CUDA all_reduce" and the group's `op_number` for messages) on local peer `local_peer`, or on the
// network when it is -1.  It throws to give up when `throw_if_failed` throws (the group failed), the node aborted, the
// peer exited, or the wait outlasted its deadline (deadlines.h: `timeout` for a local peer, which it then names as
// stalled or absent; longer for the network).  `what` says what the peer is
// waited for ("provide its input").  `peer_waits_on_network`: that step of
// the peer's needs the rails (its chunk after the exchange), so a slow peer
// gets the network's deadline, unless it has not even issued the op.
std::function<void()> make_wait_check(const Topology& topo, NodeArena& arena, std::chrono::milliseconds timeout,
                                      std::function<void()> throw_if_failed, const char* op_name, int local_peer,
                                      const char* what, uint64_t op_seq, uint64_t op_number,
                                      bool peer_waits_on_network = false);

}  // namespace fairring

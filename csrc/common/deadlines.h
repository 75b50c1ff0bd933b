// How long each kind of wait lasts, from the process group's timeout.
//
// The waits are staggered so that the diagnosis naming the root cause fires
// first and reaches every rank (through the node's abort word and the rails'
// abort messages) before any other wait gives up:
//   1. a local peer that has not issued the op, or is stuck in it: named once
//      `timeout` has passed, never earlier (a late but live peer is waited for);
//   2. a rail peer that sent nothing: named a grace period later, because a
//      node-mate of the real culprit blocks on it and goes silent on its rail
//      too; by then the culprit's node has told us who it was;
//   3. a wait on the network as a whole: last.
// Every survivor still reports within 1.5 x timeout.
#pragma once

#include <algorithm>
#include <chrono>

namespace fairring {

// The grace periods of steps 2 and 3: a share of the timeout, capped.
constexpr auto kRailGraceCap = std::chrono::seconds(10);
constexpr auto kNetworkGraceCap = std::chrono::seconds(5);

inline std::chrono::milliseconds local_peer_deadline(std::chrono::milliseconds timeout) { return timeout; }

inline std::chrono::milliseconds rail_peer_deadline(std::chrono::milliseconds timeout) {
  return timeout + std::min<std::chrono::milliseconds>(timeout / 4, kRailGraceCap);
}

inline std::chrono::milliseconds network_deadline(std::chrono::milliseconds timeout) {
  return rail_peer_deadline(timeout) + std::min<std::chrono::milliseconds>(timeout / 10, kNetworkGraceCap);
}

}  // namespace fairring

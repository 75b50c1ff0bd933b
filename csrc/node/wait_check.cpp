#include "node/wait_check.h"

#include "common/error.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <string>

#include "common/deadlines.h"
#include "common/errors.h"

namespace fairring {

namespace {
using Clock = std::chrono::steady_clock;
// How often a waiter checks that its local peer's process still exists.
constexpr auto kPidCheckEvery = std::chrono::milliseconds(200);
}  // namespace

bool process_alive(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie (exited, not yet reaped by its parent) is dead too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return !(close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z');
}

std::function<void()> make_wait_check(const Topology& topo, NodeArena& arena, std::chrono::milliseconds timeout,
                                      std::function<void()> throw_if_failed, const char* op_name, int local_peer,
                                      const char* what, uint64_t op_seq, uint64_t op_number,
                                      bool peer_waits_on_network) {
  const auto start = Clock::now();
  // See deadlines.h for why a wait on the network lasts longer.
  const auto absent_at = start + local_peer_deadline(timeout);
  const auto give_up_at =
      start + (local_peer >= 0 && !peer_waits_on_network ? local_peer_deadline(timeout) : network_deadline(timeout));
  const int peer_rank = local_peer >= 0 ? topo.local_ranks()[local_peer] : -1;
  const std::string op = std::string(op_name) + " #" + std::to_string(op_number);
  auto next_pid_check = start;
  return [&arena, throw_if_failed = std::move(throw_if_failed), local_peer, what, start, absent_at, give_up_at, op_seq,
          peer_rank, op, next_pid_check]() mutable {
    throw_if_failed();
    if (arena.aborted()) throw arena.abort_error();
    const auto now = Clock::now();
    if (local_peer < 0) {
      if (now > give_up_at) throw Error(ErrorKind::kBackend, "Timed out waiting for the network part of " + op);
      return;
    }
    NodeControl& c = arena.control();
    // A peer that left took part in the ops it issued; one it never issued
    // will not come.  The conventional words last: code that retries on a
    // lost peer looks for them.
    if (const std::string why = arena.left_before(local_peer, op_seq); !why.empty()) {
      throw Error(ErrorKind::kNetwork, "rank " + std::to_string(peer_rank) + " left the group (" + why +
                                           ") before calling " + op + ": Connection closed by peer");
    }
    if (now >= next_pid_check) {
      next_pid_check = now + kPidCheckEvery;
      if (!process_alive(c.pids[local_peer])) {
        throw Error(ErrorKind::kNetwork, "rank " + std::to_string(peer_rank) + " (pid " +
                                             std::to_string(c.pids[local_peer]) + ") exited while " + op +
                                             " was in progress: Connection closed by peer");
      }
    }
    if (now <= absent_at) return;
    const std::string waited = seconds(std::chrono::duration<double>(now - start).count());
    if (c.issued[local_peer].load(std::memory_order_acquire) <= op_seq) {
      throw Error(ErrorKind::kBackend, "Timed out after " + waited + ": rank " + std::to_string(peer_rank) +
                                           " has not called " + op +
                                           ". Is it stalled, or did it skip this collective?");
    }
    if (now <= give_up_at) return;
    throw Error(ErrorKind::kBackend, "Timed out after " + waited + ": rank " + std::to_string(peer_rank) + " did not " +
                                         what + " for " + op + ". Is it stalled?");
  };
}

}  // namespace fairring

#include "allreduce/wait_check.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <stdexcept>
#include <string>

#include "common/errors.h"

namespace fairring {

namespace {
using Clock = std::chrono::steady_clock;

// A stalled peer is named after this share of the timeout, so that its name
// reaches every rank (through the abort) before their own waits give up.
constexpr double kStallShare = 0.9;
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
                                      const char* what, uint64_t op_seq) {
  const auto start = Clock::now();
  const auto stall_at = start + std::chrono::duration_cast<Clock::duration>(timeout * kStallShare);
  // Waits that depend on the network give the rail's own diagnosis (which
  // names the remote culprit) time to arrive first.
  const auto give_up_at = start + timeout + std::min<Clock::duration>(timeout / 10, std::chrono::seconds(5));
  const int peer_rank = local_peer >= 0 ? topo.local_ranks()[local_peer] : -1;
  const std::string op = std::string(op_name) + " #" + std::to_string(op_seq);
  auto next_pid_check = start;
  return [&arena, throw_if_failed = std::move(throw_if_failed), local_peer, what, start, stall_at, give_up_at,
          op_seq, peer_rank, op, next_pid_check]() mutable {
    throw_if_failed();
    if (arena.aborted()) throw std::runtime_error(arena.abort_message());
    const auto now = Clock::now();
    if (local_peer < 0) {
      if (now > give_up_at) throw std::runtime_error("timed out waiting for the network part of " + op);
      return;
    }
    NodeControl& c = arena.control();
    if (now >= next_pid_check) {
      next_pid_check = now + std::chrono::milliseconds(200);
      if (!process_alive(c.pids[local_peer])) {
        throw std::runtime_error("rank " + std::to_string(peer_rank) + " (pid " + std::to_string(c.pids[local_peer]) +
                                 ") exited while " + op + " was in progress");
      }
    }
    const bool issued = c.issued[local_peer].load(std::memory_order_acquire) > op_seq;
    if (now > stall_at && !issued) {
      throw std::runtime_error("timed out: rank " + std::to_string(peer_rank) + " has not called " + op +
                               " (waited " + seconds(std::chrono::duration<double>(now - start).count()) +
                               "). Is it stalled, or did it skip this collective?");
    }
    if (now > give_up_at) {
      throw std::runtime_error("timed out waiting for rank " + std::to_string(peer_rank) + " to " + what + " for " +
                               op);
    }
  };
}

}  // namespace fairring

// The node thread of the point-to-point engine: sends to node-mates into
// the rings, their messages out of them; the receives callers post; the
// periodic checks.  Sleeps on the rank's doorbell.  A caller waiting on its
// own op does the same passes meanwhile (poll), with the doorbell's wake-ups
// held back.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/fault_injection.h"
#include "p2p/p2p_engine.h"
#include "p2p/p2p_op.h"
#include "transport/sync.h"

namespace fairring {

namespace {
// How often it checks for dead peers and timeouts.
constexpr auto kCheckEvery = std::chrono::milliseconds(100);
}  // namespace

void P2pEngine::ring(const Peer& peer) { doorbell_ring(arena_->counter(peer.local, peer.local, 0)); }

bool P2pEngine::streaming() {
  for (int r : topo_.local_ranks()) {
    if (r == topo_.rank) continue;
    Peer& peer = peers_[r];
    {
      std::lock_guard<std::mutex> out(*peer.out_mu);
      if (!peer.sends.empty()) return true;
    }
    std::lock_guard<std::mutex> in(*peer.in_mu);
    if (peer.inbound.active && !peer.dropping) return true;
  }
  return false;
}

void P2pEngine::node_loop() {
  pthread_setname_np(pthread_self(), "fairring-p2p");
  for (;;) {
    const uint32_t seen = bell_->value.load(std::memory_order_acquire);
    if (stop_.load()) {
      fail_everything(Error(ErrorKind::kBackend, "this process group was destroyed"));
      return;
    }
    bool moved = take_posts(/*on_caller=*/false);
    for (int r : topo_.local_ranks()) {
      if (r == topo_.rank) continue;
      Peer& peer = peers_[r];
      {
        std::lock_guard<std::mutex> in(*peer.in_mu);
        moved |= pump_in(peer);
      }
      moved |= pump_out(peer);
    }
    const auto now = Clock::now();
    if (now >= next_check_) {
      next_check_ = now + kCheckEvery;
      check(now);  // (also with nothing pending: a message half in from a dead peer)
    }
    if (moved) continue;
    // Mid-way through a message that needs more rings to move on: every
    // ring wakes this thread, whoever else looks.
    bell_->needs_wakes.store(streaming() ? 1 : 0, std::memory_order_seq_cst);
    // It never spins for the next message.  Where callers poll for their own
    // ops it need not stay awake, and spinning would take the CPU they poll
    // on; where they don't, the ranks here outnumber the CPUs, and a spinning
    // thread takes a CPU from another rank's work (the pipeline benchmark's
    // 4 ranks on 2 CPUs: 1.06x gloo with a 50 us spin, 1.16x without).
    doorbell_wait(*bell_, seen, Clock::duration::zero(), kCheckEvery);
  }
}

void P2pEngine::wake_node() { counter_bump(*bell_); }  // (not doorbell_ring: wakes it even while watched)

void P2pEngine::progress() {
  take_posts(/*on_caller=*/true);
  for (int r : topo_.local_ranks()) {
    if (r == topo_.rank) continue;
    Peer& peer = peers_[r];
    {
      std::unique_lock<std::mutex> in(*peer.in_mu, std::try_to_lock);  // held: the node thread is at it
      if (in.owns_lock()) pump_in(peer);
    }
    pump_out(peer);
  }
}

void P2pEngine::poll(const std::function<bool()>& done, std::chrono::microseconds budget) {
  if (!polls() || done()) return;
  bell_->pollers.fetch_add(1, std::memory_order_seq_cst);
  const auto until = Clock::now() + budget;
  for (unsigned i = 1;; ++i) {
    const uint32_t seen = bell_->value.load(std::memory_order_acquire);
    progress();
    if (done()) break;
    if (i % 16 == 0 || budget.count() == 0) {
      if (Clock::now() >= until) break;
      std::this_thread::yield();  // ranks may outnumber cores
    }
    // Until a node-mate rings (a message, a free cell) or a while passes
    // (a receive posted by another thread; an op the node thread ended):
    // one cache line to watch instead of every ring and lock.
    for (int k = 0; k < 64 && bell_->value.load(std::memory_order_acquire) == seen && !done(); ++k) cpu_relax();
  }
  bell_->pollers.fetch_sub(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // a ring that saw us polling is visible below
  // Node-mates that rang meanwhile woke nobody: what they announced (a
  // message for another receive, a free cell for a queued send) is moved
  // here.
  progress();
  if (!done()) {
    // Going to sleep: a promise to look (recv) would now hold the message
    // back until it runs out.  Withdrawn, the next ring wakes the node thread.
    doorbell_unwatch(*bell_);
    progress();
  }
  // A message or send still part-way (ours, or one this poll moved for
  // another thread): the node thread carries it on, woken by every ring.
  if (streaming()) wake_node();
}

bool P2pEngine::pump_in(Peer& peer) {
  bool moved = false;
  char* dst = nullptr;
  while (const CellHeader* h = peer.in.peek()) {
    Inbound& in = peer.inbound;
    if (peer.dropping) {  // failed: what still comes is not read
      peer.in.consume();
      moved = true;
      continue;
    }
    if (!in.active) {
      dst = begin_message(peer, *h);
    } else if (moved == false) {
      std::lock_guard<std::mutex> lock(match_mu_);  // the destination, as begin_message left it
      dst = in.op ? in.op->data : in.unexpected ? unexpected_.at(in.unexpected).data() : nullptr;
    }
    in.last_progress = Clock::now();
    if (in.op) in.op->last_progress = in.last_progress;
    if (dst && h->bytes > 0) std::memcpy(dst + h->offset, peer.in.payload(h), h->bytes);
    in.got += h->bytes;
    peer.in.consume();
    moved = true;
    if (in.got == in.total) end_message(peer);
  }
  if (moved) ring(peer);  // its sender may be waiting for a free cell
  return moved;
}

std::vector<std::shared_ptr<P2pEngine::Op>> P2pEngine::write_cells(Peer& peer) {
  // FAIRRING_TEST_P2P_EXIT_AFTER=<bytes>: the process exits (code 57) in the
  // middle of a send, once it has written that many bytes of it (tests of a
  // peer that dies mid-transfer).
  static const int64_t exit_after = test_bytes("FAIRRING_TEST_P2P_EXIT_AFTER");
  std::vector<std::shared_ptr<Op>> whole;
  while (!peer.sends.empty() && peer.out.can_write()) {
    Op& op = *peer.sends.front();
    const CellHeader h = header_of(op, std::min<uint64_t>(peer.out.payload_bytes(), op.bytes - op.moved));
    peer.out.write(h, op.data + op.moved);
    op.moved += h.bytes;
    op.last_progress = Clock::now();
    if (exit_after >= 0 && op.moved >= static_cast<uint64_t>(exit_after) && op.moved < op.bytes) _exit(57);
    if (op.moved == op.bytes) {
      whole.push_back(std::move(peer.sends.front()));
      peer.sends.pop_front();
    }
  }
  return whole;
}

bool P2pEngine::pump_out(Peer& peer) {
  std::vector<std::shared_ptr<Op>> whole;
  {
    std::unique_lock<std::mutex> lock(*peer.out_mu);
    if (peer.sends.empty() || !peer.out.can_write()) return false;
    whole = write_cells(peer);
  }
  ring(peer);
  for (auto& op : whole) finish(op, nullptr, peer.rank);
  return true;
}

}  // namespace fairring

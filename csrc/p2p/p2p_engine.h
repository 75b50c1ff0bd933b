// Point-to-point transfers (send, recv, recv from any source) between the
// ranks of one node, through shared memory: one ShmRing per ordered pair of
// local ranks, driven by one engine thread per rank.
//
//   - A send streams its tensor into the ring to its peer, cell by cell, and
//     is done once the last cell is in: it never waits for the receive to be
//     posted (the receiver's engine keeps messages nobody asked for yet), so
//     no order of sends and receives that gloo or NCCL accept can deadlock.
//   - The receiver's engine reads every ring it has, matches each message to
//     a posted receive by (source, tag) in arrival order (matcher.h) and
//     copies it straight into that receive's tensor, or into a buffer of its
//     own until a matching receive is posted.
//   - The thread sleeps on a doorbell counter in shared memory that local
//     callers and the peers ring (after writing a cell for it, after freeing
//     a cell of its own ring, after posting an op).
//   - Failures stay with the ops they touch: a peer that exits fails the ops
//     with it (and later ones), naming it; an op pending longer than the
//     group's timeout fails; a message whose size or dtype is not what the
//     receive expects fails that receive, clearly, and is dropped.
//   - abort(): every pending and later op fails at once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "node/node_arena.h"
#include "p2p/matcher.h"
#include "p2p/shm_ring.h"
#include "pipeline/completion_pool.h"
#include "pipeline/op_order.h"
#include "topology/topology.h"

namespace c10d {
class Store;
}

namespace fairring {

using Clock = std::chrono::steady_clock;

class P2pEngine {
 public:
  // Called once the op is over: its error (null on success) and the rank it
  // exchanged with (a receive from any source: the sender).  On the engine
  // thread, or on the caller's (`on_caller`: a send that fit in the ring at
  // once, or an op refused at the start).  Quick; what may block belongs on
  // completions().
  using Done = std::function<void(std::exception_ptr error, int peer, bool on_caller)>;

  // Collective over the node's ranks (the shared rings, through `store`).
  P2pEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid,
            std::chrono::milliseconds timeout);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // Whether transfers with group rank `peer` run here (it shares the node).
  bool reaches(int peer) const;
  // `t`: a contiguous CPU tensor the engine reads (send) or writes (recv)
  // until `done` has run; its memory is `fp`'s.  `peer`: a group rank
  // (reaches(peer)), or kAnySource for a receive.
  void send(const at::Tensor& t, int peer, int tag, Done done);
  void recv(const at::Tensor& t, int peer, int tag, Done done);

  // Blocks until no pending op's memory conflicts with `fp` (op_order.h):
  // what is issued after a send or receive waits for it where they overlap.
  // True if it waited.
  bool wait_conflicts(const Footprint& fp);
  // Whether any op is pending (cheap).
  bool busy() const { return pending_.load(std::memory_order_acquire) > 0; }

  // Every pending and later op fails with `why`.
  void abort(const Error& why);
  // Later ops fail with `why`; pending ones go on.
  void close(const std::string& why);
  // Waits until no op is pending, at most `limit`; true if none is.
  bool drain(std::chrono::milliseconds limit);

  // Where futures are completed (user callbacks may block on other ops).
  CompletionPool& completions() { return completions_; }

 private:
  struct Op;
  struct Unexpected;
  // What arrives on the ring from one local peer.
  struct Inbound {
    bool active = false;      // a message is partly read
    std::shared_ptr<Op> op;   // its receive, or
    uint64_t unexpected = 0;  // its buffer (0: dropped)
    uint64_t got = 0;
    uint64_t total = 0;
  };
  struct Peer {
    int rank = -1;
    ShmRing out, in;
    // The out ring, the sends waiting for it and `gone`: callers write a
    // send that fits straight into the ring, in its turn.
    std::unique_ptr<std::mutex> out_mu = std::make_unique<std::mutex>();
    std::deque<std::shared_ptr<Op>> sends;  // to this peer, in issue order
    std::string gone;                       // why ops with this peer fail now ("" while it is fine)
    Inbound inbound;
  };

  void post(std::shared_ptr<Op> op);
  // Registers a pending op (for drain and wait_conflicts); false, having
  // failed it, if the engine takes no more.
  bool admit(const std::shared_ptr<Op>& op);
  // Writes cells of the peer's queued sends while the ring has room (the
  // peer's out_mu held); returns the sends that are whole.
  std::vector<std::shared_ptr<Op>> write_sends(Peer& peer);
  void loop();
  // Caller-posted ops into the engine's state; true if any.
  bool take_posts();
  void start_recv(std::shared_ptr<Op> op);
  bool pump_out(int local);
  bool pump_in(int local);
  void begin_message(int local, const CellHeader& h);
  // Periodic: dead peers and timeouts.
  void check(Clock::time_point now);
  void fail_peer(int local, const std::string& why);
  void finish(const std::shared_ptr<Op>& op, std::exception_ptr error, int peer);
  void fail_everything(const Error& why);
  void ring(int local);  // the doorbell of local rank `local`
  int local_of(int rank) const;

  Topology topo_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<NodeArena> arena_;
  std::vector<Peer> peers_;  // by local rank (ours unused)
  SharedCounter* bell_ = nullptr;

  Matcher matcher_;
  std::unordered_map<uint64_t, std::shared_ptr<Op>> posted_;  // receives waiting, by id
  std::unordered_map<uint64_t, Unexpected> unexpected_;
  uint64_t next_message_ = 1;
  Clock::time_point next_check_{};

  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<Op>> posts_;
  std::vector<std::shared_ptr<Op>> live_;  // pending ops, for wait_conflicts
  std::atomic<size_t> pending_{0};
  uint64_t next_op_ = 1;
  std::string failed_;  // abort()'s reason
  std::string closed_;
  ErrorKind failed_kind_ = ErrorKind::kBackend;
  std::atomic<bool> stop_{false};
  std::atomic<bool> down_{false};  // aborted or closed: no send is written on the caller
  CompletionPool completions_;
  std::thread thread_;
};

}  // namespace fairring

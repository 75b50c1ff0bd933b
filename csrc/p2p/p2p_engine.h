// Point-to-point transfers (send, recv, recv from any source) of CPU
// tensors, every rank of the group reachable:
//
//   - within a node, through shared memory: one ShmRing per ordered pair of
//     local ranks, driven by the rank's node thread (p2p_shm.cpp), which
//     sleeps on a doorbell counter in shared memory that local callers and
//     the peers ring (after writing a cell for it, after freeing a cell of
//     its own ring, after posting an op);
//   - between nodes, over TCP (p2p_tcp.cpp): a connection per direction, made
//     by the sender at its first send to that rank (the receiver's listening
//     address is in the store; the group's secret admits it), driven by the
//     rank's net thread (poll).
//
// The rules are the same on both (p2p_engine.cpp):
//   - A send is done once its last byte is written (into the ring, or taken
//     by the socket): it never waits for the receive to be posted, because
//     the receiver reads every message as it comes and keeps the ones nobody
//     asked for yet, so no order of sends and receives that gloo or NCCL
//     accept can deadlock.  A small send to a node-mate is written on the
//     caller's thread.
//   - Messages go to posted receives by (source, tag) in arrival order
//     (matcher.h), straight into the receive's tensor when it is posted.
//     A receive is matched on the caller's thread; a caller that waits for
//     an op with a node-mate moves the node's messages itself for a while
//     (poll) before it sleeps, and node-mates do not wake the node thread
//     meanwhile: a small message then crosses with no thread woken.
//   - Failures stay with the ops they touch: a peer that exits (or closes
//     its connection) fails the ops with it, and later ones, naming it; an
//     op pending longer than the group's timeout fails; a message whose size
//     or dtype is not what the receive expects fails that receive, clearly,
//     and is dropped.  abort(): every pending and later op fails at once.
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
#include "transport/socket.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

class P2pEngine {
 public:
  // Called once the op is over: its error (null on success) and the rank it
  // exchanged with (a receive from any source: the sender).  On an engine
  // thread, or on the caller's (`on_caller`: a send that fit in the ring at
  // once, or an op refused at the start).  Quick; what may block belongs on
  // completions().
  using Done = std::function<void(std::exception_ptr error, int peer, bool on_caller)>;

  // Collective over the group (the node's shared rings; every rank's
  // listening address in `store`).  `ifname`: the interface to listen on
  // ("": the hostname's address), as the rails.  `wait_poll`: how long
  // callers will poll (Config::wait_spin); 0: they don't, and a small receive
  // promises nothing.  `huge_pages`: advise huge pages for the blocks that
  // hold early messages (FAIRRING_HUGE_PAGES=advise).
  P2pEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid,
            const Secret& secret, const std::string& ifname, std::chrono::milliseconds timeout,
            std::chrono::microseconds wait_poll, bool huge_pages);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // `t`: a contiguous CPU tensor the engine reads (send) or writes (recv)
  // until `done` has run.  `peer`: a group rank other than ours, or
  // kAnySource for a receive.
  // `fp`: the caller's memory the op stands for, when `t` is a stand-in
  // (what later ops must wait for); null: `t`'s.  `waited`: a caller will
  // wait on the receive at once and poll (only where polls_for(peer)): if it
  // is small, its arrival need not wake the node thread (see recv).
  void send(const at::Tensor& t, int peer, int tag, Done done, const Footprint* fp = nullptr);
  void recv(const at::Tensor& t, int peer, int tag, Done done, const Footprint* fp = nullptr, bool waited = false);

  // Moves the node's messages on the calling thread (what the node thread
  // would do: receives into posted tensors, queued sends into the rings)
  // until `done()` or `budget` has passed.  For a caller about to sleep on
  // an op with a node-mate: on a machine with few cores, waking the node
  // thread and then the caller costs more than the message.
  void poll(const std::function<bool()>& done, std::chrono::microseconds budget);
  // Whether callers poll: the node has other ranks and wait_poll > 0.
  bool polls() const { return topo_.ranks_per_node > 1 && wait_poll_.count() > 0; }
  // Whether a caller waiting on an op with `peer` (or kAnySource) polls:
  // the node's rings are where poll moves messages.
  bool polls_for(int peer) const { return polls() && (peer == kAnySource || peers_[peer].local >= 0); }

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
  // This rank leaves the group (after close): node-mates that wait on it
  // (a send to it, a receive from it) fail at once, naming `why`.
  void leave(const std::string& why);
  // The group's new timeout, for the waits from now on.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_.store(timeout, std::memory_order_relaxed); }
  // Waits until no op is pending, at most `limit`; true if none is.
  bool drain(std::chrono::milliseconds limit);

  // Where futures are completed (user callbacks may block on other ops).
  CompletionPool& completions() { return completions_; }

 private:
  struct Op;
  struct Unexpected;
  // What arrives from one peer: the message being read.
  struct Inbound {
    bool active = false;      // a message is partly read
    std::shared_ptr<Op> op;   // its receive, or
    uint64_t unexpected = 0;  // its buffer (0 with no op: dropped)
    uint64_t got = 0;
    uint64_t total = 0;
    Clock::time_point last_progress;  // of the message being read
  };
  struct Peer {
    int rank = -1;
    int local = -1;  // its local rank on our node, -1 on another node
    // The sends waiting for this peer and `gone`, under out_mu: callers
    // write a send to a node-mate that fits straight into the ring, in turn.
    std::unique_ptr<std::mutex> out_mu = std::make_unique<std::mutex>();
    std::deque<std::shared_ptr<Op>> sends;  // in issue order
    std::string gone;                       // why ops with this peer fail now ("" while it is fine)
    // Why sends to it fail now, though what it sent may still be arriving
    // (its end of our connection closed).
    std::string sends_closed;
    // Owned by the thread that reads from this peer: its net thread, or
    // for a node-mate whoever holds in_mu (the node thread, or a polling
    // caller).
    std::unique_ptr<std::mutex> in_mu = std::make_unique<std::mutex>();
    Inbound inbound;
    // Node-mates: the rings.
    ShmRing out, in;
    // Other nodes (net thread): our connection to it, and its to us.
    Socket out_socket;
    size_t header_sent = 0;  // of the send at the head of `sends`
    CellHeader out_header;
    Socket in_socket;
    CellHeader in_header;
    size_t header_got = 0;
    char* in_dst = nullptr;  // where the message being read goes (null: dropped)
    // Set by fail_peer/fail_peers on the reading thread: what still comes
    // from it is dropped (a stream cut in the middle of a message).
    bool dropping = false;
  };

  // ---- p2p_engine.cpp: ops, matching, failures ----
  Op* make_op(bool is_send, const at::Tensor& t, int peer, int tag, Done done, const Footprint* fp);
  // Registers a pending op (for drain and wait_conflicts); false, having
  // failed it, if the engine takes no more.
  bool admit(const std::shared_ptr<Op>& op);
  // Receives posted by callers, matched in the order posted; true if any.
  // On a caller's thread (`on_caller`) it leaves a failed engine's cleanup
  // to the node thread, and returns false.
  bool take_posts(bool on_caller);
  // One pass of what the node thread does for the node's rings (poll).
  void progress();
  // Wakes the node thread whether or not a caller polls (abort, stop, a
  // post it must fail).
  void wake_node();
  // match_mu_ held.  `gone`: why its peer is gone ("" if it is not): it
  // may still take a message that came before.
  void start_recv(std::shared_ptr<Op> op, const std::string& gone);
  // Fails the peer if the message being read from it has not moved for the
  // timeout (the thread that reads it).
  void check_inbound(Peer& peer, Clock::time_point now);
  // A message from `peer` begins (its header): where its payload goes, or
  // null (dropped).  Sets peer.inbound.  Any thread that reads from `peer`.
  char* begin_message(Peer& peer, const CellHeader& h);
  // Its last byte is in.
  void end_message(Peer& peer);
  void finish(const std::shared_ptr<Op>& op, std::exception_ptr error, int peer);
  // Fails every op with `peer` (and later ones) with `why`.  Only on the
  // thread that reads from it (a message in flight is its to drop).
  void fail_peer(Peer& peer, const std::string& why);
  // The node thread: receives waiting, node-mates' sends and messages.
  void fail_everything(const Error& why);
  // The sends to and messages from node-mates (`local`) or other nodes, on
  // the thread that moves them.
  void fail_peers(const Error& why, bool local);
  // Periodic, node thread: receives past the timeout, dead node-mates.
  void check(Clock::time_point now);
  // The head send of `peer` (out_mu held): fills `h` for its next `bytes`.
  static CellHeader header_of(const Op& op, uint64_t bytes);

  // ---- p2p_shm.cpp: the node thread ----
  void node_loop();
  // The messages waiting in a node-mate's ring; `peer.in_mu` held.
  bool pump_in(Peer& peer);
  bool pump_out(Peer& peer);
  // Writes cells of the peer's queued sends while the ring has room
  // (out_mu held); returns the sends that are whole.
  std::vector<std::shared_ptr<Op>> write_cells(Peer& peer);
  void ring(const Peer& peer);  // its doorbell
  // Whether a message or send with a node-mate is part-way through.
  bool streaming();

  // ---- p2p_tcp.cpp: the net thread ----
  void net_loop();
  void wake_net();
  void accept_peer();
  // Connects to `peer` for our first send to it; false (its ops failed) if
  // that fails.
  bool connect_peer(Peer& peer);
  bool read_from(Peer& peer);
  bool write_to(Peer& peer);

  Topology topo_;
  std::atomic<std::chrono::milliseconds> timeout_;  // set_timeout may change it
  std::chrono::microseconds wait_poll_;
  const bool huge_pages_;
  c10::intrusive_ptr<c10d::Store> store_;
  Secret secret_;
  std::unique_ptr<NodeArena> arena_;
  std::vector<Peer> peers_;  // by group rank (ours unused)
  SharedCounter* bell_ = nullptr;
  bool remote_ = false;  // the group spans several nodes: the net thread runs
  Socket listener_;
  int wake_fd_ = -1;  // eventfd: wakes the net thread

  // Matching, under match_mu_ (both threads read messages).
  std::mutex match_mu_;
  Matcher matcher_;
  std::unordered_map<uint64_t, std::shared_ptr<Op>> posted_;  // receives waiting, by id
  std::unordered_map<uint64_t, Unexpected> unexpected_;
  uint64_t next_message_ = 1;
  Clock::time_point next_check_{};

  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<Op>> posts_;  // receives not yet matched
  std::vector<std::shared_ptr<Op>> live_;  // pending ops, for wait_conflicts
  std::atomic<size_t> pending_{0};
  uint64_t next_op_ = 1;
  std::string failed_;  // abort()'s reason
  std::string closed_;
  ErrorKind failed_kind_ = ErrorKind::kBackend;
  std::atomic<bool> stop_{false};
  std::atomic<bool> down_{false};  // aborted or closed: no send is written on the caller
  CompletionPool completions_;
  std::thread node_thread_;
  std::thread net_thread_;
};

}  // namespace fairring

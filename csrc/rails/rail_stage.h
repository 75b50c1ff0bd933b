// The TCP rail: this rank's part of each chunk's rail walk (plan/rail_walk.h),
// as messages to and from the same local rank of every other node: pieces
// to their servers, the served reduction, the sums back; or shared shards.
// Runs on its own thread, many slices in flight, driven by poll() over
// non-blocking connections.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include "common/raw_bytes.h"
#include "plan/plan.h"
#include "rails/wire_codec.h"
#include "common/op_key.h"
#include "rails/rail_exchange.h"
#include "common/reduce_op.h"
#include "topology/topology.h"
#include "transport/channel.h"
#include "transport/tcp_mesh.h"

namespace c10d {
class Store;
}

namespace fairring {

// How many nodes' worth of a rail round's messages go out ahead of its
// receives (RailStage::hold); FAIRRING_RAIL_SEND_WINDOW overrides it.
constexpr int kRailSendWindow = 2;

struct Config;

// The element-wise reduction the server applies (the CPU kernel, or another
// device's).
using ReduceFn = std::function<void(c10::ScalarType, RedOp, void* out, const void* const* inputs, int n, int64_t count,
                                    int64_t divisor)>;

// Connections to dedicated reduction servers (servers/server_link.h), for
// all-reduces: the chunk goes to them in pieces, the sums come back.
struct ServerLinks {
  std::vector<std::unique_ptr<Channel>> channels;  // by server index
  int64_t max_chunk_bytes = 0;                     // the plan's bound on a chunk
};

class RailStage : public RailExchange {
 public:
  struct Callbacks {
    SliceDone slice_done;  // in slice order, from the stage's thread
    Failed failed;         // once, from the stage's thread
  };

  // `slots` slices can be in flight; no shard is larger than `max_shard_bytes`.
  RailStage(const Topology& topo, TcpMesh& mesh, ReduceFn reduce, Callbacks callbacks,
            std::chrono::milliseconds timeout, int slots, int64_t max_shard_bytes, WireDtype wire = WireDtype::kNone,
            ServerLinks servers = {}, int radix = 0);
  ~RailStage() override;
  // Starts the stage's thread.  Separate from the constructor: the thread
  // may call `callbacks.failed` at once, which reaches the owner's members
  // (the owner's pointer to this stage among them), so the owner starts it
  // once it is wired up.
  void start();

  void post(RailTask task) override;
  void abort(const Error& why) override;
  bool let_go(std::chrono::steady_clock::time_point until) override;
  // With no task in flight (the rank leaves its group): stops the stage's
  // thread and ends every stream, so that the peers see ours end now rather
  // than at destruction.  No task may be posted after it.
  void leave();
  // The group's new timeout, for the transfers' deadlines from now on.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_.store(timeout, std::memory_order_relaxed); }

 private:
  struct SliceState;
  struct HeldSend {  // a message a paced round has not posted yet
    Channel* ch;
    WireKind kind;
    int64_t count;
    const char* data;
  };
  void loop();
  void start(std::unique_ptr<SliceState> state);
  void serve(SliceState& s);
  // An all-reduce's chunk (the sums back to every node, in place) goes to
  // the reduction servers, if there are any.
  bool via_servers(const RailTask& t) const;
  void start_via_servers(SliceState& s, Clock::time_point now);
  // An all-reduce's chunk in levels (plan/rail_levels.h), when the stage
  // has several.
  bool in_levels(const SliceState& s) const;
  void start_levels(SliceState& s, Clock::time_point now);
  void send_level(SliceState& s, int level, bool sums);
  void advance_levels(SliceState& s);
  void reduce_level(SliceState& s, int level);
  // The bytes on the wire of a transfer of `count` elements of the slice.
  uint64_t message_bytes(const SliceState& s, int64_t count) const;
  // Posts the slice's next `kind` message of `count` elements to `ch`'s peer.
  void send(Channel& ch, SliceState& s, WireKind kind, int64_t count, const char* data);
  // Posts the receive of the slice's next `kind` message from `ch`'s peer
  // (checked against what we expect) into `into`.
  void expect(Channel& ch, SliceState& s, WireKind kind, int64_t count, char* into, std::function<void()> on_done,
              Clock::time_point now);
  // Pacing a round's sends (rail_stage.cpp): `sends` (to `to[i].node`, of
  // `peers` nodes) held in the order they go out, allowed ahead of the
  // round's `receives`.  Opens the round.
  void hold(SliceState& s, int round, std::vector<HeldSend> sends, const std::vector<Transfer>& to, size_t receives,
            int peers);
  void release_paced();
  void maybe_finish();
  void wake();
  void send_aborts(const Error& why);
  // From the stage's thread, once it reads and writes no task's memory any
  // more (it may still send an abort): let_go() returns.
  void released();
  // At destruction of a stage that did not fail: see rail_stage.cpp.
  void close_gracefully();

  Topology topo_;
  ReduceFn reduce_;
  Callbacks callbacks_;
  std::atomic<std::chrono::milliseconds> timeout_;           // set_timeout may change it
  std::chrono::milliseconds reduce_delay_{0};                // tests only (rail_stage.cpp)
  void delay_first_reduce();                                 // sleeps reduce_delay_ once
  int send_window_ = kRailSendWindow;                        // nodes; 0: no pacing (hold())
  std::vector<int> dims_;                                    // the all-reduce's levels (rail_levels.h)
  bool radix_by_node_count_ = true;                          // FAIRRING_RAIL_RADIX unset (chunk_in_levels)
  std::vector<std::unique_ptr<Channel>> clients_;            // by node; null for ours
  std::vector<std::unique_ptr<Channel>> servers_;            // by node; null for ours
  std::vector<std::unique_ptr<Channel>> reduction_servers_;  // by server index; empty: none
  int wake_fd_ = -1;
  bool left_ = false;  // leave() ran (under mu_)
  // Where the server receives the peers' pieces: per slot one area of
  // (N - 1) x the largest shard, allocated once.  Node n's shard lands at
  // its index among the other nodes x that shard in the direct walk; in
  // levels its piece of our part (level_bytes_[n] at most; none from a node
  // of no level of ours) at level_at_[n].  Both fill the area exactly
  // (rail_levels.h: the parts add up to N - 1 shards).
  std::vector<RawBytes> staging_;
  int64_t shard_bytes_ = 0;
  std::vector<int64_t> level_at_, level_bytes_;
  char* staged(const SliceState& s, int node) const;
  int64_t staged_bytes(const SliceState& s, int node) const;
  // Compressed rails (wire_codec.h), [slot][node], allocated once if a wire
  // dtype is set: our messages to each node (at our own node: the server's
  // rounded result), the contributions and the results as they arrive.
  WireCodec codec_;
  std::vector<std::vector<RawBytes>> wire_out_, wire_contrib_, wire_result_;
  // With reduction servers and a wire dtype, [slot][server]: our pieces to
  // each server and its sums as they arrive.
  std::vector<std::vector<RawBytes>> server_out_, server_in_;
  // Every channel, for polling, heartbeats, aborts and closing.
  std::vector<Channel*> all_channels() const;
  // For a timeout on a reduction server that is alive: the rail's ranks
  // whose heartbeats stopped, by name, or that none did.
  std::string silent_rail_peers(Clock::time_point now, std::chrono::milliseconds alive_window) const;
  char* wire_buf(std::vector<std::vector<RawBytes>>& bufs, const RailTask& t, int node) {
    return bufs[t.slice_seq % bufs.size()][node].data();
  }

  std::mutex mu_;
  std::deque<RailTask> incoming_;
  std::optional<Error> abort_reason_;
  bool stopping_ = false;
  bool released_ = false;  // see released()
  std::condition_variable released_cv_;

  std::deque<std::unique_ptr<SliceState>> active_;  // thread-only
  std::thread thread_;
};

// Host memory a RailStage of this config allocates per slot: the server's
// receive buffers and, with compressed rails, the wire buffers (0 on one
// node).  Both engines count it in their staging memory.
// `largest_node`: as max_shard_bytes reads it (0 on equal nodes).
int64_t rail_stage_bytes_per_slot(const Config& config, const PlanParams& params, int ranks_per_node, int num_nodes,
                                  int largest_node = 0);

// Connects this rank's rail (`mesh`: a TCP connection to the same local rank
// of every other node) and builds its stage (not started: RailStage::start),
// which reduces with the CPU kernels and sizes its buffers from the plan's
// bound.  Collective over the rail.
std::unique_ptr<RailStage> connect_rail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo,
                                        const Config& config, const PlanParams& params, const Secret& secret,
                                        RailStage::Callbacks callbacks, std::unique_ptr<TcpMesh>& mesh);

}  // namespace fairring

#include "rails/rail_stage.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include "common/deadlines.h"
#include "plan/rail_levels.h"
#include "plan/rail_walk.h"
#include "common/config.h"
#include "common/errors.h"
#include "common/fault_injection.h"
#include "kernels/reduce_cpu.h"
#include "rails/server_link.h"
#include "transport/tcp_mesh.h"
#include "common/error.h"

namespace fairring {

struct RailStage::SliceState {
  RailTask task;
  int contributions_missing = 0;  // as a server
  int results_missing = 0;        // as a client
  int sends_pending = 0;
  // The slice's rounds of sends, in order (the direct walk: its first round,
  // then the sums; in levels: each level's contributions, then the sums from
  // the last level up).  A round opens when its data is ready (hold()); until
  // then its channels are closed to later slices, whose messages must not
  // pass ours (a channel's peer matches them in slice order).
  struct Round {
    bool open = true;
    std::vector<const Channel*> channels;  // while not open
    // Paced sends (release_paced): those not yet posted, in the order they
    // go out; how many went out, how many of the round's receives are in,
    // and how many sends may be out beyond those received.
    std::deque<HeldSend> held;
    int posted = 0;
    int received = 0;
    int allowance = 0;
  };
  std::vector<Round> rounds;
  RailWalk walk;
  // In levels (rail_levels.h; empty: the direct walk): the levels, how many
  // are reduced, how many levels' sums went out, and the receives each level
  // still misses.
  std::vector<RailLevel> levels;
  int reduced = 0;
  int gathered = 0;
  std::vector<int> level_contributions_missing, level_results_missing;
  bool wire = false;        // compressed messages (codec_.applies)
  bool served = true;       // our shard reduced and sent (or nothing to serve)
  char* staging = nullptr;  // the slot's staging area (RailStage::staged)
};

namespace {

// The stage's loop wakes at least this often (heartbeats, deadlines).
constexpr int kLoopPollMs = 50;
// Heartbeats: a quarter of the alive grace (deadlines.h), within these; a
// peer is alive while its last heartbeat is at most two periods and this
// slack old.
constexpr auto kHeartbeatMin = std::chrono::milliseconds(10);
constexpr auto kHeartbeatMax = std::chrono::milliseconds(250);
constexpr auto kHeartbeatSlack = std::chrono::milliseconds(100);
// How long a failing stage tries to get its abort messages out, and how
// long a closing one reads what its peers still send (close_gracefully).
constexpr auto kAbortFlush = std::chrono::seconds(1);
constexpr auto kCloseDrain = std::chrono::seconds(1);
// A chunk goes to reduction servers in pieces of at least this much (one
// server for a small chunk): below it a message costs more than it moves.
constexpr int64_t kMinServerPieceBytes = 32 << 10;
// A large chunk goes to each server in this many pieces: a piece's sum comes
// back once every node's copy of it is in, so smaller pieces start the
// return trip sooner (at 1 MiB slices, one piece per server left 2 nodes
// 6% slower than the workers alone).
constexpr int kPiecesPerServer = 4;
// The largest piece start_via_servers cuts of a chunk in at most `pieces`:
// an even share, or one of fewer pieces of at least kMinServerPieceBytes;
// plus alignment.
int64_t max_server_piece_bytes(int64_t max_chunk_bytes, int64_t pieces) {
  return std::min(max_chunk_bytes, max_chunk_bytes / pieces + 2 * kMinServerPieceBytes) + 256;
}

WireHeader header_for(const RailTask& t, WireKind kind, uint64_t bytes) {
  WireHeader h;
  h.kind = static_cast<uint32_t>(kind);
  h.slice_seq = t.slice_seq;
  h.key = t.key;
  h.bytes = bytes;
  return h;
}

// Throws the message users see when ranks issued different collectives.
void check_match(const WireHeader& got, const WireHeader& want, int peer, int self) {
  check_same_op(want.key, self, got.key, peer);
  if (got.kind != want.kind || got.slice_seq != want.slice_seq || got.bytes != want.bytes) {
    throw_out_of_step(want.key, self, peer);
  }
}

// [slot][i] buffers of `bytes` each, for i < `count` but `skip` (-1: none),
// left untouched until used (common/raw_bytes.h).
void allocate_buffers(std::vector<std::vector<RawBytes>>& bufs, int slots, int64_t count, int64_t bytes,
                      int skip = -1) {
  bufs.assign(slots, std::vector<RawBytes>(count));
  for (auto& slot : bufs) {
    for (int64_t i = 0; i < count; ++i) {
      if (i != skip) slot[i].resize(bytes);
    }
  }
}
}  // namespace

RailStage::RailStage(const Topology& topo, TcpMesh& mesh, ReduceFn reduce, Callbacks callbacks,
                     std::chrono::milliseconds timeout, int slots, int64_t max_shard_bytes, WireDtype wire,
                     ServerLinks servers, int radix)
    : topo_(topo),
      reduce_(std::move(reduce)),
      callbacks_(std::move(callbacks)),
      timeout_(timeout),
      reduction_servers_(std::move(servers.channels)),
      codec_(wire) {
  radix_by_node_count_ = radix == 0;
  dims_ = rail_levels(topo_.num_nodes, radix > 0 ? radix : auto_rail_radix(topo_.num_nodes));
  shard_bytes_ = max_shard_bytes;
  staging_.resize(slots);
  for (RawBytes& area : staging_) area.resize((topo_.num_nodes - 1) * max_shard_bytes);
  level_at_.assign(topo_.num_nodes, 0);
  level_bytes_.assign(topo_.num_nodes, 0);
  int64_t at = 0;
  for (int n = 0; n < topo_.num_nodes && dims_.size() > 1; ++n) {
    // A peer of level l sends us pieces of shards_per_part(l) shards.
    const int l = n == topo_.node ? -1 : level_of_peer(dims_, topo_.node, n);
    if (l < 0) continue;
    level_at_[n] = at;
    level_bytes_[n] = max_shard_bytes * shards_per_part(dims_, l);
    at += level_bytes_[n];
  }
  if (wire != WireDtype::kNone) {  // wire_bytes_per_slot() counts these
    const int64_t bytes = WireCodec::buffer_bytes(max_shard_bytes);
    allocate_buffers(wire_out_, slots, topo_.num_nodes, bytes);
    allocate_buffers(wire_contrib_, slots, topo_.num_nodes, bytes, topo_.node);
    allocate_buffers(wire_result_, slots, topo_.num_nodes, bytes, topo_.node);
  }
  if (wire != WireDtype::kNone && !reduction_servers_.empty()) {
    const int64_t pieces = static_cast<int64_t>(reduction_servers_.size()) * kPiecesPerServer;
    const int64_t piece = max_server_piece_bytes(servers.max_chunk_bytes, pieces);
    allocate_buffers(server_out_, slots, pieces, WireCodec::buffer_bytes(piece));
    allocate_buffers(server_in_, slots, pieces, WireCodec::buffer_bytes(piece));
  }
  const std::vector<int> rail = topo_.rail();
  clients_.resize(topo_.num_nodes);
  servers_.resize(topo_.num_nodes);
  for (int n = 0; n < topo_.num_nodes; ++n) {
    if (n == topo_.node) continue;
    clients_[n] = std::make_unique<Channel>(mesh.take_client(rail[n]), rail[n]);
    servers_[n] = std::make_unique<Channel>(mesh.take_server(rail[n]), rail[n]);
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error(ErrorKind::kBackend, "fairring: eventfd failed");
  // FAIRRING_TEST_RAIL_REDUCE_DELAY_MS: the server sleeps that long before
  // its first reduction of a shard into the caller's chunk (tests: a rail
  // thread slow, descheduled or stopped where it writes into an op's memory
  // while the op fails).
  reduce_delay_ = test_delay("FAIRRING_TEST_RAIL_REDUCE_DELAY_MS");
  // FAIRRING_RAIL_SEND_WINDOW=<nodes> (0: no pacing): how far a round's
  // sends run ahead of its receives (hold()).
  if (const char* w = std::getenv("FAIRRING_RAIL_SEND_WINDOW")) send_window_ = std::atoi(w);
}

void RailStage::start() {
  thread_ = std::thread([this] {
    loop();
    released();
  });
}

RailStage::~RailStage() {
  leave();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RailStage::leave() {
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return;
    left_ = true;
    stopping_ = true;
    failed = abort_reason_.has_value();
  }
  wake();
  if (thread_.joinable()) thread_.join();
  if (!failed) close_gracefully();
}

void RailStage::close_gracefully() {
  // Every channel ends its stream and reads what its peer still sends (it
  // stops its heartbeats once it sees our end), for at most kCloseDrain: our
  // last message of an op the peer is still finishing must not be reset away.
  std::vector<int> fds;
  for (Channel* ch : all_channels()) fds.push_back(ch->fd());
  end_streams(fds, Clock::now() + kCloseDrain);
}

std::string RailStage::silent_rail_peers(Clock::time_point now, std::chrono::milliseconds alive_window) const {
  // While the servers reduce, the rail's own connections carry only
  // heartbeats: a rank whose heartbeats stopped is the one the server waits for.
  std::string silent;
  for (const auto& ch : clients_) {
    if (!ch || now - ch->last_peer_alive < alive_window) continue;
    const bool never = ch->last_peer_alive == Clock::time_point{};
    silent += std::string(silent.empty() ? "" : "; ") + ch->peer_name() + " has sent no heartbeat " +
              (never ? "at all" : "for " + seconds(std::chrono::duration<double>(now - ch->last_peer_alive).count()));
  }
  return silent.empty() ? "every rank of this rail is alive: has one of them not issued the collective?"
                        : silent + ": is it stalled, or its machine gone?";
}

std::vector<Channel*> RailStage::all_channels() const {
  std::vector<Channel*> out;
  for (auto* list : {&clients_, &servers_, &reduction_servers_}) {
    for (auto& ch : *list) {
      if (ch) out.push_back(ch.get());
    }
  }
  return out;
}

void RailStage::wake() {
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof(one));
  (void)r;
}

void RailStage::post(RailTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) throw Error(ErrorKind::kBackend, "fairring: a rail task posted after this rank left the group");
    incoming_.push_back(std::move(task));
  }
  wake();
}

void RailStage::abort(const Error& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_reason_) abort_reason_.emplace(why);
  }
  wake();
}

void RailStage::released() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  released_cv_.notify_all();
}

bool RailStage::let_go(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  return released_cv_.wait_until(lock, until, [&] { return released_; });
}

void RailStage::send_aborts(const Error& why) {
  for (Channel* ch : all_channels()) ch->queue_abort(why);
  // Nothing left reads or writes a task's memory: the pipeline may hand the
  // failed ops' tensors back while the aborts go out.
  released();
  const auto deadline = Clock::now() + kAbortFlush;
  for (Channel* ch : all_channels()) ch->flush_abort(deadline);
}

// One chunk's walk (plan/rail_walk.h) as messages: round one's sends go on
// the client channel of their node and its receives come in on the server
// channel; round two the other way.  Each channel's receives are posted in
// slice order, so a message is matched against the slice it belongs to.
// Compressed rails: the messages are encoded/decoded next to the data
// (wire_codec.h says which values are rounded).
void RailStage::start(std::unique_ptr<SliceState> st) {
  SliceState& s = *st;
  const RailTask& t = s.task;
  s.wire = codec_.applies(t);
  const auto now = Clock::now();
  if (via_servers(t)) {
    start_via_servers(s, now);
    active_.push_back(std::move(st));
    return;
  }
  if (in_levels(s)) {
    start_levels(s, now);
    active_.push_back(std::move(st));
    release_paced();
    return;
  }
  s.walk = t.walk(topo_.node, topo_.num_nodes);
  // Round one goes now; the sums once we served (serve()).
  s.rounds.resize(2);
  if (s.walk.reduces) {
    s.rounds[1].open = false;
    for (const Transfer& x : s.walk.sum_sends) s.rounds[1].channels.push_back(servers_[x.node].get());
  }
  const c10::ScalarType dtype = t.dtype();
  std::vector<HeldSend> sends;
  for (const Transfer& x : s.walk.sends) {
    const char* data = t.shard_at(x.shard);
    if (s.wire && x.count > 0) {
      char* msg = wire_buf(wire_out_, t, x.node);
      if (message_bytes(s, x.count) > wire_out_[0][x.node].size()) {
        throw Error(ErrorKind::kBackend, "fairring: shard larger than its wire buffer (plan bound violated)");
      }
      codec_.encode(dtype, data, x.count, msg);
      data = msg;
    }
    sends.push_back({clients_[x.node].get(), WireKind::kContribution, x.count, data});
  }
  hold(s, 0, std::move(sends), s.walk.sends, s.walk.receives.size(), topo_.num_nodes - 1);
  for (const Transfer& x : s.walk.sum_receives) {
    char* where = t.shard_at(x.shard);
    const bool decode = s.wire && x.count > 0;
    char* into = decode ? wire_buf(wire_result_, t, x.node) : where;
    expect(
        *clients_[x.node], s, WireKind::kResult, x.count, into,
        [this, &s, decode, into, where, x] {
          if (decode) codec_.decode(s.task.dtype(), into, x.count, where);
          --s.results_missing;
          ++s.rounds[1].received;
        },
        now);
    ++s.results_missing;
  }
  if (s.walk.pattern != RailPattern::kReduce) {
    for (const Transfer& x : s.walk.receives) {
      expect(
          *servers_[x.node], s, WireKind::kContribution, x.count, t.landing_at(x.shard),
          [&s] {
            --s.contributions_missing;
            ++s.rounds[0].received;
          },
          now);
      ++s.contributions_missing;
    }
  } else if (s.walk.reduces) {
    // Serving: every peer's piece of our shard into its staging buffer;
    // once all are in, the reduction and round two (serve()).
    s.served = false;
    s.staging = staging_[t.slice_seq % staging_.size()].data();
    const int64_t elem = c10::elementSize(dtype);
    for (const Transfer& x : s.walk.receives) {
      if (x.count * elem > staged_bytes(s, x.node)) {
        throw Error(ErrorKind::kBackend, "fairring: shard larger than its staging buffer (plan bound violated)");
      }
      const bool decode = s.wire && x.count > 0;
      char* into = decode ? wire_buf(wire_contrib_, t, x.node) : staged(s, x.node);
      expect(
          *servers_[x.node], s, WireKind::kContribution, x.count, into,
          [this, &s, decode, into, x] {
            if (decode) codec_.decode(s.task.dtype(), into, x.count, staged(s, x.node));
            ++s.rounds[0].received;
            if (--s.contributions_missing == 0) serve(s);
          },
          now);
      ++s.contributions_missing;
    }
  }
  active_.push_back(std::move(st));
  release_paced();
}

// Sending every message of a round at once puts N - 1 flows on each link at
// a time (and twice that with the sums): with many nodes they overflow the
// queues on the way (a switch port, the sender's own qdisc), and the drops
// and retransmission timeouts of the slowest flow hold up every slice.  So
// a round's messages go out nearest node first (node + 1, node + 2, ...,
// rotating, so that each node hears from node - 1 first), at most
// send_window_ nodes' worth ahead of the round's receives: every node
// receives from about as many nodes as it sends to, so the receives say how
// far the exchange has come, and a link carries a few flows each way instead
// of N - 1.  With N - 1 <= send_window_ everything goes at once, as before.
void RailStage::hold(SliceState& s, int round, std::vector<HeldSend> sends, const std::vector<Transfer>& to,
                     size_t receives, int peers) {
  const int n = topo_.num_nodes;
  SliceState::Round& r = s.rounds[round];
  r.open = true;
  r.channels.clear();
  std::vector<size_t> order(sends.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto distance = [&](size_t i) { return (to[i].node - topo_.node + n) % n; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance(a) < distance(b); });
  for (size_t i : order) r.held.push_back(sends[i]);
  const int total = static_cast<int>(sends.size());
  // Messages per node (an exchange has several), and sends no receive
  // stands for (a node that serves nothing only sends).
  const int per_node = std::max(1, total / std::max(1, peers));
  const int unmatched = std::max(0, total - static_cast<int>(receives));
  r.allowance = send_window_ > 0 && send_window_ < peers ? send_window_ * per_node + unmatched : total;
}

// Posts the held sends their round's receives allow, slice by slice in
// order: a channel's messages must leave in slice order (its peer matches
// them so), so none passes a send an earlier slice still holds for it.
void RailStage::release_paced() {
  std::vector<const Channel*> blocked;
  for (auto& st : active_) {
    SliceState& s = *st;
    for (SliceState::Round& r : s.rounds) {
      if (!r.open) {
        blocked.insert(blocked.end(), r.channels.begin(), r.channels.end());
        continue;
      }
      auto& q = r.held;
      while (!q.empty() && r.posted < r.allowance + r.received &&
             std::find(blocked.begin(), blocked.end(), q.front().ch) == blocked.end()) {
        const HeldSend h = q.front();
        q.pop_front();
        send(*h.ch, s, h.kind, h.count, h.data);
        ++r.posted;
      }
      for (const auto& h : q) blocked.push_back(h.ch);
    }
  }
}

bool RailStage::via_servers(const RailTask& t) const {
  return !reduction_servers_.empty() && t.pattern == RailPattern::kReduce && t.back_to == kBackToAll &&
         t.pieces.empty() && t.result == nullptr;
}

// The chunk (its shards are contiguous and in order) cut into pieces, up to
// kPiecesPerServer for each server, each sent to a server in turn and its
// sum received into place.
// Every rank of the rail cuts the same chunk the same way, and the slice
// number rotates which server takes the first piece, so that small ops
// (one piece) spread over the servers too.  Round one and two are the
// servers' business: we only send and receive.
void RailStage::start_via_servers(SliceState& s, Clock::time_point now) {
  const RailTask& t = s.task;
  const c10::ScalarType dtype = t.dtype();
  const int64_t esize = c10::elementSize(dtype);
  int64_t total = 0;
  for (const Range& r : t.shards) total += r.count;
  const int m = static_cast<int>(reduction_servers_.size());
  const int parts =
      static_cast<int>(std::clamp<int64_t>(total * esize / kMinServerPieceBytes, 1, int64_t{m} * kPiecesPerServer));
  const std::vector<Range> pieces = split_even(total, parts, std::max<int64_t>(1, 64 / esize));
  const int slot = static_cast<int>(t.slice_seq % std::max<size_t>(server_out_.size(), 1));
  for (int p = 0; p < parts; ++p) {
    const Range r = pieces[p];
    if (r.count == 0) continue;
    const int server = static_cast<int>((p + t.slice_seq) % m);
    Channel& ch = *reduction_servers_[server];
    char* where = t.chunk + r.offset * esize;
    const char* data = where;
    char* into = where;
    if (s.wire) {
      char* out = server_out_[slot][p].data();
      char* in = server_in_[slot][p].data();
      if (static_cast<int64_t>(WireCodec::message_bytes(r.count)) > static_cast<int64_t>(server_out_[slot][p].size())) {
        throw Error(ErrorKind::kBackend, "fairring: piece larger than its wire buffer (plan bound violated)");
      }
      codec_.encode(dtype, where, r.count, out);
      data = out;
      into = in;
    }
    send(ch, s, WireKind::kContribution, r.count, data);
    const bool decode = s.wire;
    expect(
        ch, s, WireKind::kResult, r.count, into,
        [this, &s, decode, into, where, r] {
          if (decode) codec_.decode(s.task.dtype(), into, r.count, where);
          --s.results_missing;
        },
        now);
    ++s.results_missing;
  }
}

void RailStage::delay_first_reduce() {
  if (reduce_delay_.count() > 0) {
    std::this_thread::sleep_for(reduce_delay_);
    reduce_delay_ = std::chrono::milliseconds(0);  // once
  }
}

char* RailStage::staged(const SliceState& s, int node) const {
  if (!s.levels.empty()) return s.staging + level_at_[node];
  return s.staging + (node < topo_.node ? node : node - 1) * shard_bytes_;
}

int64_t RailStage::staged_bytes(const SliceState& s, int node) const {
  return s.levels.empty() ? shard_bytes_ : level_bytes_[node];
}

bool RailStage::in_levels(const SliceState& s) const {
  // An all-reduce's chunk with a shard for every node, in place, neither
  // compressed nor of a 16-bit (or smaller) float: each level before the
  // last stores its partial sums in the chunk's dtype, which would round
  // them once per level, and in float16 overflow where the direct exchange's
  // single sum in float does not (8 x 10,000 is past float16's 65,504).
  const RailTask& t = s.task;
  return dims_.size() > 1 && !s.wire && !c10::isReducedFloatingType(t.dtype()) && t.pattern == RailPattern::kReduce &&
         t.back_to == kBackToAll && t.pieces.empty() && t.result == nullptr &&
         chunk_in_levels(t.shards, topo_.num_nodes, c10::elementSize(t.dtype()), radix_by_node_count_);
}

// The chunk's all-reduce in levels (plan/rail_levels.h).  Every receive of
// the slice is posted now, in slice order like the direct walk's: level l's
// pieces of our part from its group into staging, and the group's sums of
// their parts into place (a part's sum comes back only after its reducer
// had our piece of it, so our send of that piece is done by then).  Level
// l's sends go once level l - 1 is reduced, the sums from the last level up,
// each level's once the level below it is complete.
void RailStage::start_levels(SliceState& s, Clock::time_point now) {
  const RailTask& t = s.task;
  s.levels = walk_levels(dims_, t.shards, topo_.node, topo_.num_nodes);
  const int L = static_cast<int>(s.levels.size());
  const int64_t elem = c10::elementSize(t.dtype());
  s.staging = staging_[t.slice_seq % staging_.size()].data();
  s.served = false;
  s.rounds.assign(2 * L, SliceState::Round{});
  s.level_contributions_missing.assign(L, 0);
  s.level_results_missing.assign(L, 0);
  for (int l = 0; l < L; ++l) {
    const RailLevel& lv = s.levels[l];
    const Range mine = lv.parts[lv.me];
    SliceState::Round& contributions = s.rounds[l];
    SliceState::Round& sums = s.rounds[2 * L - 1 - l];
    contributions.open = sums.open = false;
    for (int v = 0; v < static_cast<int>(lv.group.size()); ++v) {
      if (v == lv.me) continue;
      const int p = lv.group[v];
      if (mine.count * elem > staged_bytes(s, p)) {
        throw Error(ErrorKind::kBackend, "fairring: part larger than its staging buffer (plan bound violated)");
      }
      expect(
          *servers_[p], s, WireKind::kContribution, mine.count, staged(s, p),
          [this, &s, l] {
            ++s.rounds[l].received;
            --s.contributions_missing;
            if (--s.level_contributions_missing[l] == 0) advance_levels(s);
          },
          now);
      const Range theirs = lv.parts[v];
      expect(
          *clients_[p], s, WireKind::kResult, theirs.count, t.chunk + theirs.offset * elem,
          [this, &s, l, L] {
            ++s.rounds[2 * L - 1 - l].received;
            --s.results_missing;
            if (--s.level_results_missing[l] == 0) advance_levels(s);
          },
          now);
      ++s.contributions_missing;
      ++s.level_contributions_missing[l];
      ++s.results_missing;
      ++s.level_results_missing[l];
      contributions.channels.push_back(clients_[p].get());
      sums.channels.push_back(servers_[p].get());
    }
  }
  send_level(s, 0, /*sums=*/false);
}

// Level l's pieces to their reducers, or our sum of level l's part to the
// level's group.
void RailStage::send_level(SliceState& s, int l, bool sums) {
  const RailTask& t = s.task;
  const RailLevel& lv = s.levels[l];
  const int L = static_cast<int>(s.levels.size());
  const int64_t elem = c10::elementSize(t.dtype());
  std::vector<HeldSend> sends;
  std::vector<Transfer> to;
  for (int v = 0; v < static_cast<int>(lv.group.size()); ++v) {
    if (v == lv.me) continue;
    const int p = lv.group[v];
    const Range r = lv.parts[sums ? lv.me : v];
    Channel* ch = sums ? servers_[p].get() : clients_[p].get();
    sends.push_back({ch, sums ? WireKind::kResult : WireKind::kContribution, r.count, t.chunk + r.offset * elem});
    to.push_back(Transfer{p, v, r.count});
  }
  const size_t receives = to.size();
  const int peers = static_cast<int>(to.size());
  hold(s, sums ? 2 * L - 1 - l : l, std::move(sends), to, receives, peers);
}

// What the receives just in allow: reduce the levels whose pieces are all
// in, in order, each opening the next level's sends; after the last, the
// sums go back a level at a time.
void RailStage::advance_levels(SliceState& s) {
  const int L = static_cast<int>(s.levels.size());
  while (s.reduced < L && s.level_contributions_missing[s.reduced] == 0) {
    reduce_level(s, s.reduced);
    if (++s.reduced < L) {
      send_level(s, s.reduced, /*sums=*/false);
    } else {
      s.served = true;
      send_level(s, L - 1, /*sums=*/true);
      s.gathered = 1;
    }
  }
  while (s.reduced == L && s.gathered < L && s.level_results_missing[L - s.gathered] == 0) {
    send_level(s, L - 1 - s.gathered, /*sums=*/true);
    ++s.gathered;
  }
}

// Level l's part, ours, reduced in place from the group's pieces in digit
// order; AVG divides only at the last level (with no divisor it only adds).
void RailStage::reduce_level(SliceState& s, int l) {
  const RailTask& t = s.task;
  delay_first_reduce();
  const RailLevel& lv = s.levels[l];
  const Range mine = lv.parts[lv.me];
  if (mine.count == 0) return;
  char* own = t.chunk + mine.offset * static_cast<int64_t>(c10::elementSize(t.dtype()));
  std::vector<const void*> inputs(lv.group.size());
  for (size_t v = 0; v < lv.group.size(); ++v) {
    inputs[v] = static_cast<int>(v) == lv.me ? own : staged(s, lv.group[v]);
  }
  const bool last = l + 1 == static_cast<int>(s.levels.size());
  reduce_(t.dtype(), t.op(), own, inputs.data(), static_cast<int>(inputs.size()), mine.count, last ? t.divisor : 0);
}

// Every piece of our shard is in: reduce them in node order, then round two.
void RailStage::serve(SliceState& s) {
  const RailTask& t = s.task;
  delay_first_reduce();
  const int64_t count = s.walk.served_count;
  char* own = t.shard_at(topo_.node);
  char* out = t.result ? t.result : own;
  std::vector<const void*> inputs(topo_.num_nodes);
  for (int n = 0; n < topo_.num_nodes; ++n) {
    inputs[n] = (n == topo_.node) ? own : staged(s, n);
  }
  reduce_(t.dtype(), t.op(), out, inputs.data(), topo_.num_nodes, count, t.divisor);
  const char* result = out;
  if (s.wire && s.walk.sends_sum_data()) {
    // Rounded once; our own copy gets the very bits we send.
    char* msg = wire_buf(wire_out_, t, topo_.node);
    codec_.encode(t.dtype(), out, count, msg);
    codec_.decode(t.dtype(), msg, count, out);
    result = msg;
  }
  std::vector<HeldSend> sums;
  for (const Transfer& x : s.walk.sum_sends)
    sums.push_back({servers_[x.node].get(), WireKind::kResult, x.count, result});
  hold(s, 1, std::move(sums), s.walk.sum_sends, s.walk.sum_receives.size(), topo_.num_nodes - 1);
  s.served = true;
}

uint64_t RailStage::message_bytes(const SliceState& s, int64_t count) const {
  if (count == 0) return 0;  // an empty transfer is an empty message, compressed or not
  if (s.wire) return WireCodec::message_bytes(count);
  return static_cast<uint64_t>(count * static_cast<int64_t>(c10::elementSize(s.task.dtype())));
}

void RailStage::send(Channel& ch, SliceState& s, WireKind kind, int64_t count, const char* data) {
  Channel::Send send;
  send.header = header_for(s.task, kind, message_bytes(s, count));
  send.data = data;
  send.on_done = [&s] { --s.sends_pending; };
  ++s.sends_pending;
  ch.post_send(std::move(send));
}

void RailStage::expect(Channel& ch, SliceState& s, WireKind kind, int64_t count, char* into,
                       std::function<void()> on_done, Clock::time_point now) {
  if (!ch.has_pending_recv()) ch.last_recv_progress = now;
  WireHeader want = header_for(s.task, kind, message_bytes(s, count));
  const int peer = ch.peer_rank();
  const int self = topo_.rank;
  ch.post_recv({[want, into, peer, self](const WireHeader& got) -> void* {
                  check_match(got, want, peer, self);
                  return into;
                },
                std::move(on_done)});
}

void RailStage::maybe_finish() {
  while (!active_.empty()) {
    SliceState& s = *active_.front();
    const bool sent = std::all_of(s.rounds.begin(), s.rounds.end(),
                                  [](const SliceState::Round& r) { return r.open && r.held.empty(); });
    if (!(sent && s.served && s.contributions_missing == 0 && s.results_missing == 0 && s.sends_pending == 0)) break;
    const uint64_t seq = s.task.slice_seq;
    active_.pop_front();
    callbacks_.slice_done(seq);
  }
}

void RailStage::loop() {
  // Named, so that a stuck rail shows in `top -H`, gdb and /proc/<pid>/task.
  pthread_setname_np(pthread_self(), "fairring-rail");
  std::vector<struct pollfd> fds;
  const std::vector<Channel*> chans = all_channels();
  auto next_heartbeat = Clock::now();
  try {
    for (;;) {
      // Read every round: set_timeout() governs the waits from now on.
      // Later than a local peer's deadline: see deadlines.h.
      const std::chrono::milliseconds timeout = timeout_.load(std::memory_order_relaxed);
      const auto remote_timeout = rail_peer_deadline(timeout);
      // A silent peer whose rail thread still runs (its heartbeats arrive) is
      // not stuck on the network: it has not issued the collective, or it
      // waits for another rank (a node-mate, or a rail peer of its own) that
      // is the real culprit.  Its deadline is deferred a little, so that the
      // rank that sees the culprit itself names it first and its abort
      // reaches us, still before the network-wide deadline (half of the gap).
      const auto alive_grace = (network_deadline(timeout) - remote_timeout) / 2;
      const auto heartbeat_every = std::clamp<std::chrono::milliseconds>(
          std::chrono::duration_cast<std::chrono::milliseconds>(alive_grace / 4), kHeartbeatMin, kHeartbeatMax);
      const auto alive_window = 2 * heartbeat_every + kHeartbeatSlack;
      std::deque<RailTask> fresh;
      std::optional<Error> abort_reason;
      bool done = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        abort_reason = abort_reason_;
        done = !abort_reason && stopping_ && incoming_.empty() && active_.empty();
        fresh.swap(incoming_);
      }
      // Stopping with no task left: still send what is queued (a result this
      // rank served, which a peer still waits for) before the streams end.
      if (done && std::none_of(chans.begin(), chans.end(), [](Channel* ch) { return ch->data_pending(); })) return;
      if (abort_reason) {
        send_aborts(*abort_reason);
        return;
      }
      for (auto& t : fresh) {
        auto st = std::make_unique<SliceState>();
        st->task = std::move(t);
        start(std::move(st));
      }
      for (Channel* ch : chans) {
        if (ch->parked() && ch->has_pending_recv()) ch->progress_recv();
      }
      release_paced();

      if (Clock::now() >= next_heartbeat) {
        next_heartbeat = Clock::now() + heartbeat_every;
        for (Channel* ch : chans) ch->post_heartbeat();
      }

      fds.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      for (Channel* ch : chans) {
        short ev = 0;
        if (ch->wants_read()) ev |= POLLIN;
        if (ch->wants_write()) ev |= POLLOUT;
        // A parked channel is not read until its receive is posted; leaving
        // it out keeps a hang-up from waking poll() over and over meanwhile
        // (the hang-up is seen once it is read again).
        fds.push_back({ev != 0 ? ch->fd() : -1, ev, 0});
      }
      // Try sending first: most of the time the socket has room.
      for (Channel* ch : chans) {
        if (ch->wants_write()) ch->progress_send();
      }
      maybe_finish();
      int r = poll(fds.data(), fds.size(), kLoopPollMs);
      if (r < 0 && errno != EINTR) throw Error(ErrorKind::kBackend, "fairring: poll failed");
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        ssize_t n = read(wake_fd_, &v, sizeof(v));
        (void)n;
      }
      for (size_t i = 0; i < chans.size(); ++i) {
        const short re = fds[i + 1].revents;
        if ((re & (POLLIN | POLLERR | POLLHUP)) && chans[i]->wants_read()) chans[i]->progress_recv();
        if (re & (POLLOUT | POLLERR | POLLHUP)) chans[i]->progress_send();
      }
      release_paced();  // what the receives just in allow
      maybe_finish();

      const auto now = Clock::now();
      // What is being waited for: the oldest slice in flight's collective.
      const std::string op =
          active_.empty()
              ? std::string("a collective")
              : std::string(collective_name(static_cast<Collective>(active_.front()->task.key.collective))) + " #" +
                    std::to_string(active_.front()->task.key.number);
      for (Channel* ch : chans) {
        const std::string& peer = ch->peer_name();
        const bool alive = now - ch->last_peer_alive < alive_window;
        const auto deadline = remote_timeout + (alive ? alive_grace : std::chrono::milliseconds(0));
        // Alive but silent: what it is waiting for is elsewhere.
        const std::string why_alive = !alive ? ""
                                      : ch->peer_noun() == "server"
                                          ? " (the server is alive: it waits for another rank of this rail; " +
                                                silent_rail_peers(now, alive_window) + ")"
                                          : " (its rail is alive: has it issued the collective, or is it waiting for "
                                            "another rank?)";
        if (ch->has_pending_recv() && now - ch->last_recv_progress > deadline) {
          throw Error(ErrorKind::kBackend,
                      "Timed out after " +
                          seconds(std::chrono::duration<double>(now - ch->last_recv_progress).count()) + ": " + peer +
                          " sent nothing while this rank waited for its part of " + op +
                          (alive ? why_alive
                                 : " (is " + peer + " stalled" +
                                       (ch->peer_noun() == "server" ? "" : ", did it skip the collective") +
                                       ", or is the network between us down?)"));
        }
        // A peer that stops reading (a stuck receive path, or a network that
        // drops what we send) leaves our send stuck in a full socket buffer;
        // the kernel reports nothing for many minutes.  This matters when
        // nothing is expected back from that peer any more (the results of
        // the last slice), which the receive check above does not cover.
        if (ch->data_pending() && now - ch->last_send_progress > deadline) {
          throw Error(ErrorKind::kBackend,
                      "Timed out after " +
                          seconds(std::chrono::duration<double>(now - ch->last_send_progress).count()) + ": " + peer +
                          " took none of the data this rank sent it during " + op +
                          (alive ? why_alive : " (is " + peer + " stalled, or is the network between us down?)"));
        }
      }
    }
  } catch (const PeerAborted& e) {
    // The peer already told everyone it can reach; pass it on to the rest.
    callbacks_.failed(e);
    send_aborts(e);
  } catch (const std::exception& e) {
    const Error why = attributed(topo_.rank, e);
    callbacks_.failed(why);
    send_aborts(why);
  }
}

int64_t rail_stage_bytes_per_slot(const Config& config, const PlanParams& params, int ranks_per_node, int num_nodes,
                                  int largest_node) {
  if (num_nodes < 2) return 0;
  const int64_t shard = max_shard_bytes(params, ranks_per_node, num_nodes, largest_node);
  int64_t servers = 0;  // the wire buffers to and from reduction servers (the constructor's bound)
  if (uses_reduction_servers(config, num_nodes) && config.wire_dtype != "none") {
    const int64_t chunk = max_shard_bytes(params, ranks_per_node, 1);
    const int64_t pieces = int64_t{config.reduction_servers} * kPiecesPerServer;
    servers = 2 * pieces * WireCodec::buffer_bytes(max_server_piece_bytes(chunk, pieces));
  }
  return (num_nodes - 1) * shard + wire_bytes_per_slot(config.wire_dtype, shard, num_nodes) + servers;
}

std::unique_ptr<RailStage> connect_rail(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo,
                                        const Config& config, const PlanParams& params, const Secret& secret,
                                        RailStage::Callbacks callbacks, std::unique_ptr<TcpMesh>& mesh) {
  std::vector<int> peers;
  for (int r : topo.rail()) {
    if (r != topo.rank) peers.push_back(r);
  }
  mesh = std::make_unique<TcpMesh>(store, topo.rank, peers, secret, config.socket_ifname, config.timeout);
  mesh->connect();
  const WireDtype wire = wire_dtype_from_name(config.wire_dtype);
  ServerLinks servers;
  if (uses_reduction_servers(config, topo.num_nodes)) {
    servers.max_chunk_bytes = max_shard_bytes(params, topo.rails, 1);
    servers.channels = connect_reduction_servers(
        store, topo, config, wire,
        max_server_piece_bytes(servers.max_chunk_bytes, int64_t{config.reduction_servers} * kPiecesPerServer));
  }
  return std::make_unique<RailStage>(topo, *mesh, reduce_cpu, std::move(callbacks), config.timeout, config.parallelism,
                                     max_shard_bytes(params, topo.rails, topo.num_nodes, topo.largest_node), wire,
                                     std::move(servers), config.rail_radix);
}

}  // namespace fairring

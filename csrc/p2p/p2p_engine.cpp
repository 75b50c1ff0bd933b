// The engine's ops, matching and failures, shared by its two transports
// (p2p_shm.cpp within the node, p2p_tcp.cpp between nodes).
#include "p2p/p2p_engine.h"

#include <sys/eventfd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/dtype_name.h"
#include "common/errors.h"
#include "kernels/first_touch.h"
#include "node/wait_check.h"
#include "p2p/p2p_op.h"

namespace fairring {

namespace {

// Each direction between two local ranks: 8 cells of 128 KiB.  A cell holds
// a small message whole; a large one streams through, the sender filling a
// cell while the receiver empties another.
constexpr int64_t kCellBytes = 128 * 1024;
constexpr int64_t kRingBytes = 8 * kCellBytes;

// A receive of at most kWatchedBytes from a node-mate (a message that is
// whole in one cell) promises that a thread looks at the rings within
// kWatch (P2pEngine::recv).
constexpr uint64_t kWatchedBytes = 64 * 1024;
constexpr auto kWatch = std::chrono::microseconds(500);

// Why a message does not fit a receive ("" if it does).
std::string mismatch(int32_t dtype, int64_t numel, const CellHeader& h, int src) {
  if (h.dtype == dtype && h.numel == numel) return "";
  const std::string tag = h.tag >= 0 ? " with tag " + std::to_string(h.tag) : " for this exchange";
  return "rank " + std::to_string(src) + " sent " + what_tensor(h.dtype, h.numel) + tag +
         ", but the receiving tensor holds " + what_tensor(dtype, numel) + "; the message was dropped";
}

std::string addr_key(int rank) { return "addr/" + std::to_string(rank); }

}  // namespace

P2pEngine::P2pEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid,
                     const Secret& secret, const std::string& ifname, std::chrono::milliseconds timeout,
                     std::chrono::microseconds wait_poll, bool huge_pages)
    : topo_(topo),
      timeout_(timeout),
      wait_poll_(wait_poll),
      huge_pages_(huge_pages),
      store_(c10::make_intrusive<c10d::PrefixStore>("fairring-p2p/", store)),
      secret_(secret),
      completions_(topo.rank) {
  const int k = topo.ranks_per_node;
  // Slot d, area s: the ring from local rank s to d; counters (d, s, 0|1):
  // its head and tail; counter (x, x, 0): local rank x's doorbell.
  arena_ = std::make_unique<NodeArena>(store_, topo, job_uid + "-p2p", k, k > 1 ? kRingBytes : 0, timeout, 2);
  const int me = topo.local_rank;
  peers_.resize(topo.size);
  for (int r = 0; r < topo.size; ++r) {
    Peer& peer = peers_[r];
    peer.rank = r;
    const auto [node, local] = topo.place_of(r);
    if (node != topo.node) {
      remote_ = true;
      continue;
    }
    peer.local = local;
    if (r == topo.rank) continue;
    peer.out = ShmRing(arena_->input_area(local, me), kRingBytes, kCellBytes, &arena_->counter(local, me, 0),
                       &arena_->counter(local, me, 1));
    peer.in = ShmRing(arena_->input_area(me, local), kRingBytes, kCellBytes, &arena_->counter(me, local, 0),
                      &arena_->counter(me, local, 1));
  }
  bell_ = &arena_->counter(me, me, 0);
  if (remote_) {
    const std::string address = ifname.empty() ? default_address() : interface_address(ifname);
    int port = 0;
    listener_ = listen_on(address, &port);
    listener_.set_nonblocking();
    const std::string value = address + ":" + std::to_string(port);
    store_->set(addr_key(topo.rank), std::vector<uint8_t>(value.begin(), value.end()));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw Error(ErrorKind::kBackend, "fairring: eventfd failed for the point-to-point engine");
    net_thread_ = std::thread([this] { net_loop(); });
  }
  node_thread_ = std::thread([this] { node_loop(); });
}

P2pEngine::~P2pEngine() {
  stop_.store(true);
  wake_node();
  if (node_thread_.joinable()) node_thread_.join();
  if (net_thread_.joinable()) {
    wake_net();
    net_thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

P2pEngine::Op* P2pEngine::make_op(bool is_send, const at::Tensor& t, int peer, int tag, Done done,
                                  const Footprint* fp) {
  auto* op = new Op();
  op->is_send = is_send;
  op->peer = peer;
  op->tag = tag;
  op->t = t;
  op->data = static_cast<char*>(t.data_ptr());
  op->bytes = t.numel() * t.element_size();
  op->dtype = static_cast<int32_t>(t.scalar_type());
  op->numel = t.numel();
  if (fp) {
    op->fp = *fp;
  } else if (is_send) {
    op->fp.read(t);
  } else {
    op->fp.write(t);
  }
  op->done = std::move(done);
  return op;
}

CellHeader P2pEngine::header_of(const Op& op, uint64_t bytes) {
  CellHeader h;
  h.tag = op.tag;
  h.dtype = op.dtype;
  h.numel = op.numel;
  h.total = op.bytes;
  h.offset = op.moved;
  h.bytes = bytes;
  return h;
}

void P2pEngine::send(const at::Tensor& t, int peer_rank, int tag, Done done, const Footprint* fp) {
  std::shared_ptr<Op> op(make_op(true, t, peer_rank, tag, std::move(done), fp));
  Peer& peer = peers_[peer_rank];
  std::unique_lock<std::mutex> lock(*peer.out_mu);
  if (!peer.gone.empty() || !peer.sends_closed.empty()) {
    const std::string gone = !peer.gone.empty() ? peer.gone : peer.sends_closed;
    lock.unlock();
    op->done(op->error(ErrorKind::kNetwork, gone), peer_rank, true);
    return;
  }
  if (peer.local >= 0) {
    const uint64_t cells = std::max<uint64_t>(1, (op->bytes + peer.out.payload_bytes() - 1) / peer.out.payload_bytes());
    if (peer.sends.empty() && !down_.load() && peer.out.free_cells() >= cells) {
      // Nothing before it and room for all of it: written here and now, with
      // no engine thread to wake on this side.
      peer.sends.push_back(op);
      write_cells(peer);
      lock.unlock();
      ring(peer);
      op->done(nullptr, peer_rank, /*on_caller=*/true);
      return;
    }
  }
  if (!admit(op)) return;
  peer.sends.push_back(std::move(op));
  lock.unlock();
  if (peer.local >= 0) {
    counter_bump(*bell_);
  } else {
    wake_net();
  }
}

void P2pEngine::recv(const at::Tensor& t, int peer, int tag, Done done, const Footprint* fp, bool waited) {
  std::shared_ptr<Op> op(make_op(false, t, peer, tag, std::move(done), fp));
  if (!admit(op)) return;
  const bool watch = waited && op->bytes <= kWatchedBytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts_.push_back(std::move(op));
  }
  // Matched here: a message already in takes it now, one still to come
  // finds it posted (its sender's doorbell wakes whoever reads it).
  if (!take_posts(/*on_caller=*/true)) {
    wake_node();
  } else if (watch) {
    // A small message from a node-mate: its caller usually waits at once
    // (dist.recv) and moves it itself (poll), so its arrival need not wake
    // the node thread; if nobody waits (irecv), the node thread looks
    // within kWatch.
    doorbell_watch(*bell_, kWatch);
  }
}

bool P2pEngine::admit(const std::shared_ptr<Op>& op) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string why = !failed_.empty() ? "this process group failed earlier: " + failed_ : closed_;
  if (why.empty()) {
    op->id = next_op_++;
    op->last_progress = Clock::now();
    live_.push_back(op);
    pending_.fetch_add(1);
    return true;
  }
  const ErrorKind kind = failed_.empty() ? ErrorKind::kBackend : failed_kind_;
  lock.unlock();
  op->done(std::make_exception_ptr(Error(kind, "fairring: " + op->describe() + " not started: " + why)), op->peer,
           true);
  return false;
}

void P2pEngine::finish(const std::shared_ptr<Op>& op, std::exception_ptr error, int peer) {
  op->done(error, peer, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(std::find(live_.begin(), live_.end(), op));
    pending_.fetch_sub(1);
  }
  idle_cv_.notify_all();
}

bool P2pEngine::wait_conflicts(const Footprint& fp) {
  if (pending_.load() == 0 || fp.empty()) return false;
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  for (;;) {
    const bool conflict = std::any_of(live_.begin(), live_.end(),
                                      [&](const std::shared_ptr<Op>& op) { return fp.conflicts_with(op->fp); });
    if (!conflict) return waited;
    waited = true;
    idle_cv_.wait(lock);
  }
}

void P2pEngine::abort(const Error& why) {
  down_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.empty()) {
      failed_ = why.what();
      failed_kind_ = why.kind();
    }
  }
  wake_node();
  if (remote_) wake_net();
}

void P2pEngine::close(const std::string& why) {
  down_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = why;
}

void P2pEngine::leave(const std::string& why) {
  if (arena_) arena_->leave(topo_.local_rank, 0, why);
}

bool P2pEngine::drain(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, limit, [&] { return pending_.load() == 0; });
}

bool P2pEngine::take_posts(bool on_caller) {
  std::deque<std::shared_ptr<Op>> posts;
  std::string failed;
  ErrorKind kind;
  // Held from taking the posts to matching them: two threads taking posts
  // match them in the order they were posted.
  std::unique_lock<std::mutex> lock(match_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = failed_;
    kind = failed_kind_;
    if (failed.empty()) posts.swap(posts_);
  }
  if (!failed.empty()) {
    lock.unlock();
    if (on_caller) return false;
    fail_everything(Error(kind, failed));  // the posts too
    return false;
  }
  for (auto& op : posts) {
    std::string gone;
    if (op->peer != kAnySource) {
      Peer& peer = peers_[op->peer];
      std::lock_guard<std::mutex> out(*peer.out_mu);
      gone = peer.gone;
    }
    start_recv(op, gone);
  }
  return !posts.empty();
}

void P2pEngine::start_recv(std::shared_ptr<Op> op, const std::string& gone) {
  const auto msg = matcher_.post_recv(op->id, op->peer, op->tag);
  if (!msg) {
    if (!gone.empty()) {  // nothing it sent before it went is for this receive
      matcher_.cancel_recv(op->id);
      finish(op, op->error(ErrorKind::kNetwork, gone), op->peer);
      return;
    }
    posted_[op->id] = std::move(op);
    return;
  }
  auto it = unexpected_.find(*msg);
  Unexpected& u = it->second;
  const std::string bad = mismatch(op->dtype, op->numel, u.meta, u.src);
  if (!bad.empty()) {
    finish(op, op->error(ErrorKind::kInvalidArgument, bad), u.src);
    if (u.whole) {
      unexpected_.erase(it);
    } else {
      u.dropped = true;
    }
    return;
  }
  if (!u.whole) {
    u.taker = std::move(op);  // the rest is on its way
    return;
  }
  if (op->bytes > 0) std::memcpy(op->data, u.data(), op->bytes);
  const int src = u.src;
  unexpected_.erase(it);
  finish(op, nullptr, src);
}

char* P2pEngine::begin_message(Peer& peer, const CellHeader& h) {
  std::lock_guard<std::mutex> lock(match_mu_);
  Inbound& in = peer.inbound;
  in = Inbound{};
  in.active = true;
  in.total = h.total;
  in.last_progress = Clock::now();
  const uint64_t msg = next_message_++;
  const auto recv = matcher_.arrive(msg, peer.rank, h.tag);
  if (recv) {
    auto it = posted_.find(*recv);
    std::shared_ptr<Op> op = std::move(it->second);
    posted_.erase(it);
    const std::string bad = mismatch(op->dtype, op->numel, h, peer.rank);
    if (!bad.empty()) {
      finish(op, op->error(ErrorKind::kInvalidArgument, bad), peer.rank);
      return nullptr;  // dropped as it comes
    }
    op->last_progress = Clock::now();
    in.op = std::move(op);
    return in.op->data;
  }
  Unexpected u;
  u.src = peer.rank;
  u.meta = h;
  u.buffer = HostBlock(static_cast<int64_t>(h.total));
  // A new block's pages fault in as the message is written: huge pages
  // where the machine allows and the group asks (a warm one is left as it is).
  if (huge_pages_) advise_fresh_memory(u.data(), u.buffer.bytes());
  char* data = u.data();
  unexpected_.emplace(msg, std::move(u));
  in.unexpected = msg;
  return data;
}

void P2pEngine::end_message(Peer& peer) {
  std::lock_guard<std::mutex> lock(match_mu_);
  Inbound& in = peer.inbound;
  in.active = false;
  if (in.op) {
    auto op = std::move(in.op);
    finish(op, nullptr, peer.rank);
  } else if (in.unexpected) {
    auto it = unexpected_.find(in.unexpected);
    Unexpected& u = it->second;
    u.whole = true;
    if (u.taker) {
      auto op = std::move(u.taker);
      if (op->bytes > 0) std::memcpy(op->data, u.data(), op->bytes);
      unexpected_.erase(it);
      finish(op, nullptr, peer.rank);
    } else if (u.dropped) {
      unexpected_.erase(it);
    }
  }
  in.unexpected = 0;
}

void P2pEngine::check(Clock::time_point now) {
  const auto seconds_since = [&](Clock::time_point t) {
    return seconds(std::chrono::duration<double>(now - t).count());
  };
  std::vector<std::pair<Peer*, std::string>> gone;  // node-mates that exited or left, and how
  {
    std::lock_guard<std::mutex> lock(match_mu_);
    // Receives that no message reached within the timeout.
    std::vector<std::shared_ptr<Op>> late;
    for (auto& [id, op] : posted_) {
      if (now - op->last_progress > timeout_.load()) late.push_back(op);
    }
    for (auto& op : late) {
      matcher_.cancel_recv(op->id);
      posted_.erase(op->id);
      finish(op, op->error(ErrorKind::kBackend, "Timed out: no message arrived in " + seconds_since(op->last_progress)),
             op->peer);
    }
    const bool any_source =
        std::any_of(posted_.begin(), posted_.end(), [](const auto& e) { return e.second->peer == kAnySource; });
    // Node-mates that exited while we wait on them (net peers show as a
    // closed connection instead).
    for (int r : topo_.local_ranks()) {
      if (r == topo_.rank) continue;
      Peer& peer = peers_[r];
      std::lock_guard<std::mutex> out(*peer.out_mu);
      if (!peer.gone.empty()) continue;
      const bool waits_on_it =
          !peer.sends.empty() || peer.inbound.active || any_source ||
          std::any_of(posted_.begin(), posted_.end(), [&](const auto& e) { return e.second->peer == peer.rank; });
      if (!waits_on_it) continue;
      // A node-mate that left its group sends and receives nothing more.
      std::string why = arena_->left_before(peer.local, 0);
      if (!why.empty()) {
        why = "rank " + std::to_string(peer.rank) + " left the group (" + why + "): Connection closed by peer";
      } else if (!process_alive(arena_->control().pids[peer.local])) {
        why = "rank " + std::to_string(peer.rank) + " (pid " + std::to_string(arena_->control().pids[peer.local]) +
              ") exited: Connection closed by peer";
      }
      if (!why.empty()) gone.emplace_back(&peer, std::move(why));
    }
  }
  for (auto& [peer, why] : gone) {
    std::lock_guard<std::mutex> in(*peer->in_mu);
    pump_in(*peer);  // what it sent before it went is whole in the ring
    fail_peer(*peer, why);
  }
  // Sends to node-mates and messages from them that stopped moving (a peer
  // that is stalled; the net thread watches its own).
  for (int r : topo_.local_ranks()) {
    if (r == topo_.rank) continue;
    Peer& peer = peers_[r];
    std::lock_guard<std::mutex> in(*peer.in_mu);
    check_inbound(peer, now);
    Clock::time_point oldest{};
    {
      std::lock_guard<std::mutex> out(*peer.out_mu);
      if (!peer.gone.empty()) continue;
      if (!peer.sends.empty()) oldest = peer.sends.front()->last_progress;
    }
    if (oldest != Clock::time_point{} && now - oldest > timeout_.load()) {
      fail_peer(peer, "Timed out: rank " + std::to_string(peer.rank) + " took none of its bytes for " +
                          seconds_since(oldest) + " (is it stalled?)");
    }
  }
}

void P2pEngine::check_inbound(Peer& peer, Clock::time_point now) {
  const Inbound& in = peer.inbound;
  if (!in.active || peer.dropping || now - in.last_progress <= timeout_.load()) return;
  fail_peer(peer, "Timed out: rank " + std::to_string(peer.rank) + " sent no more of a message for " +
                      seconds(std::chrono::duration<double>(now - in.last_progress).count()) +
                      " (is it stalled, or did its send fail?)");
}

void P2pEngine::fail_peer(Peer& peer, const std::string& why) {
  std::lock_guard<std::mutex> lock(match_mu_);
  std::deque<std::shared_ptr<Op>> sends;
  {
    std::lock_guard<std::mutex> out(*peer.out_mu);
    if (peer.gone.empty()) peer.gone = why;
    sends.swap(peer.sends);
  }
  for (auto& op : sends) finish(op, op->error(ErrorKind::kNetwork, why), peer.rank);
  // A message that will never be whole; a receive that took it fails.
  if (peer.inbound.op) {
    auto op = std::move(peer.inbound.op);
    finish(op, op->error(ErrorKind::kNetwork, why), peer.rank);
  }
  if (peer.inbound.active && peer.inbound.unexpected) {
    auto it = unexpected_.find(peer.inbound.unexpected);
    if (it->second.taker) finish(it->second.taker, it->second.taker->error(ErrorKind::kNetwork, why), peer.rank);
    matcher_.cancel_message(peer.inbound.unexpected);
    unexpected_.erase(it);
  }
  peer.inbound = Inbound{};
  peer.in_dst = nullptr;
  peer.dropping = true;
  // Another node's rank (we are its net thread): a message of ours cut short
  // ends there as a closed connection, not as silence.
  if (peer.local < 0) peer.out_socket.close();
  // Receives from it; from any source only once no peer is left.
  bool none_left = true;
  for (Peer& q : peers_) {
    if (q.rank == topo_.rank || &q == &peer) continue;
    std::lock_guard<std::mutex> out(*q.out_mu);
    if (q.gone.empty()) none_left = false;
  }
  std::vector<std::shared_ptr<Op>> fail;
  for (auto& [id, op] : posted_) {
    if (op->peer == peer.rank || (op->peer == kAnySource && none_left)) fail.push_back(op);
  }
  for (auto& op : fail) {
    matcher_.cancel_recv(op->id);
    posted_.erase(op->id);
    finish(op, op->error(ErrorKind::kNetwork, why), op->peer);
  }
}

void P2pEngine::fail_peers(const Error& why, bool local) {
  for (Peer& peer : peers_) {
    if (peer.rank == topo_.rank || (peer.local >= 0) != local) continue;
    std::unique_lock<std::mutex> in(*peer.in_mu, std::defer_lock);
    if (local) in.lock();
    std::deque<std::shared_ptr<Op>> sends;
    {
      std::lock_guard<std::mutex> out(*peer.out_mu);
      if (peer.gone.empty()) peer.gone = why.what();
      sends.swap(peer.sends);
    }
    for (auto& op : sends) finish(op, op->error(why.kind(), why.what()), peer.rank);
    std::lock_guard<std::mutex> lock(match_mu_);
    if (peer.inbound.op) {
      auto op = std::move(peer.inbound.op);
      finish(op, op->error(why.kind(), why.what()), peer.rank);
    }
    peer.in_dst = nullptr;
    peer.dropping = true;                 // what still comes is dropped
    if (!local) peer.out_socket.close();  // (the net thread: see fail_peer)
  }
}

void P2pEngine::fail_everything(const Error& why) {
  std::deque<std::shared_ptr<Op>> posts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts.swap(posts_);
  }
  for (auto& op : posts) finish(op, op->error(why.kind(), why.what()), op->peer);
  fail_peers(why, /*local=*/true);
  std::lock_guard<std::mutex> lock(match_mu_);
  for (auto& [id, u] : unexpected_) {
    if (u.taker) finish(u.taker, u.taker->error(why.kind(), why.what()), u.src);
    u.taker = nullptr;
  }
  for (auto& [id, op] : posted_) {
    matcher_.cancel_recv(id);
    finish(op, op->error(why.kind(), why.what()), op->peer);
  }
  posted_.clear();
}

}  // namespace fairring

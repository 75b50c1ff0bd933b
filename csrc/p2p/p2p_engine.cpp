#include "p2p/p2p_engine.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/dtype_name.h"
#include "common/errors.h"
#include "common/fault_injection.h"
#include "node/wait_check.h"

namespace fairring {

namespace {

// Each direction between two local ranks: 8 cells of 128 KiB.  A cell holds
// a small message whole; a large one streams through, the sender filling a
// cell while the receiver empties another.
constexpr int64_t kCellBytes = 128 * 1024;
constexpr int64_t kRingBytes = 8 * kCellBytes;
// How long the engine thread spins for more work before it sleeps: about a
// round trip of a small message, so that a ping-pong keeps it awake.
constexpr auto kSpin = std::chrono::microseconds(50);
// How often it checks for dead peers and timeouts.
constexpr auto kCheckEvery = std::chrono::milliseconds(100);

std::string what_tensor(int32_t dtype, int64_t numel) {
  return std::to_string(numel) + " element(s) of " + dtype_name(static_cast<c10::ScalarType>(dtype));
}

}  // namespace

struct P2pEngine::Op {
  bool is_send = false;
  int peer = kAnySource;  // group rank
  int tag = 0;
  at::Tensor t;
  char* data = nullptr;
  uint64_t bytes = 0;
  int32_t dtype = 0;
  int64_t numel = 0;
  Footprint fp;
  Done done;
  uint64_t id = 0;
  uint64_t moved = 0;
  Clock::time_point last_progress;

  std::string describe() const {
    const std::string who = peer == kAnySource ? "any rank" : "rank " + std::to_string(peer);
    return std::string(is_send ? "send to " : "recv from ") + who + " (tag " + std::to_string(tag) + ", " +
           what_tensor(dtype, numel) + ")";
  }
};

struct P2pEngine::Unexpected {
  int src = -1;
  CellHeader meta;
  std::unique_ptr<char[]> data;
  uint64_t got = 0;
  std::shared_ptr<Op> taker;  // the receive that matched it before it was whole
  bool dropped = false;       // matched by a receive that did not fit: dropped once whole
};

P2pEngine::P2pEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid,
                     std::chrono::milliseconds timeout)
    : topo_(topo), timeout_(timeout), completions_(topo.rank) {
  const int k = topo.ranks_per_node;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fairring-p2p/", store);
  // Slot d, area s: the ring from local rank s to d; counters (d, s, 0|1):
  // its head and tail; counter (x, x, 0): local rank x's doorbell.
  arena_ = std::make_unique<NodeArena>(prefixed, topo, job_uid + "-p2p", k, kRingBytes, timeout, 2);
  const int me = topo.local_rank;
  peers_.resize(k);
  for (int p = 0; p < k; ++p) {
    peers_[p].rank = topo.local_ranks()[p];
    if (p == me) continue;
    peers_[p].out = ShmRing(arena_->input_area(p, me), kRingBytes, kCellBytes, &arena_->counter(p, me, 0),
                            &arena_->counter(p, me, 1));
    peers_[p].in = ShmRing(arena_->input_area(me, p), kRingBytes, kCellBytes, &arena_->counter(me, p, 0),
                           &arena_->counter(me, p, 1));
  }
  bell_ = &arena_->counter(me, me, 0);
  thread_ = std::thread([this] { loop(); });
}

P2pEngine::~P2pEngine() {
  stop_.store(true);
  counter_bump(*bell_);
  if (thread_.joinable()) thread_.join();
}

bool P2pEngine::reaches(int peer) const {
  return peer >= 0 && peer < topo_.size && peer != topo_.rank && topo_.place_of(peer).first == topo_.node;
}

int P2pEngine::local_of(int rank) const { return topo_.place_of(rank).second; }

void P2pEngine::ring(int local) { counter_bump(arena_->counter(local, local, 0)); }

void P2pEngine::send(const at::Tensor& t, int peer_rank, int tag, Done done) {
  auto op = std::make_shared<Op>();
  op->is_send = true;
  op->peer = peer_rank;
  op->tag = tag;
  op->t = t;
  op->data = static_cast<char*>(t.data_ptr());
  op->bytes = t.numel() * t.element_size();
  op->dtype = static_cast<int32_t>(t.scalar_type());
  op->numel = t.numel();
  op->fp.read(t);
  op->done = std::move(done);
  const int local = local_of(peer_rank);
  Peer& peer = peers_[local];
  std::unique_lock<std::mutex> lock(*peer.out_mu);
  const uint64_t cells = std::max<uint64_t>(1, (op->bytes + peer.out.payload_bytes() - 1) / peer.out.payload_bytes());
  if (peer.sends.empty() && peer.gone.empty() && !down_.load() && peer.out.free_cells() >= cells) {
    // Nothing before it and room for all of it: written here and now, with
    // no engine thread to wake on this side.
    peer.sends.push_back(op);
    write_sends(peer);
    lock.unlock();
    ring(local);
    op->done(nullptr, peer_rank, /*on_caller=*/true);
    return;
  }
  if (!peer.gone.empty()) {
    const std::string gone = peer.gone;
    lock.unlock();
    op->done(std::make_exception_ptr(Error(ErrorKind::kNetwork, "fairring: " + op->describe() + ": " + gone)),
             peer_rank, true);
    return;
  }
  if (!admit(op)) return;
  peer.sends.push_back(std::move(op));
  lock.unlock();
  counter_bump(*bell_);
}

void P2pEngine::recv(const at::Tensor& t, int peer, int tag, Done done) {
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->tag = tag;
  op->t = t;
  op->data = static_cast<char*>(t.data_ptr());
  op->bytes = t.numel() * t.element_size();
  op->dtype = static_cast<int32_t>(t.scalar_type());
  op->numel = t.numel();
  op->fp.write(t);
  op->done = std::move(done);
  post(std::move(op));
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

void P2pEngine::post(std::shared_ptr<Op> op) {
  if (!admit(op)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts_.push_back(std::move(op));
  }
  counter_bump(*bell_);
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
  counter_bump(*bell_);
}

void P2pEngine::close(const std::string& why) {
  down_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = why;
}

bool P2pEngine::drain(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, limit, [&] { return pending_.load() == 0; });
}

void P2pEngine::loop() {
  const int me = topo_.local_rank;
  for (;;) {
    const uint32_t seen = bell_->value.load(std::memory_order_acquire);
    if (stop_.load()) {
      fail_everything(Error(ErrorKind::kBackend, "this process group was destroyed"));
      return;
    }
    bool moved = take_posts();
    for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
      if (p == me) continue;
      moved |= pump_in(p);
      moved |= pump_out(p);
    }
    const auto now = Clock::now();
    if (now >= next_check_) {
      next_check_ = now + kCheckEvery;
      if (pending_.load() > 0) check(now);
    }
    if (!moved) counter_wait_change(*bell_, seen, kSpin, kCheckEvery);
  }
}

bool P2pEngine::take_posts() {
  std::deque<std::shared_ptr<Op>> posts;
  std::string failed;
  ErrorKind kind;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts.swap(posts_);
    failed = failed_;
    kind = failed_kind_;
  }
  if (!failed.empty()) {
    for (auto& op : posts)
      finish(op, std::make_exception_ptr(Error(kind, "fairring: " + op->describe() + ": " + failed)), op->peer);
    fail_everything(Error(kind, failed));
    return !posts.empty();
  }
  for (auto& op : posts) {  // receives (sends go straight to their peer)
    if (op->peer != kAnySource) {
      Peer& peer = peers_[local_of(op->peer)];
      if (!peer.gone.empty()) {
        finish(op,
               std::make_exception_ptr(Error(ErrorKind::kNetwork, "fairring: " + op->describe() + ": " + peer.gone)),
               op->peer);
        continue;
      }
    }
    start_recv(op);
  }
  return !posts.empty();
}

namespace {
// Why a message does not fit a receive ("" if it does).
std::string mismatch(int32_t dtype, int64_t numel, const CellHeader& h, int src) {
  if (h.dtype == dtype && h.numel == numel) return "";
  return "rank " + std::to_string(src) + " sent " + what_tensor(h.dtype, h.numel) + " with tag " +
         std::to_string(h.tag) + ", but the receiving tensor holds " + what_tensor(dtype, numel) +
         "; the message was dropped";
}
}  // namespace

void P2pEngine::start_recv(std::shared_ptr<Op> op) {
  const auto msg = matcher_.post_recv(op->id, op->peer, op->tag);
  if (!msg) {
    posted_[op->id] = std::move(op);
    return;
  }
  auto it = unexpected_.find(*msg);
  Unexpected& u = it->second;
  const std::string bad = mismatch(op->dtype, op->numel, u.meta, u.src);
  if (!bad.empty()) {
    finish(op, std::make_exception_ptr(Error(ErrorKind::kInvalidArgument, "fairring: " + op->describe() + ": " + bad)),
           u.src);
    if (u.got == u.meta.total) {
      unexpected_.erase(it);
    } else {
      u.dropped = true;
    }
    return;
  }
  if (u.got < u.meta.total) {
    u.taker = std::move(op);  // the rest is on its way
    return;
  }
  if (op->bytes > 0) std::memcpy(op->data, u.data.get(), op->bytes);
  const int src = u.src;
  unexpected_.erase(it);
  finish(op, nullptr, src);
}

void P2pEngine::begin_message(int local, const CellHeader& h) {
  Peer& peer = peers_[local];
  Inbound& in = peer.inbound;
  in = Inbound{};
  in.active = true;
  in.total = h.total;
  const uint64_t msg = next_message_++;
  const auto recv = matcher_.arrive(msg, peer.rank, h.tag);
  if (recv) {
    auto it = posted_.find(*recv);
    std::shared_ptr<Op> op = std::move(it->second);
    posted_.erase(it);
    const std::string bad = mismatch(op->dtype, op->numel, h, peer.rank);
    if (!bad.empty()) {
      finish(op,
             std::make_exception_ptr(Error(ErrorKind::kInvalidArgument, "fairring: " + op->describe() + ": " + bad)),
             peer.rank);
      return;  // dropped as it comes
    }
    op->last_progress = Clock::now();
    in.op = std::move(op);
    return;
  }
  Unexpected u;
  u.src = peer.rank;
  u.meta = h;
  u.data.reset(new char[std::max<uint64_t>(h.total, 1)]);
  unexpected_.emplace(msg, std::move(u));
  in.unexpected = msg;
}

bool P2pEngine::pump_in(int local) {
  Peer& peer = peers_[local];
  bool moved = false;
  while (const CellHeader* h = peer.in.peek()) {
    Inbound& in = peer.inbound;
    if (!in.active) begin_message(local, *h);
    char* dst = nullptr;
    if (in.op) {
      dst = in.op->data;
      in.op->last_progress = Clock::now();
    } else if (in.unexpected) {
      dst = unexpected_.at(in.unexpected).data.get();
    }
    if (dst && h->bytes > 0) std::memcpy(dst + h->offset, peer.in.payload(h), h->bytes);
    in.got += h->bytes;
    peer.in.consume();
    moved = true;
    if (in.got < in.total) continue;
    in.active = false;
    if (in.op) {
      auto op = std::move(in.op);
      finish(op, nullptr, peer.rank);
    } else if (in.unexpected) {
      auto it = unexpected_.find(in.unexpected);
      Unexpected& u = it->second;
      u.got = u.meta.total;
      if (u.taker) {
        auto op = std::move(u.taker);
        if (op->bytes > 0) std::memcpy(op->data, u.data.get(), op->bytes);
        unexpected_.erase(it);
        finish(op, nullptr, peer.rank);
      } else if (u.dropped) {
        unexpected_.erase(it);
      }
    }
    in.unexpected = 0;
  }
  if (moved) ring(local);  // its sender may be waiting for a free cell
  return moved;
}

std::vector<std::shared_ptr<P2pEngine::Op>> P2pEngine::write_sends(Peer& peer) {
  // FAIRRING_TEST_P2P_EXIT_AFTER=<bytes>: the process exits (code 57) in the
  // middle of a send, once it has written that many bytes of it (tests of a
  // peer that dies mid-transfer).
  static const int64_t exit_after = test_bytes("FAIRRING_TEST_P2P_EXIT_AFTER");
  std::vector<std::shared_ptr<Op>> whole;
  while (!peer.sends.empty() && peer.out.can_write()) {
    const std::shared_ptr<Op>& op = peer.sends.front();
    CellHeader h;
    h.tag = op->tag;
    h.dtype = op->dtype;
    h.numel = op->numel;
    h.total = op->bytes;
    h.offset = op->moved;
    h.bytes = std::min<uint64_t>(peer.out.payload_bytes(), op->bytes - op->moved);
    peer.out.write(h, op->data + op->moved);
    op->moved += h.bytes;
    op->last_progress = Clock::now();
    if (exit_after >= 0 && op->moved >= static_cast<uint64_t>(exit_after) && op->moved < op->bytes) _exit(57);
    if (op->moved == op->bytes) {
      whole.push_back(std::move(peer.sends.front()));
      peer.sends.pop_front();
    }
  }
  return whole;
}

bool P2pEngine::pump_out(int local) {
  Peer& peer = peers_[local];
  std::vector<std::shared_ptr<Op>> whole;
  bool moved;
  {
    std::unique_lock<std::mutex> lock(*peer.out_mu);
    if (peer.sends.empty() || !peer.out.can_write()) return false;
    whole = write_sends(peer);
    moved = true;
  }
  ring(local);
  for (auto& op : whole) finish(op, nullptr, peer.rank);
  return moved;
}

void P2pEngine::check(Clock::time_point now) {
  const int me = topo_.local_rank;
  const auto seconds_since = [&](Clock::time_point t) {
    return seconds(std::chrono::duration<double>(now - t).count());
  };
  // Receives that no message reached within the timeout.
  std::vector<std::shared_ptr<Op>> late;
  for (auto& [id, op] : posted_) {
    if (now - op->last_progress > timeout_) late.push_back(op);
  }
  for (auto& op : late) {
    matcher_.cancel_recv(op->id);
    posted_.erase(op->id);
    finish(op,
           std::make_exception_ptr(Error(ErrorKind::kBackend, "fairring: Timed out: " + op->describe() +
                                                                  ": no message arrived in " +
                                                                  seconds_since(op->last_progress))),
           op->peer);
  }
  for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
    if (p == me) continue;
    Peer& peer = peers_[p];
    if (!peer.gone.empty()) continue;
    Clock::time_point oldest_send{};  // of the send at the head of the queue (none: the epoch)
    {
      std::lock_guard<std::mutex> lock(*peer.out_mu);
      if (!peer.sends.empty()) oldest_send = peer.sends.front()->last_progress;
    }
    const bool sending = oldest_send != Clock::time_point{};
    const bool waits_on_it =
        sending || peer.inbound.active || std::any_of(posted_.begin(), posted_.end(), [&](const auto& e) {
          return e.second->peer == peer.rank || e.second->peer == kAnySource;
        });
    if (!waits_on_it) continue;
    const int pid = arena_->control().pids[p];
    if (!process_alive(pid)) {
      pump_in(p);  // what it sent before it exited is whole in the ring
      fail_peer(p, "rank " + std::to_string(peer.rank) + " (pid " + std::to_string(pid) + ") exited");
      continue;
    }
    if (sending && now - oldest_send > timeout_) {
      fail_peer(p, "Timed out: rank " + std::to_string(peer.rank) + " took none of its bytes for " +
                       seconds_since(oldest_send) + " (is it stalled?)");
    } else if (peer.inbound.op && now - peer.inbound.op->last_progress > timeout_) {
      fail_peer(p, "Timed out: rank " + std::to_string(peer.rank) + " sent no more of the message for " +
                       seconds_since(peer.inbound.op->last_progress) + " (is it stalled?)");
    }
  }
}

void P2pEngine::fail_peer(int local, const std::string& why) {
  Peer& peer = peers_[local];
  const auto error = [&](const Op& op) {
    return std::make_exception_ptr(Error(ErrorKind::kNetwork, "fairring: " + op.describe() + ": " + why));
  };
  std::deque<std::shared_ptr<Op>> sends;
  {
    std::lock_guard<std::mutex> lock(*peer.out_mu);
    peer.gone = why;
    sends.swap(peer.sends);
  }
  for (auto& op : sends) finish(op, error(*op), peer.rank);
  if (peer.inbound.op) {
    auto op = std::move(peer.inbound.op);
    finish(op, error(*op), peer.rank);
  }
  if (peer.inbound.active && peer.inbound.unexpected) {
    // A part of a message that will never be whole; a receive that took it fails.
    auto it = unexpected_.find(peer.inbound.unexpected);
    if (it->second.taker) finish(it->second.taker, error(*it->second.taker), peer.rank);
    unexpected_.erase(it);
  }
  peer.inbound = Inbound{};
  // Receives from it; from any source only once no local peer is left.
  const bool none_left =
      std::all_of(peers_.begin(), peers_.end(), [&](const Peer& q) { return q.rank == topo_.rank || !q.gone.empty(); });
  std::vector<std::shared_ptr<Op>> fail;
  for (auto& [id, op] : posted_) {
    if (op->peer == peer.rank || (op->peer == kAnySource && none_left)) fail.push_back(op);
  }
  for (auto& op : fail) {
    matcher_.cancel_recv(op->id);
    posted_.erase(op->id);
    finish(op, error(*op), op->peer);
  }
}

void P2pEngine::fail_everything(const Error& why) {
  const auto error = [&](const Op& op) {
    return std::make_exception_ptr(Error(why.kind(), "fairring: " + op.describe() + ": " + why.what()));
  };
  std::deque<std::shared_ptr<Op>> posts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts.swap(posts_);
  }
  for (auto& op : posts) finish(op, error(*op), op->peer);
  for (Peer& peer : peers_) {
    std::deque<std::shared_ptr<Op>> sends;
    {
      std::lock_guard<std::mutex> lock(*peer.out_mu);
      if (peer.gone.empty()) peer.gone = why.what();
      sends.swap(peer.sends);
    }
    for (auto& op : sends) finish(op, error(*op), peer.rank);
    if (peer.inbound.op) {
      auto op = std::move(peer.inbound.op);
      finish(op, error(*op), peer.rank);
    }
    peer.inbound = Inbound{};
  }
  for (auto& [id, u] : unexpected_) {
    if (u.taker) finish(u.taker, error(*u.taker), u.src);
  }
  unexpected_.clear();
  for (auto& [id, op] : posted_) {
    matcher_.cancel_recv(id);
    finish(op, error(*op), op->peer);
  }
  posted_.clear();
}

}  // namespace fairring

#include "servers/reduction_server.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "common/error.h"
#include "common/op_key.h"
#include "kernels/reduce_cpu.h"
#include "rails/wire_codec.h"
#include "transport/server_protocol.h"
#include "transport/channel.h"
#include "transport/greetings.h"

namespace fairring {

namespace {

constexpr int kPollMs = 40;
// Often enough for any worker's liveness window (rail_stage.cpp: at least
// 120 ms): a server that is alive but waits for a late rank is not blamed.
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(40);
constexpr auto kGreetingTimeout = std::chrono::seconds(5);
constexpr size_t kMaxPendingGreetings = 256;
constexpr auto kAbortFlush = std::chrono::milliseconds(500);
constexpr auto kCloseDrain = std::chrono::milliseconds(500);
// Refused connections logged one by one; past this, one line per 100.
constexpr uint64_t kRefusalLines = 10;
// Buffers a session keeps for reuse (a few slices' worth).
constexpr size_t kPoolKeep = 64;

#define SERVER_LOG(index, fmt, ...) std::fprintf(stderr, "[fairring server %d] " fmt "\n", (index), ##__VA_ARGS__)

struct Buffer {
  std::unique_ptr<char[]> data;
  size_t cap = 0;
  char* get() const { return data.get(); }
};

// Message buffers, reused: a fresh large allocation costs page faults.
class BufferPool {
 public:
  Buffer take(size_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->cap >= bytes) {
        Buffer b = std::move(*it);
        free_.erase(it);
        return b;
      }
    }
    Buffer b;
    b.cap = std::max<size_t>(bytes, 64);
    b.data.reset(new char[b.cap]);
    return b;
  }
  void give(Buffer b) {
    if (b.data && free_.size() < kPoolKeep) free_.push_back(std::move(b));
  }

 private:
  std::vector<Buffer> free_;
};

std::string without_prefix(std::string what) {
  const std::string prefix = "fairring: ";
  if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  return what;
}

}  // namespace

struct ReductionServer::Session {
  // Fixed at creation.
  std::string id;
  int num_nodes = 0;
  int group_size = 0;
  int largest_node = 0;
  bool uneven = false;
  WireDtype wire = WireDtype::kNone;
  int64_t max_message_bytes = 0;  // larger contributions are refused
  Worker* worker = nullptr;
  std::vector<bool> joined;  // under the server's mu_

  // The worker thread's.
  struct Conn {
    std::unique_ptr<Channel> ch;
    int rank = -1;
    std::deque<std::pair<WireHeader, Buffer>> arrived;  // contributions not reduced yet
    WireHeader incoming{};
    Buffer incoming_buf;
    bool ended = false;  // its rank closed it, cleanly
  };
  std::vector<Conn> conns;  // by node
  BufferPool pool;
  bool in_worker = false;
  bool done = false;
};

struct ReductionServer::Worker {
  struct Adoption {
    std::shared_ptr<Session> session;
    int node = 0;
    int rank = 0;
    std::unique_ptr<Channel> ch;
  };
  std::thread thread;
  int wake_fd = -1;
  std::mutex mu;
  std::deque<Adoption> incoming;
  std::vector<std::shared_ptr<Session>> sessions;  // the thread's

  void wake() {
    uint64_t one = 1;
    ssize_t r = write(wake_fd, &one, sizeof(one));
    (void)r;
  }
};

namespace {

using Session = ReductionServer::Session;

// The next message of `c` has its header in: receive it into a buffer.
void receive_next(Session& s, Session::Conn& c) {
  Session::Conn* cp = &c;
  BufferPool* pool = &s.pool;
  const uint64_t most = static_cast<uint64_t>(s.max_message_bytes);
  c.ch->post_recv({[cp, pool, most](const WireHeader& h) -> void* {
                     if (static_cast<WireKind>(h.kind) != WireKind::kContribution) {
                       throw Error(ErrorKind::kBackend, "fairring: unexpected message from rank " +
                                                            std::to_string(cp->rank) + " (kind " +
                                                            std::to_string(h.kind) + ")");
                     }
                     if (h.bytes > most) {
                       throw Error(ErrorKind::kBackend, "fairring: rank " + std::to_string(cp->rank) + " sent " +
                                                            std::to_string(h.bytes) + " bytes, more than the " +
                                                            std::to_string(most) + " it said it would");
                     }
                     cp->incoming = h;
                     cp->incoming_buf = pool->take(h.bytes);
                     return cp->incoming_buf.get();
                   },
                   [cp] { cp->arrived.emplace_back(cp->incoming, std::move(cp->incoming_buf)); }});
}

// Reduces every message all connections have sent, in order, and sends each
// sum back on every connection.  Returns how many reductions of how many
// bytes (as received) it did.
std::pair<uint64_t, uint64_t> reduce_ready(Session& s) {
  uint64_t done = 0, bytes_in = 0;
  const int n = s.num_nodes;
  for (;;) {
    for (const auto& c : s.conns) {
      if (!c.ch || c.arrived.empty()) return {done, bytes_in};
    }
    const WireHeader& h0 = s.conns[0].arrived.front().first;
    for (int x = 1; x < n; ++x) {
      const WireHeader& h = s.conns[x].arrived.front().first;
      check_same_op(h0.key, s.conns[0].rank, h.key, s.conns[x].rank);
      if (h.slice_seq != h0.slice_seq || h.bytes != h0.bytes) {
        throw_out_of_step(h0.key, s.conns[0].rank, s.conns[x].rank);
      }
    }
    const auto dtype = static_cast<c10::ScalarType>(h0.key.dtype);
    const auto op = static_cast<RedOp>(h0.key.op);
    const int64_t esize = c10::elementSize(dtype);
    RailTask probe;
    probe.key = h0.key;
    probe.pattern = RailPattern::kReduce;
    const WireCodec codec(s.wire);
    const bool wire = h0.bytes > 0 && codec.applies(probe);
    const uint64_t bytes = h0.bytes;
    int64_t count = 0;
    if (wire) {
      if (bytes < WireCodec::kPrefixBytes || (bytes - WireCodec::kPrefixBytes) % 2 != 0) {
        throw Error(ErrorKind::kBackend,
                    "fairring: malformed compressed message from rank " + std::to_string(s.conns[0].rank));
      }
      count = static_cast<int64_t>((bytes - WireCodec::kPrefixBytes) / 2);
    } else {
      if (bytes % esize != 0) {
        throw Error(ErrorKind::kBackend,
                    "fairring: message from rank " + std::to_string(s.conns[0].rank) + " is not whole elements");
      }
      count = static_cast<int64_t>(bytes) / esize;
    }
    std::vector<Buffer> widened;
    std::vector<const void*> inputs(n);
    for (int x = 0; x < n; ++x) {
      const Buffer& got = s.conns[x].arrived.front().second;
      if (wire) {
        widened.push_back(s.pool.take(count * esize));
        codec.decode(dtype, got.get(), count, widened.back().get());
        inputs[x] = widened.back().get();
      } else {
        inputs[x] = got.get();
      }
    }
    Buffer sum = s.pool.take(count * esize);
    if (count > 0) {
      const AvgDivisors avg = avg_divisors(op, dtype, s.group_size, n, s.largest_node, s.uneven);
      reduce_cpu(dtype, op, sum.get(), inputs.data(), n, count, avg.rail);
    }
    uint64_t result_bytes = bytes;
    if (wire) {
      // Rounded once: every rank widens these same bits.
      Buffer msg = s.pool.take(WireCodec::message_bytes(count));
      codec.encode(dtype, sum.get(), count, msg.get());
      s.pool.give(std::move(sum));
      sum = std::move(msg);
      result_bytes = WireCodec::message_bytes(count);
    }
    for (auto& b : widened) s.pool.give(std::move(b));
    // One buffer for every connection's copy; back to the pool after the last.
    struct Sent {
      Buffer buf;
      int left = 0;
    };
    auto sent = std::make_shared<Sent>();
    sent->buf = std::move(sum);
    sent->left = n;
    BufferPool* pool = &s.pool;
    for (int x = 0; x < n; ++x) {
      Channel::Send snd;
      snd.header.kind = static_cast<uint32_t>(WireKind::kResult);
      snd.header.slice_seq = h0.slice_seq;
      snd.header.key = h0.key;
      snd.header.bytes = result_bytes;
      snd.data = sent->buf.get();
      snd.on_done = [sent, pool] {
        if (--sent->left == 0) pool->give(std::move(sent->buf));
      };
      s.conns[x].ch->post_send(std::move(snd));
    }
    for (auto& c : s.conns) {
      s.pool.give(std::move(c.arrived.front().second));
      c.arrived.pop_front();
    }
    ++done;
    bytes_in += bytes * n;
  }
}

// Ends our stream on every connection of a failed session and drops what
// the ranks still send until they close, or until `until`.
void drain_and_close(Session& s, Clock::time_point until) {
  std::vector<int> fds;
  for (auto& c : s.conns) {
    if (c.ch) fds.push_back(c.ch->fd());
  }
  end_streams(fds, until);
  for (auto& c : s.conns) c.ch.reset();
}

// Moves a session on: headers that wait for a receive get one, complete
// reductions go out, closed connections end it (cleanly, or as a failure
// if work was left for them).
std::pair<uint64_t, uint64_t> pump(Session& s) {
  for (auto& c : s.conns) {
    while (c.ch && c.ch->parked() && !c.ch->has_pending_recv()) {
      receive_next(s, c);
      c.ch->progress_recv();
    }
  }
  const auto did = reduce_ready(s);
  // A connection whose rank closed it between messages is let go at once
  // (the rank waits for our end of stream), unless it left work behind.
  int joined = 0, ended = 0;
  bool work_left = false;
  std::string gone;
  for (auto& c : s.conns) {
    if (c.ch && c.ch->peer_closed()) {
      if (!c.arrived.empty()) {
        throw Error(ErrorKind::kNetwork, "fairring: rank " + std::to_string(c.rank) +
                                             " closed its connection before its pieces were reduced "
                                             "(did it exit or crash?)");
      }
      c.ch.reset();
      c.ended = true;
    }
    if (c.ch || c.ended) ++joined;
    if (c.ended) {
      ++ended;
      if (gone.empty()) gone = "rank " + std::to_string(c.rank);
    } else if (c.ch) {
      work_left = work_left || !c.arrived.empty() || c.ch->parked();
    }
  }
  if (ended > 0 && work_left) {
    throw Error(ErrorKind::kNetwork, "fairring: " + gone +
                                         " closed its connection while this rail still had pieces to reduce "
                                         "(did it exit or crash?)");
  }
  if (joined > 0 && ended == joined) s.done = true;
  return did;
}

}  // namespace

ReductionServer::ReductionServer(c10::intrusive_ptr<c10d::Store> root, ServerOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  const std::string host = options_.ifname.empty() ? default_address() : interface_address(options_.ifname);
  int port = 0;
  listener_ = listen_on(host, &port);
  address_ = host + ":" + std::to_string(port);
  secret_ = job_server_secret(*root_);
  index_ = static_cast<int>(root_->add(server_count_key(), 1) - 1);
  const int threads = std::max(1, options_.threads);
  for (int i = 0; i < threads; ++i) {
    auto w = std::make_unique<Worker>();
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wake_fd < 0) throw Error(ErrorKind::kBackend, "fairring: eventfd failed");
    workers_.push_back(std::move(w));
  }
  // Published before the threads start (a rank that connects meanwhile
  // waits in the listen backlog), so that a store that fails here leaves no
  // thread to join.
  root_->set(server_addr_key(index_), std::vector<uint8_t>(address_.begin(), address_.end()));
  for (auto& w : workers_) {
    Worker* wp = w.get();
    wp->thread = std::thread([this, wp] { serve(*wp); });
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

ReductionServer::~ReductionServer() {
  finish("the server was shut down");
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
    if (w->wake_fd >= 0) close(w->wake_fd);
  }
}

bool ReductionServer::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, timeout, [&] { return stopped_; });
}

void ReductionServer::stop(const std::string& why) { finish(why); }

std::string ReductionServer::stop_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_reason_;
}

void ReductionServer::finish(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_reason_ = why;
  }
  stop_ = true;
  for (auto& w : workers_) w->wake();
  cv_.notify_all();
}

void ReductionServer::accept_loop() {
  pthread_setname_np(pthread_self(), "fairring-srvacc");
  uint64_t refused = 0;
  auto refuse = [&](const std::string& why) {
    if (++refused <= kRefusalLines || refused % 100 == 0) {
      SERVER_LOG(index_, "refused a connection (%llu so far): %s", static_cast<unsigned long long>(refused),
                 why.c_str());
    }
  };
  GreetingReader<ServerHello> greetings(
      kMaxPendingGreetings, kGreetingTimeout,
      [&](Socket socket, const ServerHello& hello, const std::string&) {
        try {
          admit(std::move(socket), hello);
        } catch (const std::exception& e) {
          refuse(error_of(e).what());
        }
      },
      [&](const std::string& from, const std::string& why) { refuse(from + " " + why); });
  std::vector<struct pollfd> fds;
  auto next_check = Clock::now() + options_.store_poll;
  while (!stop_) {
    greetings.fill(fds, listener_.fd());
    poll(fds.data(), fds.size(), 100);
    const auto now = Clock::now();
    greetings.step(fds, listener_.fd());
    if (now >= next_check) {
      next_check = now + options_.store_poll;
      try {
        root_->check({server_count_key()});
      } catch (const std::exception&) {
        // Its connection failed: the store's host (rank 0, or torchrun's
        // agent) has exited.  The normal end, not a failure.
        finish("the job has ended (its store is gone)");
        return;
      }
    }
  }
}

void ReductionServer::admit(Socket socket, const ServerHello& hello_in) {
  const std::string from = socket.peer_name();
  const auto deadline = Clock::now() + kGreetingTimeout;
  ServerHello hello = hello_in;
  if (std::memcmp(hello.magic, kServerHelloMagic, sizeof(kServerHelloMagic)) != 0 ||
      !same_secret(hello.secret, secret_.data())) {
    throw Error(ErrorKind::kBackend, from + " is not a rank of this job (wrong greeting or secret)");
  }
  hello.session[kSessionIdBytes - 1] = '\0';
  const std::string id(hello.session);
  std::string refusal;
  std::shared_ptr<Session> session;
  if (hello.server != index_) {
    refusal = "it asked for server " + std::to_string(hello.server) + ", this is server " + std::to_string(index_);
  } else if (hello.header_bytes != sizeof(WireHeader)) {
    refusal = "its messages' headers are " + std::to_string(hello.header_bytes) + " bytes, this server's " +
              std::to_string(sizeof(WireHeader)) + ": another build of Fairring";
  } else if (hello.num_nodes < 2 || hello.num_nodes > kMaxServerNodes || hello.node < 0 ||
             hello.node >= hello.num_nodes || hello.group_size < 1 || hello.group_size > kMaxServerGroupSize ||
             hello.largest_node < 1 || hello.largest_node > hello.group_size ||
             (hello.uneven != 0 && hello.uneven != 1) || hello.wire > static_cast<uint32_t>(WireDtype::kFp16) ||
             hello.max_message_bytes < 0 || hello.max_message_bytes > (int64_t{1} << 40)) {
    refusal = "malformed greeting (node " + std::to_string(hello.node) + " of " + std::to_string(hello.num_nodes) + ")";
  } else {
    // Built whole before it is visible to the next greeting.
    auto fresh = std::make_shared<Session>();
    fresh->id = id;
    fresh->num_nodes = hello.num_nodes;
    fresh->group_size = hello.group_size;
    fresh->largest_node = hello.largest_node;
    fresh->uneven = hello.uneven != 0;
    fresh->wire = static_cast<WireDtype>(hello.wire);
    fresh->max_message_bytes = hello.max_message_bytes;
    fresh->joined.assign(hello.num_nodes, false);
    fresh->conns.resize(hello.num_nodes);
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = sessions_[id];
    if (!slot) {
      fresh->worker = workers_[next_worker_++ % workers_.size()].get();
      slot = std::move(fresh);
      ++sessions_admitted_;
    }
    if (slot->num_nodes != hello.num_nodes || slot->group_size != hello.group_size ||
        slot->largest_node != hello.largest_node || slot->uneven != (hello.uneven != 0) ||
        slot->wire != static_cast<WireDtype>(hello.wire) || slot->max_message_bytes != hello.max_message_bytes) {
      refusal = "its rail disagrees with the ranks that joined before it (nodes, group size, node sizes or wire dtype)";
    } else if (slot->joined[hello.node]) {
      refusal = "node " + std::to_string(hello.node) + " of its rail has joined already";
    } else {
      slot->joined[hello.node] = true;
      session = slot;
    }
  }
  ServerWelcome welcome{};
  std::memcpy(welcome.magic, kServerHelloMagic, sizeof(kServerHelloMagic));
  welcome.status = refusal.empty() ? 0 : 1;
  std::strncpy(welcome.message, refusal.c_str(), sizeof(welcome.message) - 1);
  socket.send_all(&welcome, sizeof(welcome), deadline);
  if (!refusal.empty()) throw Error(ErrorKind::kBackend, "rank " + std::to_string(hello.rank) + ": " + refusal);
  Worker& w = *session->worker;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.incoming.push_back({session, hello.node, hello.rank, std::make_unique<Channel>(std::move(socket), hello.rank)});
  }
  w.wake();
}

void ReductionServer::serve(Worker& w) {
  pthread_setname_np(pthread_self(), "fairring-server");
  const std::string name = server_name(index_, address_);
  auto next_heartbeat = Clock::now();
  // A session that fails tells each of its ranks why (the error names the
  // culprit; a rank's own abort is passed on as is), then ends.
  auto fail = [&](Session& s, const std::exception& e) {
    const Error own = error_of(e);
    const bool passed_on = dynamic_cast<const PeerAborted*>(&e) != nullptr;
    const Error why = passed_on ? own : reworded(own, "fairring: " + name + ": " + without_prefix(own.what()));
    SERVER_LOG(index_, "session %s failed: %s", s.id.c_str(), why.what());
    const auto until = Clock::now() + kAbortFlush;
    for (auto& c : s.conns) {
      if (c.ch) c.ch->queue_abort(why);
    }
    for (auto& c : s.conns) {
      if (c.ch) c.ch->flush_abort(until);
    }
    // Closing a socket with unread bytes (a rank's contributions) resets it,
    // which can discard the abort before the rank reads it: end our stream
    // and read what still comes until the rank closes, for a moment.
    drain_and_close(s, Clock::now() + kCloseDrain);
    s.done = true;
  };
  std::vector<struct pollfd> fds;
  std::vector<std::pair<Session*, Channel*>> polled;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      for (auto& a : w.incoming) {
        a.session->conns[a.node].ch = std::move(a.ch);
        a.session->conns[a.node].rank = a.rank;
        if (!a.session->in_worker) {
          a.session->in_worker = true;
          w.sessions.push_back(a.session);
        }
      }
      w.incoming.clear();
    }
    if (stop_) {
      const Error why(ErrorKind::kNetwork, "fairring: " + name + " stopped: " + stop_reason());
      for (auto& s : w.sessions) {
        if (!s->done) fail(*s, why);
      }
      return;
    }
    const bool heartbeat = Clock::now() >= next_heartbeat;
    if (heartbeat) next_heartbeat = Clock::now() + kHeartbeatEvery;
    for (auto& s : w.sessions) {
      if (s->done) continue;
      try {
        const auto did = pump(*s);
        reductions_ += did.first;
        bytes_in_ += did.second;
        for (auto& c : s->conns) {
          if (!c.ch) continue;
          if (heartbeat) c.ch->post_heartbeat();
          if (c.ch->wants_write()) c.ch->progress_send();
        }
      } catch (const std::exception& e) {
        fail(*s, e);
      }
    }
    // Ended sessions leave (a rail that joins again under the same id is a
    // new session).
    for (auto it = w.sessions.begin(); it != w.sessions.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto found = sessions_.find((*it)->id);
        if (found != sessions_.end() && found->second == *it) sessions_.erase(found);
      }
      it = w.sessions.erase(it);
    }
    fds.clear();
    polled.clear();
    fds.push_back({w.wake_fd, POLLIN, 0});
    for (auto& s : w.sessions) {
      for (auto& c : s->conns) {
        if (!c.ch) continue;
        short ev = 0;
        if (c.ch->wants_read()) ev |= POLLIN;
        if (c.ch->wants_write()) ev |= POLLOUT;
        if (ev == 0) continue;
        fds.push_back({c.ch->fd(), ev, 0});
        polled.emplace_back(s.get(), c.ch.get());
      }
    }
    if (poll(fds.data(), fds.size(), kPollMs) < 0 && errno != EINTR) {
      finish(std::string("poll failed: ") + std::strerror(errno));  // the sessions fail on the next turn
      continue;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      ssize_t r = read(w.wake_fd, &v, sizeof(v));
      (void)r;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      Session& s = *polled[i - 1].first;
      Channel& ch = *polled[i - 1].second;
      if (s.done || fds[i].revents == 0) continue;
      try {
        if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) ch.progress_recv();
        if (fds[i].revents & (POLLOUT | POLLERR | POLLHUP)) ch.progress_send();
      } catch (const std::exception& e) {
        // A rank that has finished may go with a reset rather than an end
        // of stream (it exited with our heartbeat unread).  With nothing of
        // it arrived or on its way, that is its end, as a clean close is
        // (pump() fails the session if the rail still needed it).
        Session::Conn* c = nullptr;
        for (auto& x : s.conns) {
          if (x.ch.get() == &ch) c = &x;
        }
        const bool idle = c != nullptr && c->arrived.empty() && !ch.parked() && !ch.mid_message() &&
                          !ch.has_pending_recv() && !ch.data_pending();
        if (idle && dynamic_cast<const PeerAborted*>(&e) == nullptr && error_of(e).kind() == ErrorKind::kNetwork) {
          c->ch.reset();
          c->ended = true;
        } else {
          fail(s, e);
        }
      }
    }
  }
}

}  // namespace fairring

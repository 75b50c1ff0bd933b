// The net thread of the point-to-point engine (groups of several nodes):
// sends to ranks on other nodes over a connection of ours to each, made at
// the first send to it; messages from them over theirs to us, admitted by
// the listener if they know the group's secret.  One poll loop.
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/fault_injection.h"
#include "common/log.h"
#include "p2p/p2p_engine.h"
#include "p2p/p2p_op.h"

namespace fairring {

namespace {

constexpr char kHelloMagic[8] = {'F', 'R', 'N', 'G', 'P', '2', 'P', '1'};
// A connecting peer has this long to say who it is (a silent one holds the
// net thread up to this, once).
constexpr auto kGreetingTimeout = std::chrono::seconds(2);
constexpr int kPollMs = 100;
constexpr std::chrono::milliseconds kConnectTimeout{5000};
// Bytes moved per socket call: large enough to keep the kernel's buffers
// full, small enough to serve several peers in turn.
constexpr size_t kChunk = 4 << 20;

}  // namespace

void P2pEngine::wake_net() {
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is full, so a wake-up is pending anyway.
  }
}

void P2pEngine::net_loop() {
  pthread_setname_np(pthread_self(), "fairring-p2pnet");
  bool failed_seen = false;
  auto next_check = Clock::now();
  std::vector<struct pollfd> fds;
  std::vector<std::pair<Peer*, bool>> who;  // per fd past the first two: peer, writing
  for (;;) {
    if (stop_.load()) {
      fail_peers(Error(ErrorKind::kBackend, "this process group was destroyed"), /*local=*/false);
      return;
    }
    if (!failed_seen) {
      std::string failed;
      ErrorKind kind;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed = failed_;
        kind = failed_kind_;
      }
      if (!failed.empty()) {
        fail_peers(Error(kind, failed), /*local=*/false);
        failed_seen = true;
      }
    }
    fds.clear();
    who.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    // Ranks we wait on for a message: a connection of ours to each tells
    // us if it dies before it has sent anything (its end closes).
    std::vector<char> awaited(peers_.size(), 0);
    {
      std::lock_guard<std::mutex> lock(match_mu_);
      for (const auto& [id, op] : posted_) {
        if (op->peer != kAnySource) awaited[op->peer] = 1;
      }
    }
    for (Peer& peer : peers_) {
      if (peer.local >= 0) continue;
      bool sending;
      bool gone;
      {
        std::lock_guard<std::mutex> lock(*peer.out_mu);
        sending = !peer.sends.empty();
        gone = !peer.gone.empty();
      }
      if ((sending || (awaited[peer.rank] && !peer.in_socket.valid())) && !gone && !peer.out_socket.valid()) {
        connect_peer(peer);
      }
      if (peer.out_socket.valid()) {
        // Readable only when it closes: the peer never sends on our connection.
        fds.push_back({peer.out_socket.fd(), static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), 0});
        who.emplace_back(&peer, true);
      }
      if (peer.in_socket.valid()) {
        fds.push_back({peer.in_socket.fd(), POLLIN, 0});
        who.emplace_back(&peer, false);
      }
    }
    if (::poll(fds.data(), fds.size(), kPollMs) < 0 && errno != EINTR) {
      fail_peers(Error(ErrorKind::kBackend, std::string("fairring: poll failed: ") + std::strerror(errno)), false);
      return;
    }
    if (fds[0].revents) {
      uint64_t count;
      if (::read(wake_fd_, &count, sizeof(count)) < 0) {
        // EAGAIN: nothing to clear.
      }
    }
    if (fds[1].revents) accept_peer();
    for (size_t i = 0; i < who.size(); ++i) {
      const short ev = fds[i + 2].revents;
      if (!ev) continue;
      auto [peer, ours] = who[i];
      if (!ours) {
        read_from(*peer);
        continue;
      }
      if (ev & (POLLIN | POLLERR | POLLHUP)) {
        char byte;
        const ssize_t n = ::recv(peer->out_socket.fd(), &byte, 1, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          peer->out_socket.close();
          const std::string why = "rank " + std::to_string(peer->rank) +
                                  " closed its end of our connection (did it exit, or destroy its group?)";
          if (peer->in_socket.valid()) {
            // What it sent before it went may still be on its way to us:
            // receives fail when that connection ends; sends fail now (and
            // later ones at once, with no new connection).
            std::deque<std::shared_ptr<Op>> sends;
            {
              std::lock_guard<std::mutex> lock(*peer->out_mu);
              peer->sends_closed = why;
              sends.swap(peer->sends);
            }
            for (auto& op : sends) finish(op, op->error(ErrorKind::kNetwork, why), peer->rank);
          } else {
            fail_peer(*peer, why);
          }
          continue;
        }
      }
      if (ev & POLLOUT) write_to(*peer);
    }
    const auto now = Clock::now();
    if (now < next_check) continue;
    next_check = now + std::chrono::milliseconds(kPollMs);
    for (Peer& peer : peers_) {  // sends a stalled peer does not take, messages it stopped sending
      if (peer.local >= 0 || peer.rank == topo_.rank) continue;
      check_inbound(peer, now);
      Clock::time_point oldest{};
      {
        std::lock_guard<std::mutex> lock(*peer.out_mu);
        if (!peer.sends.empty()) oldest = peer.sends.front()->last_progress;
      }
      if (oldest != Clock::time_point{} && now - oldest > timeout_.load()) {
        fail_peer(peer, "Timed out: rank " + std::to_string(peer.rank) + " took none of its bytes for " +
                            seconds(std::chrono::duration<double>(now - oldest).count()) + " (is it stalled?)");
      }
    }
  }
}

bool P2pEngine::connect_peer(Peer& peer) {
  try {
    const std::vector<uint8_t> raw = store_->get("addr/" + std::to_string(peer.rank));
    const std::string value(raw.begin(), raw.end());
    // It listens since before it published the address: a refusal means it
    // is gone, so this does not wait long.
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_.load(), kConnectTimeout);
    Socket s = connect_to(value, deadline);
    Hello hello{};
    std::memcpy(hello.magic, kHelloMagic, sizeof(kHelloMagic));
    hello.rank = topo_.rank;
    std::memcpy(hello.secret, secret_.data(), secret_.size());
    s.send_all(&hello, sizeof(hello), deadline);
    s.set_nodelay();
    s.set_nonblocking();
    peer.out_socket = std::move(s);
    peer.header_sent = 0;
    return true;
  } catch (const std::exception& e) {
    fail_peer(peer,
              "could not connect to rank " + std::to_string(peer.rank) + " (did it exit?): " + error_of(e).what());
    return false;
  }
}

void P2pEngine::accept_peer() {
  for (;;) {
    const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left
    Socket s(fd);
    const std::string from = s.peer_name();
    Hello hello{};
    try {
      s.recv_all(&hello, sizeof(hello), Clock::now() + kGreetingTimeout);
    } catch (const std::exception& e) {
      FAIRRING_LOG(topo_.rank, "point-to-point: dropped a connection from %s: %s", from.c_str(), e.what());
      continue;
    }
    const int r = hello.rank;
    const bool ok = std::memcmp(hello.magic, kHelloMagic, sizeof(kHelloMagic)) == 0 &&
                    same_secret(hello.secret, secret_.data()) && r >= 0 && r < topo_.size && peers_[r].local < 0 &&
                    !peers_[r].in_socket.valid();
    if (!ok) {
      FAIRRING_LOG(topo_.rank, "point-to-point: refused a connection from %s (not a rank of this group)", from.c_str());
      continue;
    }
    s.set_nonblocking();
    peers_[r].in_socket = std::move(s);
    peers_[r].header_got = 0;
  }
}

bool P2pEngine::read_from(Peer& peer) {
  static thread_local std::vector<char> scratch(kChunk);  // what a dropped message is read into
  const std::string who = "rank " + std::to_string(peer.rank);
  for (int i = 0; i < 64; ++i) {
    if (peer.dropping) {  // failed: what still comes is not read
      const ssize_t n = ::recv(peer.in_socket.fd(), scratch.data(), scratch.size(), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      if (n <= 0) {
        peer.in_socket.close();
        return false;
      }
      continue;
    }
    const bool header = peer.header_got < sizeof(CellHeader);
    Inbound& in = peer.inbound;
    char* dst;
    size_t want;
    if (header) {
      dst = reinterpret_cast<char*>(&peer.in_header) + peer.header_got;
      want = sizeof(CellHeader) - peer.header_got;
    } else {
      dst = peer.in_dst ? peer.in_dst + in.got : scratch.data();
      want = std::min<uint64_t>(in.total - in.got, peer.in_dst ? kChunk : scratch.size());
    }
    const ssize_t n = ::recv(peer.in_socket.fd(), dst, want, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {
      const std::string why = n == 0 ? who + " closed its connection" +
                                           (in.active || !header ? " in the middle of a message" : "") +
                                           " (did it exit, or destroy its group?)"
                                     : "connection from " + who + " failed: " + std::strerror(errno);
      peer.in_socket.close();
      fail_peer(peer, why);
      return false;
    }
    if (header) {
      peer.header_got += static_cast<size_t>(n);
      if (peer.header_got < sizeof(CellHeader)) continue;
      if (peer.in_header.magic != kMessageMagic || peer.in_header.offset != 0 ||
          peer.in_header.bytes != peer.in_header.total) {
        peer.in_socket.close();
        fail_peer(peer, who + " sent a malformed message");
        return false;
      }
      peer.in_dst = begin_message(peer, peer.in_header);
    } else {
      in.got += static_cast<uint64_t>(n);
      in.last_progress = Clock::now();
      if (in.op) in.op->last_progress = in.last_progress;
    }
    if (in.got == in.total) {
      end_message(peer);
      peer.header_got = 0;
      peer.in_dst = nullptr;
    }
  }
  return true;
}

bool P2pEngine::write_to(Peer& peer) {
  static const int64_t exit_after = test_bytes("FAIRRING_TEST_P2P_EXIT_AFTER");  // as write_cells
  std::vector<std::shared_ptr<Op>> whole;
  std::string failed;
  {
    std::lock_guard<std::mutex> lock(*peer.out_mu);
    while (!peer.sends.empty()) {
      Op& op = *peer.sends.front();
      if (peer.header_sent == 0) peer.out_header = header_of(op, op.bytes);
      const bool header = peer.header_sent < sizeof(CellHeader);
      const char* src =
          header ? reinterpret_cast<const char*>(&peer.out_header) + peer.header_sent : op.data + op.moved;
      const size_t want =
          header ? sizeof(CellHeader) - peer.header_sent : std::min<uint64_t>(op.bytes - op.moved, kChunk);
      const ssize_t n = want ? ::send(peer.out_socket.fd(), src, want, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        failed =
            "connection to rank " + std::to_string(peer.rank) + " failed: " + std::strerror(errno) + " (did it exit?)";
        break;
      }
      if (header) {
        peer.header_sent += static_cast<size_t>(n);
      } else {
        op.moved += static_cast<uint64_t>(n);
      }
      op.last_progress = Clock::now();
      if (exit_after >= 0 && op.moved >= static_cast<uint64_t>(exit_after) && op.moved < op.bytes) _exit(57);
      if (peer.header_sent == sizeof(CellHeader) && op.moved == op.bytes) {
        whole.push_back(std::move(peer.sends.front()));
        peer.sends.pop_front();
        peer.header_sent = 0;
      }
    }
  }
  for (auto& op : whole) finish(op, nullptr, peer.rank);
  if (!failed.empty()) {
    peer.out_socket.close();
    fail_peer(peer, failed);
    return false;
  }
  return true;
}

}  // namespace fairring

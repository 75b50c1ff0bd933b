#include "transport/channel.h"

#include "common/error.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace fairring {

namespace {

// flush_abort(): how long one wait for room in the socket lasts.
constexpr int kAbortFlushPollMs = 10;
[[noreturn]] void lost(const std::string& peer, const std::string& noun, const std::string& what) {
  throw Error(ErrorKind::kNetwork,
              "fairring: connection to " + peer + " " + what + " (did that " + noun + " exit or crash?)");
}
// The peer ended its stream where we expect more: it exited, or left the
// group (shut it down, destroyed or dropped it).  The conventional words
// last: code that retries on a lost peer looks for them.
[[noreturn]] void closed(const std::string& peer, const std::string& noun) {
  throw Error(ErrorKind::kNetwork, "fairring: connection to " + peer + " was closed (did that " + noun +
                                       " exit, crash or leave the group?): Connection closed by peer");
}
}  // namespace

Channel::Channel(Socket socket, int peer_rank, std::string peer_name, std::string peer_noun)
    : socket_(std::move(socket)),
      peer_rank_(peer_rank),
      peer_name_(peer_name.empty() ? "rank " + std::to_string(peer_rank) : std::move(peer_name)),
      peer_noun_(std::move(peer_noun)) {
  socket_.set_nonblocking();
  socket_.set_nodelay();
  last_recv_progress = Clock::now();
  last_send_progress = last_recv_progress;
}

bool Channel::progress_send() {
  bool moved = false;
  while (!sendq_.empty()) {
    Send& s = sendq_.front();
    const size_t hdr = sizeof(WireHeader);
    const size_t total = hdr + s.header.bytes;
    const char* payload = s.owned.empty() ? static_cast<const char*>(s.data) : s.owned.data();
    struct iovec iov[2];
    int n = 0;
    if (s.sent < hdr) {
      iov[n++] = {reinterpret_cast<char*>(&s.header) + s.sent, hdr - s.sent};
      if (s.header.bytes > 0) iov[n++] = {const_cast<char*>(payload), s.header.bytes};
    } else {
      iov[n++] = {const_cast<char*>(payload) + (s.sent - hdr), total - s.sent};
    }
    struct msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t r = sendmsg(socket_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return moved;
      if (data_sends_ == 0) {
        // Only heartbeats were queued: a peer that has finished and closed
        // is no error while nothing is expected from or owed to it.
        sendq_.clear();
        peer_gone_ = true;
        return moved;
      }
      lost(peer_name_, peer_noun_, std::string("failed: ") + std::strerror(errno));
    }
    if (r > 0) {
      moved = true;
      last_send_progress = Clock::now();
    }
    s.sent += static_cast<size_t>(r);
    if (s.sent < total) return moved;
    auto done = std::move(s.on_done);
    if (!s.heartbeat) --data_sends_;
    sendq_.pop_front();
    if (done) done();
  }
  return moved;
}

void Channel::post_heartbeat() {
  if (!sendq_.empty() || peer_closed_ || peer_gone_) return;
  Send s;
  s.header.kind = static_cast<uint32_t>(WireKind::kAlive);
  s.heartbeat = true;
  sendq_.push_back(std::move(s));
}

bool Channel::start_parked_header() {
  // A full header is in; find its destination.
  const WireHeader& h = header_;
  if (h.magic != kWireMagic) {
    throw Error(ErrorKind::kBackend, "fairring: corrupt message from " + peer_name_ + " (bad magic)");
  }
  if (static_cast<WireKind>(h.kind) == WireKind::kAbort) {
    if (h.bytes > 65536) lost(peer_name_, peer_noun_, "sent an oversized abort");
    abort_text_.assign(h.bytes, '\0');
    payload_dst_ = abort_text_.data();
    return true;
  }
  parked_ = recvq_.empty();
  if (parked_) return false;  // until a receive is posted
  payload_dst_ = recvq_.front().on_header(h);
  return true;
}

void Channel::post_recv(Recv r) {
  if (peer_closed_) closed(peer_name_, peer_noun_);
  recvq_.push_back(std::move(r));
}

size_t Channel::recv_some(char* dst, size_t len) {
  ssize_t r = recv(socket_.fd(), dst, len, MSG_DONTWAIT);
  if (r == 0) {
    // A peer that got all it needed may finish and close before we have
    // read the last message it sent us: only an end of stream where more
    // is expected is an error.
    if (header_got_ == 0 && recvq_.empty()) {
      peer_closed_ = true;
      return 0;
    }
    closed(peer_name_, peer_noun_);
  }
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    lost(peer_name_, peer_noun_, std::string("failed: ") + std::strerror(errno));
  }
  last_recv_progress = Clock::now();
  return static_cast<size_t>(r);
}

bool Channel::progress_recv() {
  bool moved = false;
  for (;;) {
    if (header_got_ < sizeof(WireHeader)) {
      if (header_got_ == 0) progress_before_header_ = last_recv_progress;
      const size_t r = recv_some(reinterpret_cast<char*>(&header_) + header_got_, sizeof(WireHeader) - header_got_);
      if (r == 0) return moved;
      moved = true;
      header_got_ += r;
      if (header_got_ < sizeof(WireHeader)) continue;
      if (header_.magic == kWireMagic && static_cast<WireKind>(header_.kind) == WireKind::kAlive) {
        if (header_.bytes != 0) {
          throw Error(ErrorKind::kBackend,
                      "fairring: corrupt message from " + peer_name_ + " (heartbeat with a payload)");
        }
        // A sign of life, not progress of the collective.
        last_peer_alive = last_recv_progress;
        last_recv_progress = progress_before_header_;
        header_got_ = 0;
        continue;
      }
      payload_got_ = 0;
      payload_dst_ = nullptr;
      if (!start_parked_header()) return moved;
    } else if (parked_) {
      if (!start_parked_header()) return moved;
    }
    // Payload.
    while (payload_got_ < header_.bytes) {
      const size_t r = recv_some(static_cast<char*>(payload_dst_) + payload_got_, header_.bytes - payload_got_);
      if (r == 0) return moved;
      moved = true;
      payload_got_ += r;
    }
    header_got_ = 0;
    payload_dst_ = nullptr;
    if (static_cast<WireKind>(header_.kind) == WireKind::kAbort) {
      throw PeerAborted(static_cast<ErrorKind>(header_.slice_seq), abort_text_);
    }
    auto done = std::move(recvq_.front().on_done);
    recvq_.pop_front();
    if (done) done();
  }
}

void Channel::queue_abort(const Error& why) {
  // Keep only a message already partly on the wire; the rest is moot.
  while (sendq_.size() > 1 || (sendq_.size() == 1 && sendq_.front().sent == 0)) {
    if (!sendq_.back().heartbeat) --data_sends_;
    sendq_.pop_back();
  }
  if (!sendq_.empty() && sendq_.front().owned.empty() && sendq_.front().header.bytes > 0) {
    Send& partial = sendq_.front();
    partial.owned.assign(partial.header.bytes, '\0');
    partial.data = nullptr;
    partial.on_done = nullptr;  // its task is gone
  }
  Send s;
  s.header.kind = static_cast<uint32_t>(WireKind::kAbort);
  s.header.slice_seq = static_cast<uint64_t>(why.kind());  // an abort's header carries its ErrorKind here
  s.owned = std::string(why.what()).substr(0, 4096);
  s.header.bytes = s.owned.size();
  ++data_sends_;
  sendq_.push_back(std::move(s));
}

void Channel::flush_abort(Clock::time_point deadline) {
  try {
    while (!sendq_.empty() && Clock::now() < deadline) {
      if (!progress_send()) {
        struct pollfd p{socket_.fd(), POLLOUT, 0};
        poll(&p, 1, kAbortFlushPollMs);
      }
    }
  } catch (const std::exception&) {
    // The peer is gone; nothing more to tell it.
  }
}

}  // namespace fairring

// A non-blocking TCP connection carrying framed messages: queued sends, and
// queued receives whose destination is chosen when the header arrives.  The
// owner drives it from its poll loop (see rails/rail_stage).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "common/op_key.h"
#include "transport/socket.h"

namespace fairring {

// kAlive: a header alone, sent now and then while nothing else is queued,
// saying that the sender's rail thread runs (see Channel::post_heartbeat).
enum class WireKind : uint32_t { kContribution = 1, kResult = 2, kAbort = 3, kAlive = 4 };

constexpr uint32_t kWireMagic = 0x46524e47;  // "FRNG"

struct WireHeader {
  uint32_t magic = kWireMagic;
  uint32_t kind = 0;
  uint64_t slice_seq = 0;  // global slice number on this process group
  OpKey key;               // the collective, compared by the receiver
  uint64_t bytes = 0;      // payload that follows the header
};

// The peer gave up and told us why (its message and kind, passed on as is).
class PeerAborted : public Error {
 public:
  using Error::Error;
};

class Channel {
 public:
  struct Send {
    WireHeader header;
    const void* data = nullptr;
    std::string owned;  // payload owned by the message (abort text)
    std::function<void()> on_done;
    size_t sent = 0;
    bool heartbeat = false;
  };
  struct Recv {
    // Validates the header and returns where the payload goes (throws on a
    // mismatch).  Called once the header is in.
    std::function<void*(const WireHeader&)> on_header;
    std::function<void()> on_done;
  };

  // `peer_name`: how messages name the peer ("" = "rank <peer_rank>"), and
  // `peer_noun` what it is ("rank", or "server" for a reduction server).
  Channel(Socket socket, int peer_rank, std::string peer_name = "", std::string peer_noun = "rank");

  int fd() const { return socket_.fd(); }
  int peer_rank() const { return peer_rank_; }
  const std::string& peer_name() const { return peer_name_; }
  const std::string& peer_noun() const { return peer_noun_; }

  void post_send(Send s) {
    if (data_sends_ == 0) last_send_progress = Clock::now();
    ++data_sends_;
    sendq_.push_back(std::move(s));
  }
  // Queues a kAlive header if nothing else is queued and the peer is still
  // there.  A peer that stops reading does not make it an error: only data
  // counts for the send deadline, and a failed heartbeat is dropped.
  void post_heartbeat();
  // Throws if the peer has closed the connection.
  void post_recv(Recv r);
  bool has_pending_recv() const { return !recvq_.empty(); }
  // Poll for reading unless a header is parked waiting for its receive, or
  // the peer closed the connection between messages.
  bool wants_read() const { return !parked_ && !peer_closed_; }
  // A header arrived before its receive was posted; once one is posted, call
  // progress_recv() (the payload may be empty: poll would not say so).
  bool parked() const { return parked_; }
  // The peer ended its stream between messages (see wants_read).
  bool peer_closed() const { return peer_closed_; }
  // Part of a message (its header, or header and some payload) is in.
  bool mid_message() const { return header_got_ > 0; }
  bool wants_write() const { return !sendq_.empty(); }
  // Data (not heartbeats) waiting to be taken by the socket.
  bool data_pending() const { return data_sends_ > 0; }

  // Move as many bytes as the socket takes; true if anything moved.  Throw on
  // errors, end of stream (naming the peer) and abort messages.
  bool progress_send();
  bool progress_recv();

  // Giving up, in two steps.  queue_abort: drops what is queued but the
  // message already partly on the wire, whose rest now comes from zeros
  // (the peer reads it whole, then the abort; its bytes are moot), and
  // queues the abort; after it the channel reads no memory of ours.
  // flush_abort: best effort, bounded, sends what is queued.
  void queue_abort(const Error& why);
  void flush_abort(Clock::time_point deadline);

  Clock::time_point last_recv_progress;
  // When the socket last took bytes of a queued send (or the queue was
  // empty): a peer that stops reading leaves our sends stuck in a full
  // socket buffer, with no error from the kernel.
  Clock::time_point last_send_progress;
  // When the peer's last kAlive arrived (never: the epoch).  Heartbeats are
  // not progress: last_recv_progress counts data only.
  Clock::time_point last_peer_alive;

 private:
  bool start_parked_header();
  // Reads what is there, up to len (0: nothing yet); throws on end of stream
  // in the middle of a message or while a receive is posted.
  size_t recv_some(char* dst, size_t len);

  Socket socket_;
  int peer_rank_;
  std::string peer_name_;
  std::string peer_noun_;
  std::deque<Send> sendq_;
  std::deque<Recv> recvq_;
  WireHeader header_;
  size_t header_got_ = 0;
  bool parked_ = false;
  // End of stream between messages with nothing expected: a peer that has
  // finished and shut down, not yet an error (it is one if we expect more).
  bool peer_closed_ = false;
  // Our heartbeat failed to go out (the peer closed): send no more.
  bool peer_gone_ = false;
  size_t data_sends_ = 0;  // queued sends that are not heartbeats
  Clock::time_point progress_before_header_;
  void* payload_dst_ = nullptr;
  size_t payload_got_ = 0;
  std::string abort_text_;
};

}  // namespace fairring

// Which receive a point-to-point message goes to: pure bookkeeping, no I/O.
//
// torch's rule (gloo's and MPI's): a message from rank s with tag t goes to
// the oldest posted receive that names s (or any source) and t; messages
// from one sender with one tag are received in the order they were sent.  A
// message whose receive is not posted yet is "unexpected": kept (the engine
// buffers its bytes) until a receive that matches it is posted, which then
// takes the oldest such message.
#pragma once

#include <cstdint>
#include <list>
#include <optional>

namespace fairring {

constexpr int kAnySource = -1;

class Matcher {
 public:
  // Receive `recv` (an id of the caller's) from `src` (or kAnySource) with
  // `tag` was posted: the id of the unexpected message it takes (then it is
  // not kept), or nothing (it waits for a message).
  std::optional<uint64_t> post_recv(uint64_t recv, int src, int tag);
  // Message `msg` from `src` with `tag` arrived (its header): the receive it
  // goes to (taken off the posted list), or nothing (it is kept as
  // unexpected).
  std::optional<uint64_t> arrive(uint64_t msg, int src, int tag);
  // Forgets a posted receive that will not complete (failed); true if it was posted.
  bool cancel_recv(uint64_t recv);
  // Forgets a kept message that will never be whole (its sender died); true if it was kept.
  bool cancel_message(uint64_t msg);

  size_t posted() const { return recvs_.size(); }
  size_t unexpected() const { return messages_.size(); }

 private:
  struct Entry {
    uint64_t id;
    int src;
    int tag;
  };
  std::list<Entry> recvs_;     // in posting order
  std::list<Entry> messages_;  // in arrival order
};

}  // namespace fairring

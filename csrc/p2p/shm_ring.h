// One direction of point-to-point traffic between two ranks of a node: a
// ring of fixed-size cells in shared memory, written by the sender, read by
// the receiver (one each).  Each cell holds a header and up to
// payload_bytes() of one message, so a message of any size streams through
// a ring of a few cells: the sender fills cell i+1 while the receiver
// empties cell i.  Two counters in shared memory: `head`, cells written;
// `tail`, cells consumed (both modulo 2^32).  No waiting here: the engine
// rings the other side's doorbell after writing or consuming.
#pragma once

#include <cstdint>

#include "transport/sync.h"

namespace fairring {

constexpr uint32_t kMessageMagic = 0x46525032;  // "FRP2"

// At the start of every cell (and, with offset 0 and bytes = total, of every
// message on a TCP connection between nodes).  The message's description
// travels in each cell, so that the receiver needs no state across cells
// but the offset.
struct alignas(64) CellHeader {
  uint32_t magic = kMessageMagic;
  int32_t tag = 0;
  int32_t dtype = 0;    // c10::ScalarType of the sent tensor
  int64_t numel = 0;    // its elements
  uint64_t total = 0;   // the message's bytes
  uint64_t offset = 0;  // of this cell's payload in the message
  uint64_t bytes = 0;   // payload in this cell
};

class ShmRing {
 public:
  ShmRing() = default;
  // `area`: the ring's memory, `area_bytes` of it (a whole number of cells
  // of `cell_bytes`, at least one).
  ShmRing(char* area, int64_t area_bytes, int64_t cell_bytes, SharedCounter* head, SharedCounter* tail);

  int64_t payload_bytes() const { return cell_bytes_ - static_cast<int64_t>(sizeof(CellHeader)); }

  // Sender.  Whether a cell is free; then write() fills it (header and
  // h.bytes of payload from `data`) and publishes it.
  bool can_write() const { return free_cells() > 0; }
  uint32_t free_cells() const;
  void write(const CellHeader& h, const char* data);

  // Receiver.  The oldest unread cell, or null; consume() frees it.
  const CellHeader* peek() const;
  const char* payload(const CellHeader* h) const { return reinterpret_cast<const char*>(h + 1); }
  void consume();

 private:
  char* cell(uint32_t index) const { return area_ + static_cast<int64_t>(index % cells_) * cell_bytes_; }

  char* area_ = nullptr;
  int64_t cell_bytes_ = 0;
  uint32_t cells_ = 0;
  SharedCounter* head_ = nullptr;
  SharedCounter* tail_ = nullptr;
  uint32_t next_ = 0;  // the side's own count: written (sender) or consumed (receiver)
};

}  // namespace fairring

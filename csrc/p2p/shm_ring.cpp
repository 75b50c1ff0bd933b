#include "p2p/shm_ring.h"

#include <cstring>

namespace fairring {

ShmRing::ShmRing(char* area, int64_t area_bytes, int64_t cell_bytes, SharedCounter* head, SharedCounter* tail)
    : area_(area),
      cell_bytes_(cell_bytes),
      cells_(static_cast<uint32_t>(area_bytes / cell_bytes)),
      head_(head),
      tail_(tail) {}

uint32_t ShmRing::free_cells() const {
  const uint32_t consumed = tail_->value.load(std::memory_order_acquire);
  return cells_ - (next_ - consumed);
}

void ShmRing::write(const CellHeader& h, const char* data) {
  char* c = cell(next_);
  std::memcpy(c, &h, sizeof(h));
  if (h.bytes > 0) std::memcpy(c + sizeof(CellHeader), data, h.bytes);
  ++next_;
  head_->value.store(next_, std::memory_order_release);
}

const CellHeader* ShmRing::peek() const {
  const uint32_t written = head_->value.load(std::memory_order_acquire);
  if (written == next_) return nullptr;
  return reinterpret_cast<const CellHeader*>(cell(next_));
}

void ShmRing::consume() {
  ++next_;
  tail_->value.store(next_, std::memory_order_release);
}

}  // namespace fairring

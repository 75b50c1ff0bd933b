#include "p2p/spare_buffers.h"

#include <algorithm>

#include "kernels/first_touch.h"

namespace fairring {

SpareBuffers::Buffer SpareBuffers::take(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1);
  auto it = kept_.lower_bound(bytes);
  if (it != kept_.end() && it->first <= 2 * bytes) {
    Buffer b{std::move(it->second), it->first};
    held_ -= it->first;
    kept_.erase(it);
    return b;
  }
  Buffer b{std::unique_ptr<char[]>(new char[bytes]), bytes};
  advise_fresh_memory(b.data.get(), static_cast<int64_t>(bytes));
  return b;
}

void SpareBuffers::give(Buffer b) {
  if (!b.data || b.capacity > keep_) return;
  // Room for it: the smallest kept ones go first (the large ones are the
  // ones worth keeping warm).
  while (held_ + b.capacity > keep_ && !kept_.empty() && kept_.begin()->first <= b.capacity) {
    held_ -= kept_.begin()->first;
    kept_.erase(kept_.begin());
  }
  if (held_ + b.capacity > keep_) return;
  held_ += b.capacity;
  kept_.emplace(b.capacity, std::move(b.data));
}

}  // namespace fairring

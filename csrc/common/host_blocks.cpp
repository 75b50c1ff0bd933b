#include "common/host_blocks.h"

#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>

namespace fairring {

namespace {

constexpr int64_t kBlockAlign = int64_t{2} << 20;  // huge-page sized blocks: reusable across nearby sizes

struct Block {
  void* data;
  int64_t bytes;
};

class BlockCache {
 public:
  // A block of at least `bytes` (at most twice that), the one freed last
  // (the warmest), or a new one.
  Block take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
        if (it->bytes >= bytes && it->bytes <= 2 * bytes) {
          Block b = *it;
          free_.erase(std::next(it).base());
          cached_ -= b.bytes;
          return b;
        }
      }
    }
    const int64_t size = (bytes + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
    void* p = nullptr;
    if (posix_memalign(&p, kBlockAlign, size) != 0) throw std::bad_alloc();
    return Block{p, size};
  }
  void give(Block b) {
    std::deque<Block> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      cached_ += b.bytes;
      while (cached_ > kMaxCachedBytes) {  // the oldest out
        drop.push_back(free_.front());
        cached_ -= free_.front().bytes;
        free_.pop_front();
      }
    }
    for (Block& d : drop) std::free(d.data);
  }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  std::mutex mu_;
  std::deque<Block> free_;
  int64_t cached_ = 0;
};

// Never destroyed: a block may be released during exit.
BlockCache& cache() {
  static BlockCache* c = new BlockCache();
  return *c;
}

}  // namespace

HostBlock::HostBlock(int64_t bytes) {
  if (bytes >= kMinCachedBytes) {
    const Block b = cache().take(bytes);
    data_ = b.data;
    bytes_ = b.bytes;
  } else {
    bytes_ = bytes > 0 ? bytes : 1;
    data_ = std::malloc(static_cast<size_t>(bytes_));
    if (!data_) throw std::bad_alloc();
  }
}

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
  }
  return *this;
}

void HostBlock::reset() {
  if (!data_) return;
  if (bytes_ >= kMinCachedBytes) {
    cache().give(Block{data_, bytes_});
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

int64_t host_blocks_cached_bytes() { return cache().cached(); }

}  // namespace fairring

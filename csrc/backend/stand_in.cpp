#include "backend/stand_in.h"

#include <c10/core/Storage.h>

#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>

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

// Never destroyed: a tensor may release its block during exit.
BlockCache& cache() {
  static BlockCache* c = new BlockCache();
  return *c;
}

void release(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  cache().give(*b);
  delete b;
}

}  // namespace

at::Tensor stand_in(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  if (!options.device().is_cpu() || bytes < kMinCachedBytes) {
    return at::empty({numel}, options.memory_format(at::MemoryFormat::Contiguous));
  }
  auto* b = new Block(cache().take(bytes));
  c10::DataPtr ptr(b->data, b, &release, c10::Device(c10::DeviceType::CPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return at::empty({0}, options.memory_format(at::MemoryFormat::Contiguous)).set_(storage, 0, {numel}, {1});
}

int64_t stand_in_cached_bytes() { return cache().cached(); }

}  // namespace fairring

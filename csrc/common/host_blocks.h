// Host memory Fairring makes for itself, reused: a process-wide cache of the
// large blocks that earlier users released, so that a buffer needed again
// and again (a stand-in tensor, a message that came before its receive)
// does not fault in fresh pages every time (about 10 ms per 25 MiB here; on
// a VM that hands freed memory back to its host, sometimes ten times more).
// Framework-free, so every layer may use it.
#pragma once

#include <cstdint>

namespace fairring {

// Blocks of at least kMinCachedBytes are kept when released, up to
// kMaxCachedBytes in all (the oldest freed first beyond).
constexpr int64_t kMinCachedBytes = int64_t{1} << 20;
constexpr int64_t kMaxCachedBytes = int64_t{256} << 20;

// At least `bytes` of host memory, contents undefined: from the cache (a
// block of at most twice that, the one freed last: the warmest) or new, 2 MiB
// aligned, when `bytes` >= kMinCachedBytes; plain heap memory below.  Given
// back (to the cache, or freed) when it goes.
class HostBlock {
 public:
  HostBlock() = default;
  explicit HostBlock(int64_t bytes);
  ~HostBlock() { reset(); }
  HostBlock(HostBlock&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  char* data() const { return static_cast<char*>(data_); }
  int64_t bytes() const { return bytes_; }  // what it holds (rounded up for a cached block)
  void reset();

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Bytes the cache holds now (tests).
int64_t host_blocks_cached_bytes();

}  // namespace fairring

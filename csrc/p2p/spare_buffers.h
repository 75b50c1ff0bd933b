// Buffers for messages that arrive before their receive is posted, kept for
// the next ones.  A pipeline stage receives a message of the same size every
// micro-batch, often before it posts the receive: a new buffer each time is
// fresh memory (a page fault per 4 KiB page on the engine's thread), a kept
// one is warm.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

namespace fairring {

class SpareBuffers {
 public:
  struct Buffer {
    std::unique_ptr<char[]> data;
    uint64_t capacity = 0;
  };
  // Keeps at most `keep_bytes` of returned buffers.
  explicit SpareBuffers(uint64_t keep_bytes) : keep_(keep_bytes) {}
  // The smallest kept buffer of at least `bytes` (and at most twice that: a
  // small message does not pin a large buffer), or a new one (huge pages
  // advised where the machine allows: kernels/first_touch.h).
  Buffer take(uint64_t bytes);
  // Keeps `b` if it fits under the cap (dropping smaller kept ones to make
  // room), else frees it.
  void give(Buffer b);
  uint64_t held() const { return held_; }

 private:
  uint64_t keep_;
  uint64_t held_ = 0;
  std::multimap<uint64_t, std::unique_ptr<char[]>> kept_;  // by capacity
};

}  // namespace fairring

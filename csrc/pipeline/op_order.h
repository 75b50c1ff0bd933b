// The order rule of a process group: ops take effect in issue order when
// their memory overlaps and one of them writes it, exactly as if the later
// op had waited for the earlier one (what NCCL's stream order gives).  Ops
// that only read shared memory, or touch disjoint memory, still overlap.
//
// The pipeline (pipeline.h) keeps one OrderBook per engine: an op is entered
// when it is numbered and leaves when it completes.  An op that conflicts
// with one still pending is not started (neither staged nor its first slice)
// until every op it conflicts with has completed.  Pure bookkeeping, no I/O.
#pragma once

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <deque>
#include <utility>

namespace at {
class Tensor;
}

namespace fairring {

// Bytes [begin, end) of one address space (host, or a device's).
struct MemRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool overlaps(const MemRange& o) const { return begin < o.end && o.begin < end; }
};

// What an op reads and writes of its caller's memory.  A tensor's range is
// the span from its lowest to its highest element (a strided view covers the
// gaps between its elements: conservative, never too small).
struct Footprint {
  // Inline room for the usual one or two tensors: no allocation per op.
  c10::SmallVector<MemRange, 2> reads;
  c10::SmallVector<MemRange, 2> writes;

  // Memory that cannot be told (a sparse tensor's): conflicts with every op
  // that touches memory.
  bool everything = false;

  // What an op that may touch any memory conflicts with: every op that touches memory.
  static Footprint all_memory() {
    Footprint fp;
    fp.everything = true;
    return fp;
  }

  void read(const at::Tensor& t);
  void write(const at::Tensor& t);
  bool empty() const { return reads.empty() && writes.empty() && !everything; }
  // Whether an op with this footprint, issued after one with `earlier`, must
  // wait for it: a write of either overlaps what the other touches.
  bool conflicts_with(const Footprint& earlier) const;

 private:
  void add(c10::SmallVectorImpl<MemRange>& to, const at::Tensor& t);
};

// The span of a tensor's elements in memory; empty for a tensor of no elements.
MemRange range_of(const at::Tensor& t);

class OrderBook {
 public:
  // The number the op must wait for: 1 + the issue number of the latest
  // pending op it conflicts with, 0 if none.  Read-only.
  uint64_t must_follow(const Footprint& fp) const;
  // Enters op `seq` (numbers grow) and returns must_follow() for it.
  uint64_t enter(uint64_t seq, const Footprint& fp);
  // Op `seq` completed (or failed).
  void leave(uint64_t seq);
  // No op numbered below `follow` is pending: an op with must_follow ==
  // `follow` may start.
  bool clear_before(uint64_t follow) const { return pending_.empty() || pending_.front().first >= follow; }

 private:
  // In issue order (ops leave in that order but for failures); ops with no
  // footprint are not kept.  A deque: no allocation per op.
  std::deque<std::pair<uint64_t, Footprint>> pending_;
};

}  // namespace fairring

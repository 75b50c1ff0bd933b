#include "pipeline/op_order.h"

#include <ATen/core/Tensor.h>

namespace fairring {

namespace {

bool any_overlap(c10::ArrayRef<MemRange> a, c10::ArrayRef<MemRange> b) {
  for (const MemRange& x : a) {
    for (const MemRange& y : b) {
      if (x.overlaps(y)) return true;
    }
  }
  return false;
}

}  // namespace

MemRange range_of(const at::Tensor& t) {
  MemRange r;
  if (!t.defined() || t.numel() == 0) return r;
  // Element offsets of the lowest and highest element (strides may be negative or 0).
  int64_t lo = 0;
  int64_t hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const auto esize = static_cast<int64_t>(t.element_size());
  r.begin = base + static_cast<uintptr_t>(lo * esize);
  r.end = base + static_cast<uintptr_t>((hi + 1) * esize);
  return r;
}

void Footprint::add(c10::SmallVectorImpl<MemRange>& to, const at::Tensor& t) {
  if (t.defined() && t.layout() != c10::kStrided) {
    everything = true;  // a sparse tensor's memory is not one span
    return;
  }
  const MemRange r = range_of(t);
  if (r.end > r.begin) to.push_back(r);
}

void Footprint::read(const at::Tensor& t) { add(reads, t); }
void Footprint::write(const at::Tensor& t) { add(writes, t); }

bool Footprint::conflicts_with(const Footprint& earlier) const {
  if (empty() || earlier.empty()) return false;
  if (everything || earlier.everything) return true;
  return any_overlap(writes, earlier.writes) || any_overlap(writes, earlier.reads) ||
         any_overlap(reads, earlier.writes);
}

uint64_t OrderBook::must_follow(const Footprint& fp) const {
  if (fp.empty()) return 0;
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    if (fp.conflicts_with(it->second)) return it->first + 1;
  }
  return 0;
}

uint64_t OrderBook::enter(uint64_t seq, const Footprint& fp) {
  const uint64_t follow = must_follow(fp);
  if (!fp.empty()) pending_.emplace_back(seq, fp);
  return follow;
}

void OrderBook::leave(uint64_t seq) {
  if (!pending_.empty() && pending_.front().first == seq) {
    pending_.pop_front();
    return;
  }
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->first == seq) {
      pending_.erase(it);
      return;
    }
  }
}

}  // namespace fairring

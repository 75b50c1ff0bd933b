#include "pipeline/slice_schedule.h"
#include "common/error.h"
#include "topology/machine.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fairring {

namespace {

// The cache the ranks of a node share (machine.h); 16 MiB where the
// machine does not say (large() then starts at 4 MiB with two ranks).
int64_t cache_bytes() {
  static const int64_t bytes = [] {
    const int64_t b = shared_cache_bytes();
    return b > 0 ? b : int64_t{16} << 20;
  }();
  return bytes;
}

}  // namespace

SliceSchedule::SliceSchedule(const Topology& topo, int slots, NodeSlots& node, Mover& mover, RailExchange* rail)
    : topo_(topo),
      k_(topo.ranks_per_node),
      me_(topo.local_rank),
      node_(node),
      mover_(mover),
      rail_(rail),
      mirrors_(slots) {}

// Pipeline::submit refuses an op without a definition.  On uneven nodes a
// blockwise slice is staged even on a node of one rank: its rail's shard of
// a larger node holds several ranks' pieces, which lie apart in the tensors.
const Script& SliceSchedule::script_of(const Slice& s) const { return s.op->def->script(!staged(s)); }

bool SliceSchedule::staged(const Slice& s) const { return runs_node_steps(s.op->def->cut(), k_, topo_.uneven); }

bool SliceSchedule::front_done(const Slice& s) const { return static_cast<size_t>(s.phase) >= script_of(s).front; }

bool SliceSchedule::front(Slice& s, const TimePoint* until) { return run(s, until, true); }
bool SliceSchedule::back(Slice& s, const TimePoint* until) { return run(s, until, false); }

bool SliceSchedule::run(Slice& s, const TimePoint* until, bool front_half) {
  const Script& script = script_of(s);
  const size_t end = front_half ? script.front : script.steps.size();
  if (!s.begun) {
    mover_.begin(slot(s), *s.op);
    s.begun = true;
  }
  while (static_cast<size_t>(s.phase) < end) {
    if (!script.steps[s.phase].run(*this, s, until)) return false;
    ++s.phase;
  }
  if (!front_half) mover_.end(slot(s));
  return true;
}

bool SliceSchedule::large(int64_t bytes) const { return 2 * k_ * bytes > cache_bytes(); }

char* SliceSchedule::tensor_at(const Slice& s) const {
  return static_cast<char*>(s.op->buffer.data_ptr()) + s.plan.slice.offset * esize(s);
}

bool SliceSchedule::acquire(Slice& s, const TimePoint* until) {
  const int sl = slot(s);
  for (int x = 0; x < k_; ++x) {
    if (x != me_ && !node_.wait_free(s.id(), x, until)) return false;
  }
  if (!node_.first_use(s.seq)) {
    for (int x = 0; x < k_; ++x) {
      if (x != me_) mover_.after(sl, x, PeerStep::kConsumed);
    }
  }
  node_.claim(s.id(), s.op->key());
  return true;
}

void SliceSchedule::input_published(Slice& s) {
  // A node of one rank (staged on uneven nodes) has no peer to tell (mover.h).
  if (k_ > 1) mover_.done(slot(s), PeerStep::kInputReady);
  node_.publish_input(s.id());
}

bool SliceSchedule::inputs_in(Slice& s, const TimePoint* until) {
  for (int x = 0; x < k_; ++x) {
    if (x != me_ && !node_.wait_input(s.id(), x, until)) return false;
  }
  node_.check_match(s.id());
  return true;
}

bool SliceSchedule::wait_chunks(Slice& s, int n, const TimePoint* until) {
  for (int x = 0; x < n; ++x) {
    if (!node_.wait_chunk(s.id(), x, until)) return false;
  }
  return true;
}

bool SliceSchedule::carried_inputs_in(Slice& s, const TimePoint* until) {
  for (int x = me_ + topo_.rails; x < k_; x += topo_.rails) {
    if (!node_.wait_input(s.id(), x, until)) return false;
    mover_.after(slot(s), x, PeerStep::kInputReady);
  }
  return true;
}

bool SliceSchedule::carrier_done(Slice& s, const TimePoint* until) {
  const int from = carrier(me_);
  if (!node_.wait_chunk(s.id(), from, until)) return false;
  if (from != me_) mover_.after(slot(s), from, PeerStep::kChunkDone);
  return true;
}

void SliceSchedule::release(Slice& s) {
  // In slice order, also for a slice whose reads ended earlier: the counter
  // only moves forward.
  if (k_ > 1) mover_.done(slot(s), PeerStep::kConsumed);
  node_.release(s.id());
}

RailTask SliceSchedule::rail_task(const Slice& s) const {
  RailTask t;
  t.slice_seq = s.seq;
  t.slot = slot(s);
  t.key = s.op->key();
  t.divisor = avg_divisors(s).rail;  // AVG with none: the rails only add
  return t;
}

void SliceSchedule::post(RailTask task) {
  if (!rail_) throw Error(ErrorKind::kBackend, "fairring: a rail task posted on a single node");
  rail_->post(std::move(task));
}

void SliceSchedule::set_mirror(const Slice& s, const char* from, char* to, int64_t bytes) {
  mirrors_[slot(s)] = Mirror{from, to, bytes};
}

void SliceSchedule::publish_chunk(uint64_t slice_seq) {
  // The slot's mirror is not rewritten before our own gather of this slice
  // has seen the chunk published below.
  const int sl = node_.slot(slice_seq);
  const Mirror& m = mirrors_[sl];
  if (m.to) mover_.copy(sl, m.to, m.from, m.bytes, false);
  // Also without a copy: what the chunk's peers read may have been written
  // by an earlier step (an all-gather's publish-block) or by the rails.  A
  // node of one rank has no peer to tell (mover.h).
  if (k_ > 1) mover_.done(sl, PeerStep::kChunkDone);
  node_.publish_chunk(slice_seq);
}

char* SliceSchedule::block_at(const at::Tensor& t, const std::vector<at::Tensor>& blocks, const Slice& s, int j,
                              int x) const {
  const int64_t rank = rank_of(j, x);
  if (!blocks.empty()) return static_cast<char*>(blocks[rank].data_ptr()) + s.plan.slice.offset * esize(s);
  return static_cast<char*>(t.data_ptr()) + (rank * s.op->numel + s.plan.slice.offset) * esize(s);
}

char* SliceSchedule::input_block(const Slice& s, int j, int x) const {
  return block_at(s.op->buffer, s.op->input_blocks, s, j, x);
}

char* SliceSchedule::output_block(const Slice& s, int j, int x) const {
  return block_at(s.op->output, s.op->output_blocks, s, j, x);
}

char* SliceSchedule::own_piece(const at::Tensor& t, const Slice& s) const {
  return static_cast<char*>(t.data_ptr()) + s.plan.slice.offset * esize(s);
}

int64_t SliceSchedule::piece_count(const Slice& s, int from, int to) const {
  const Range& r = s.plan.slice;
  if (s.op->block_counts.empty()) return r.count;
  const int64_t block = s.op->block_counts[static_cast<size_t>(from) * topo_.size + to];
  return std::max<int64_t>(0, std::min(r.count, block - r.offset));
}
int64_t SliceSchedule::staged_at(const Slice& s, int j, int x) const { return blockwise_staged_at(s.plan, j, x); }

bool step_acquire(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until) { return p.acquire(s, until); }

bool step_await_own(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until) {
  return p.node().wait_chunk(s.id(), p.me(), until);
}

bool step_await_rails(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until) {
  // A passive rank (uneven nodes) posted no rail task: its carrier did.
  return !p.multi_node() || !p.owns_chunk(s) || step_await_own(p, s, until);
}

bool step_release(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint*) {
  p.release(s);
  return true;
}

}  // namespace fairring

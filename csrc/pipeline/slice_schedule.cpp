#include "pipeline/slice_schedule.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace fairring {

namespace {

// An op at least this large outgrows the caches: its result is written with
// non-temporal stores where the device has them (caching it only costs).
constexpr int64_t kLargeOpBytes = 4 << 20;

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kAcquire: return "acquire";
    case Phase::kPublishInput: return "publish-input";
    case Phase::kReduceChunk: return "reduce-chunk";
    case Phase::kExchange: return "exchange";
    case Phase::kGather: return "gather";
    case Phase::kRelease: return "release";
  }
  return "?";
}

PhaseList phases_of(Collective collective, int ranks_per_node) {
  // A barrier is an all-reduce of one byte: every rank's input must be in
  // before anyone's result is out.  A broadcast is, for now, a bitwise OR
  // of the root's bytes with zeros (exact for every dtype; twice the bytes a
  // dedicated broadcast phase list would move between nodes).
  if (collective != Collective::kAllReduce && collective != Collective::kBarrier &&
      collective != Collective::kBroadcast) {
    throw std::invalid_argument(std::string("fairring: no phase list for ") + collective_name(collective));
  }
  if (ranks_per_node == 1) return PhaseList{{Phase::kExchange, Phase::kGather}, 1};
  return PhaseList{{Phase::kAcquire, Phase::kPublishInput, Phase::kReduceChunk, Phase::kExchange, Phase::kGather,
                    Phase::kRelease},
                   4};
}

SliceSchedule::SliceSchedule(const Topology& topo, int slots, NodeSlots& node, Mover& mover, RailExchange* rail)
    : topo_(topo),
      k_(topo.ranks_per_node),
      me_(topo.local_rank),
      node_(node),
      mover_(mover),
      rail_(rail),
      allreduce_(phases_of(Collective::kAllReduce, topo.ranks_per_node)),
      mirrors_(slots) {}

const PhaseList& SliceSchedule::list_of(const Slice& s) const {
  if (s.op->collective != Collective::kAllReduce && s.op->collective != Collective::kBarrier &&
      s.op->collective != Collective::kBroadcast) {
    throw std::logic_error(std::string("fairring: no phase list for ") + collective_name(s.op->collective));
  }
  return allreduce_;
}

bool SliceSchedule::front_done(const Slice& s) const { return static_cast<size_t>(s.phase) >= list_of(s).front; }

bool SliceSchedule::front(Slice& s, const TimePoint* until) { return run(s, until, true); }
bool SliceSchedule::back(Slice& s, const TimePoint* until) { return run(s, until, false); }

bool SliceSchedule::run(Slice& s, const TimePoint* until, bool front_half) {
  const PhaseList& list = list_of(s);
  const size_t end = front_half ? list.front : list.phases.size();
  if (!s.begun) {
    mover_.begin(node_.slot(s.seq), *s.op);
    s.begun = true;
  }
  while (static_cast<size_t>(s.phase) < end) {
    bool finished = true;
    switch (list.phases[s.phase]) {
      case Phase::kAcquire: finished = acquire(s, until); break;
      case Phase::kPublishInput: publish_input(s); break;
      case Phase::kReduceChunk: finished = reduce_chunk(s, until); break;
      case Phase::kExchange: exchange(s); break;
      case Phase::kGather: finished = gather(s, until); break;
      case Phase::kRelease: release(s); break;
    }
    if (!finished) return false;
    ++s.phase;
  }
  if (!front_half) mover_.end(node_.slot(s.seq));
  return true;
}

char* SliceSchedule::tensor_at(const Slice& s) const {
  return static_cast<char*>(s.op->buffer.data_ptr()) + s.plan.slice.offset * c10::elementSize(s.op->dtype);
}

int64_t SliceSchedule::divisor(const Slice& s) const { return s.op->op == RedOp::kAvg ? topo_.size : 0; }

bool SliceSchedule::acquire(Slice& s, const TimePoint* until) {
  const int slot = node_.slot(s.seq);
  for (int x = 0; x < k_; ++x) {
    if (x != me_ && !node_.wait_free(s.id(), x, until)) return false;
  }
  if (!node_.first_use(s.seq)) {
    for (int x = 0; x < k_; ++x) {
      if (x != me_) mover_.after(slot, x, PeerStep::kConsumed);
    }
  }
  node_.claim(s.id(), s.op->key());
  return true;
}

void SliceSchedule::publish_input(Slice& s) {
  // Peers read our input for their chunks only: our own chunk we reduce
  // straight from the tensor, so it is not copied.  A replicated slice is
  // reduced by everyone, so all of it is shared.
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(s.op->dtype);
  const Range own = owns_chunk(s) && !s.plan.replicated ? s.plan.chunks[me_] : Range{s.plan.slice.count, 0};
  const char* tensor = tensor_at(s);
  char* in = mover_.input_area(slot, me_);
  const int64_t tail = own.offset + own.count;
  if (own.offset > 0) mover_.copy(slot, in, tensor, own.offset * esize, false);
  if (s.plan.slice.count > tail) {
    mover_.copy(slot, in + tail * esize, tensor + tail * esize, (s.plan.slice.count - tail) * esize, false);
  }
  mover_.done(slot, PeerStep::kInputReady);
  node_.publish_input(s.id());
}

bool SliceSchedule::reduce_chunk(Slice& s, const TimePoint* until) {
  for (int x = 0; x < k_; ++x) {
    if (x != me_ && !node_.wait_input(s.id(), x, until)) return false;
  }
  node_.check_match(s.id());
  // A replicated slice is reduced whole, straight into the tensor: the
  // result is complete, nothing to gather.  Otherwise our chunk, if the
  // plan gave us one (a small slice has fewer chunks than ranks).
  if (!s.plan.replicated && !owns_chunk(s)) return true;
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const Range r = s.plan.replicated ? Range{0, s.plan.slice.count} : s.plan.chunks[me_];
  char* chunk = tensor_at(s) + r.offset * esize;
  const void* inputs[kMaxLocalRanks];
  for (int x = 0; x < k_; ++x) {
    if (x != me_) mover_.after(slot, x, PeerStep::kInputReady);
    inputs[x] = x == me_ ? chunk : mover_.input_area(slot, x) + r.offset * esize;
  }
  // Divided here only if no rail server will do it.
  const int64_t div = topo_.num_nodes == 1 ? divisor(s) : 0;
  mover_.reduce(slot, op.dtype, op.op, chunk, inputs, k_, r.count, div);
  return true;
}

void SliceSchedule::exchange(Slice& s) {
  if (s.plan.replicated || !owns_chunk(s)) return;
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const Range own = s.plan.chunks[me_];
  char* chunk = tensor_at(s) + own.offset * esize;
  // Our chunk is reduced in place, in our tensor; the peers' gather reads a
  // copy of it in our output area, made once it is final, so that our own
  // gather copies the other chunks only.  A node of one has no peers.
  mirrors_[slot] = k_ > 1 ? Mirror{chunk, mover_.output_area(slot, me_) + own.offset * esize, own.count * esize}
                          : Mirror{};
  if (!rail_) {
    publish_chunk(s.seq);
    return;
  }
  RailTask t;
  t.slice_seq = s.seq;
  t.slot = slot;
  t.key = op.key();
  t.chunk = chunk;
  t.shards = s.plan.shards[me_];
  t.divisor = divisor(s);
  rail_->post(std::move(t));
}

void SliceSchedule::publish_chunk(uint64_t slice_seq) {
  // The slot's mirror is not rewritten before our own gather of this slice
  // has seen the chunk published below.
  const int slot = node_.slot(slice_seq);
  const Mirror& m = mirrors_[slot];
  if (m.to) {
    mover_.copy(slot, m.to, m.from, m.bytes, false);
    mover_.done(slot, PeerStep::kChunkDone);
  }
  node_.publish_chunk(slice_seq);
}

bool SliceSchedule::gather(Slice& s, const TimePoint* until) {
  if (s.plan.replicated) return true;
  for (int x = 0; x < s.plan.num_chunks(); ++x) {
    if (!node_.wait_chunk(s.id(), x, until)) return false;
  }
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const bool large = op.numel * esize >= kLargeOpBytes;
  char* tensor = tensor_at(s);
  for (int x = 0; x < s.plan.num_chunks(); ++x) {
    const Range& r = s.plan.chunks[x];
    if (x == me_ || r.count == 0) continue;  // ours is in the tensor already
    mover_.after(slot, x, PeerStep::kChunkDone);
    mover_.copy(slot, tensor + r.offset * esize, mover_.output_area(slot, x) + r.offset * esize, r.count * esize,
                large);
  }
  return true;
}

void SliceSchedule::release(Slice& s) {
  // In slice order, also for a replicated slice (whose reads ended in
  // reduce-chunk): the counter only moves forward.
  mover_.done(node_.slot(s.seq), PeerStep::kConsumed);
  node_.release(s.id());
}

}  // namespace fairring

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
    case Phase::kStageBlocks: return "stage-blocks";
    case Phase::kReduceBlocks: return "reduce-blocks";
    case Phase::kPublishBlock: return "publish-block";
    case Phase::kExchangeBlocks: return "exchange-blocks";
    case Phase::kAwaitOwn: return "await-own";
    case Phase::kGatherBlocks: return "gather-blocks";
    case Phase::kPublishRoot: return "publish-root";
    case Phase::kExchangeRoot: return "exchange-root";
    case Phase::kGatherRoot: return "gather-root";
  }
  return "?";
}

PhaseList phases_of(Collective collective, int ranks_per_node) {
  // A barrier is an all-reduce of one byte: every rank's input must be in
  // before anyone's result is out.
  const bool alone = ranks_per_node == 1;
  switch (collective) {
    case Collective::kAllReduce:
    case Collective::kBarrier:
      if (alone) return PhaseList{{Phase::kExchange, Phase::kGather}, 1};
      return PhaseList{{Phase::kAcquire, Phase::kPublishInput, Phase::kReduceChunk, Phase::kExchange, Phase::kGather,
                        Phase::kRelease},
                       4};
    case Collective::kReduceScatter:
      if (alone) return PhaseList{{Phase::kExchangeBlocks, Phase::kAwaitOwn}, 1};
      return PhaseList{{Phase::kAcquire, Phase::kStageBlocks, Phase::kReduceBlocks, Phase::kExchangeBlocks,
                        Phase::kAwaitOwn, Phase::kRelease},
                       4};
    case Collective::kBroadcast:
      if (alone) return PhaseList{{Phase::kExchangeRoot, Phase::kGatherRoot}, 1};
      return PhaseList{{Phase::kAcquire, Phase::kPublishRoot, Phase::kExchangeRoot, Phase::kGatherRoot,
                        Phase::kRelease},
                       3};
    case Collective::kAllGather:
      if (alone) return PhaseList{{Phase::kExchangeBlocks, Phase::kAwaitOwn}, 1};
      return PhaseList{{Phase::kAcquire, Phase::kPublishBlock, Phase::kExchangeBlocks, Phase::kGatherBlocks,
                        Phase::kRelease},
                       3};
  }
  throw std::invalid_argument(std::string("fairring: no phase list for ") + collective_name(collective));
}

SliceSchedule::SliceSchedule(const Topology& topo, int slots, NodeSlots& node, Mover& mover, RailExchange* rail)
    : topo_(topo),
      k_(topo.ranks_per_node),
      me_(topo.local_rank),
      node_(node),
      mover_(mover),
      rail_(rail),
      allreduce_(phases_of(Collective::kAllReduce, topo.ranks_per_node)),
      reduce_scatter_(phases_of(Collective::kReduceScatter, topo.ranks_per_node)),
      all_gather_(phases_of(Collective::kAllGather, topo.ranks_per_node)),
      broadcast_(phases_of(Collective::kBroadcast, topo.ranks_per_node)),
      mirrors_(slots) {}

const PhaseList& SliceSchedule::list_of(const Slice& s) const {
  switch (s.op->collective) {
    case Collective::kReduceScatter: return reduce_scatter_;
    case Collective::kAllGather: return all_gather_;
    case Collective::kBroadcast: return broadcast_;
    default: return allreduce_;
  }
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
      case Phase::kStageBlocks: stage_blocks(s); break;
      case Phase::kReduceBlocks: finished = reduce_blocks(s, until); break;
      case Phase::kPublishBlock: publish_block(s); break;
      case Phase::kExchangeBlocks: exchange_blocks(s); break;
      case Phase::kAwaitOwn: finished = await_own(s, until); break;
      case Phase::kGatherBlocks: finished = gather_blocks(s, until); break;
      case Phase::kPublishRoot: publish_root(s); break;
      case Phase::kExchangeRoot: finished = exchange_root(s, until); break;
      case Phase::kGatherRoot: finished = gather_root(s, until); break;
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

void SliceSchedule::input_published(Slice& s) {
  mover_.done(node_.slot(s.seq), PeerStep::kInputReady);
  node_.publish_input(s.id());
}

bool SliceSchedule::inputs_in(Slice& s, const TimePoint* until) {
  for (int x = 0; x < k_; ++x) {
    if (x != me_ && !node_.wait_input(s.id(), x, until)) return false;
  }
  node_.check_match(s.id());
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
  input_published(s);
}

bool SliceSchedule::reduce_chunk(Slice& s, const TimePoint* until) {
  if (!inputs_in(s, until)) return false;
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
  RailTask t = rail_task(s);
  t.chunk = chunk;
  t.shards = s.plan.shards[me_];
  t.divisor = divisor(s);
  rail_->post(std::move(t));
}

RailTask SliceSchedule::rail_task(const Slice& s) const {
  RailTask t;
  t.slice_seq = s.seq;
  t.slot = node_.slot(s.seq);
  t.key = s.op->key();
  return t;
}

void SliceSchedule::publish_chunk(uint64_t slice_seq) {
  // The slot's mirror is not rewritten before our own gather of this slice
  // has seen the chunk published below.
  const int slot = node_.slot(slice_seq);
  const Mirror& m = mirrors_[slot];
  if (m.to) mover_.copy(slot, m.to, m.from, m.bytes, false);
  // Also without a copy: what the chunk's peers read may have been written
  // by an earlier step (an all-gather's publish-block) or by the rails.  A
  // node of one rank has no peer to tell (mover.h).
  if (k_ > 1) mover_.done(slot, PeerStep::kChunkDone);
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

// ---- Blockwise collectives: reduce-scatter and all-gather ----

char* SliceSchedule::block_at(const at::Tensor& t, const Slice& s, int j, int x) const {
  const int64_t rank = topo_.node_ranks[j][x];
  return static_cast<char*>(t.data_ptr()) + (rank * s.op->numel + s.plan.slice.offset) * c10::elementSize(s.op->dtype);
}

char* SliceSchedule::own_piece(const at::Tensor& t, const Slice& s) const {
  return static_cast<char*>(t.data_ptr()) + s.plan.slice.offset * c10::elementSize(s.op->dtype);
}

int64_t SliceSchedule::staged_at(const Slice& s, int j, int x) const {
  return (int64_t{x} * topo_.num_nodes + j) * s.plan.slice.count;
}

void SliceSchedule::stage_blocks(Slice& s) {
  // The peers' chunks only: ours is reduced straight from the tensor.
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(s.op->dtype);
  char* in = mover_.input_area(slot, me_);
  for (int x = 0; x < k_; ++x) {
    if (x == me_) continue;
    for (int j = 0; j < topo_.num_nodes; ++j) {
      mover_.copy(slot, in + staged_at(s, j, x) * esize, block_at(s.op->buffer, s, j, x),
                  s.plan.slice.count * esize, false);
    }
  }
  input_published(s);
}

bool SliceSchedule::reduce_blocks(Slice& s, const TimePoint* until) {
  if (!inputs_in(s, until)) return false;
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  for (int x = 0; x < k_; ++x) {
    if (x != me_) mover_.after(slot, x, PeerStep::kInputReady);
  }
  // Our chunk holds the slice of each node's block of our rail: reduced one
  // node at a time, our term read from the tensor, the peers' from their
  // input areas, in local-rank order.  One node: the result is our own
  // piece.  Otherwise it goes to the rails from our output area, and the
  // servers divide.
  const bool one_node = topo_.num_nodes == 1;
  for (int j = 0; j < topo_.num_nodes; ++j) {
    const int64_t at = staged_at(s, j, me_) * esize;
    const void* inputs[kMaxLocalRanks];
    for (int x = 0; x < k_; ++x) {
      inputs[x] = x == me_ ? block_at(op.buffer, s, j, me_) : mover_.input_area(slot, x) + at;
    }
    char* out = one_node ? own_piece(op.output, s) : mover_.output_area(slot, me_) + at;
    mover_.reduce(slot, op.dtype, op.op, out, inputs, k_, s.plan.slice.count, one_node ? divisor(s) : 0);
  }
  return true;
}

void SliceSchedule::publish_block(Slice& s) {
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(s.op->dtype);
  mover_.copy(slot, mover_.output_area(slot, me_) + staged_at(s, topo_.node, me_) * esize,
              own_piece(s.op->buffer, s), s.plan.slice.count * esize, false);
  // No input area to share, but every other phase list waits for every
  // peer's input before check_match: a peer that issued another collective
  // must get there and see the mismatch, not wait for an input that never comes.
  input_published(s);
}

void SliceSchedule::exchange_blocks(Slice& s) {
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const bool gather = op.collective == Collective::kAllGather;
  mirrors_[slot] = Mirror{};  // nothing for the node's peers to read
  if (k_ == 1) {
    // Our own block: all-gather copies it (unless the input is that block
    // already); a reduce-scatter of one rank is a copy too.
    char* to = gather ? block_at(op.output, s, topo_.node, 0) : own_piece(op.output, s);
    const char* from = gather ? own_piece(op.buffer, s) : block_at(op.buffer, s, topo_.node, 0);
    if (!rail_ || gather) {
      if (to != from) mover_.copy(slot, to, from, s.plan.slice.count * esize, false);
    }
  }
  if (!rail_) {
    publish_chunk(s.seq);
    return;
  }
  RailTask t = rail_task(s);
  t.shards = s.plan.shards[me_];
  t.divisor = divisor(s);
  for (int j = 0; j < topo_.num_nodes; ++j) {
    char* piece;
    if (k_ > 1) {
      piece = mover_.output_area(slot, me_) + staged_at(s, j, me_) * esize;
    } else if (gather) {
      piece = j == topo_.node ? own_piece(op.buffer, s) : block_at(op.output, s, j, 0);
    } else {
      piece = block_at(op.buffer, s, j, 0);  // only read
    }
    t.pieces.push_back(piece);
  }
  if (!gather) t.result = own_piece(op.output, s);
  rail_->post(std::move(t));
}

bool SliceSchedule::await_own(Slice& s, const TimePoint* until) {
  // The rails are done with the slice (and the slot's areas).
  return node_.wait_chunk(s.id(), me_, until);
}

bool SliceSchedule::gather_blocks(Slice& s, const TimePoint* until) {
  for (int x = 0; x < k_; ++x) {
    if (!node_.wait_chunk(s.id(), x, until)) return false;
  }
  node_.check_match(s.id());
  const PipelineOp& op = *s.op;
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const bool large = op.numel * topo_.size * esize >= kLargeOpBytes;
  for (int x = 0; x < k_; ++x) {
    if (x != me_) mover_.after(slot, x, PeerStep::kChunkDone);
    for (int j = 0; j < topo_.num_nodes; ++j) {
      char* to = block_at(op.output, s, j, x);
      const char* from = mover_.output_area(slot, x) + staged_at(s, j, x) * esize;
      mover_.copy(slot, to, from, s.plan.slice.count * esize, large);
    }
  }
  return true;
}

// ---- Broadcast: the root's slice to every rank ----

void SliceSchedule::publish_root(Slice& s) {
  // Everyone publishes (the others nothing): waiting for every peer's input
  // is what says every peer has claimed the slot, for check_match.
  const int slot = node_.slot(s.seq);
  if (topo_.rank == s.op->root) {
    mover_.copy(slot, mover_.input_area(slot, me_), tensor_at(s),
                s.plan.slice.count * c10::elementSize(s.op->dtype), false);
  }
  input_published(s);
}

bool SliceSchedule::exchange_root(Slice& s, const TimePoint* until) {
  const int slot = node_.slot(s.seq);
  mirrors_[slot] = Mirror{};
  // Between nodes, each local rank carries its chunk of the slice (if the
  // plan gives it one) on its rail, after its node agreed on the op.  A rank
  // with nothing to carry checks the op in gather_root: waiting for the
  // root's copy here, in the front half, would hold back the copies out of
  // the slices before it (the root and its peers would take turns).
  if (!carries_chunk(s)) return true;
  if (k_ > 1 && !inputs_in(s, until)) return false;
  const PipelineOp& op = *s.op;
  const auto [root_node, root_local] = topo_.place_of(op.root);
  const int64_t esize = c10::elementSize(op.dtype);
  const Range own = s.plan.chunks[me_];
  char* chunk;
  if (topo_.node == root_node) {
    chunk = k_ == 1 ? tensor_at(s) : mover_.input_area(slot, root_local);
    if (root_local != me_) mover_.after(slot, root_local, PeerStep::kInputReady);
  } else {
    chunk = k_ == 1 ? tensor_at(s) : mover_.output_area(slot, me_);
  }
  chunk += own.offset * esize;
  RailTask t = rail_task(s);
  // Shared by the root's node; the other nodes' shards are empty.
  t.shards.assign(topo_.num_nodes, Range{0, 0});
  t.shards[root_node].count = own.count;
  t.pieces.assign(topo_.num_nodes, chunk);
  rail_->post(std::move(t));
  return true;
}

bool SliceSchedule::gather_root(Slice& s, const TimePoint* until) {
  const PipelineOp& op = *s.op;
  const auto [root_node, root_local] = topo_.place_of(op.root);
  const int slot = node_.slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  const bool large = op.numel * esize >= kLargeOpBytes;
  if (k_ > 1 && !carries_chunk(s) && !inputs_in(s, until)) return false;
  // Between nodes, every chunk's exchange carried every node's key (sent
  // after its node's check_match), so once they are over no node ran another
  // collective; on the root's node they are also done reading the root's area.
  if (rail_) {
    for (int x = 0; x < s.plan.num_chunks(); ++x) {
      if (!node_.wait_chunk(s.id(), x, until)) return false;
    }
  }
  if (topo_.node == root_node) {
    if (me_ != root_local) {
      mover_.after(slot, root_local, PeerStep::kInputReady);
      mover_.copy(slot, tensor_at(s), mover_.input_area(slot, root_local), s.plan.slice.count * esize, large);
    }
    return true;
  }
  if (k_ == 1) return true;  // the rail wrote into the tensor
  for (int x = 0; x < s.plan.num_chunks(); ++x) {
    const Range& r = s.plan.chunks[x];
    if (x != me_) mover_.after(slot, x, PeerStep::kChunkDone);
    mover_.copy(slot, tensor_at(s) + r.offset * esize, mover_.output_area(slot, x) + r.offset * esize,
                r.count * esize, large);
  }
  return true;
}

}  // namespace fairring

#include "allreduce/host_engine.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <stdexcept>

#include "kernels/copy_cpu.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

namespace {

// Ops up to this size run on the caller's thread when the engine is idle.
// Larger ones would keep the caller from overlapping them with its work.
constexpr int64_t kInlineMaxBytes = 64 << 10;
// Results of ops at least this large are written to the tensor with
// non-temporal stores: it outgrows the caches, so caching it only costs.
constexpr int64_t kStreamingBytes = 4 << 20;

// Staging memory of one rank: its share of the node's shared slot areas (K
// inputs + 1 output, none for a node of one) and, between nodes, the buffers
// its reduction server receives the peers' shards into.
int64_t required_memory(const Config& c, const PlanParams& p, int k, int n) {
  const int64_t shared = k > 1 ? c.slice_size * (k + 1) / k : 0;
  const int64_t staging = n > 1 ? (n - 1) * max_shard_bytes(p, k, n) : 0;
  return (shared + staging) * c.parallelism;
}

}  // namespace

HostEngine::HostEngine(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const Config& config,
                       const std::string& job_uid, const Secret& secret)
    : Pipeline(topo, config, "") {
  require_memory(required_memory(config, params(), topo.ranks_per_node, topo.num_nodes));
  set_arena(std::make_unique<NodeArena>(store, topo, job_uid, num_slots(), config.slice_size, config.timeout));

  if (topo.num_nodes > 1) {
    RailStage::Callbacks cb;
    cb.slice_done = [this](uint64_t seq) { chunk_back(seq); };
    cb.failed = [this](const std::string& why) { fail(why); };
    mirrors_.resize(num_slots());
    rail_ = connect_rail(store, topo, config, params(), secret, std::move(cb), mesh_);
  }
  start();
}

HostEngine::~HostEngine() {
  stop();
  rail_.reset();
  mesh_.reset();
}

bool HostEngine::runs_inline(const PipelineOp& op) const {
  const int64_t esize = c10::elementSize(op.dtype);
  return op.numel * esize <= kInlineMaxBytes && num_slices(op.numel, esize, params()) == 1;
}

void HostEngine::on_failed(const std::string& why) {
  if (rail_) rail_->abort(why);
}

bool HostEngine::reduce_scatter(Slice& s, const TimePoint* until) {
  const PipelineOp& op = *s.op;
  const int k = topo().ranks_per_node;
  const int me = topo().local_rank;
  const SliceId id = s.id();
  NodeArena& arena = slots().arena();
  const int slot = slots().slot(s.seq);
  const int64_t esize = c10::elementSize(op.dtype);
  char* tensor = static_cast<char*>(op.buffer.data_ptr()) + s.plan.slice.offset * esize;
  const int64_t divisor = (op.op == RedOp::kAvg) ? topo().size : 0;

  char* chunk = tensor;
  Mirror mirror;
  if (k > 1) {
    // Peers read our input for their chunks only; our own chunk we reduce
    // straight from the tensor, so it is not copied.  A replicated slice is
    // reduced by everyone, so all of it is shared.
    const bool own_chunk = me < s.plan.num_chunks();
    const Range own = own_chunk && !s.plan.replicated ? s.plan.chunks[me] : Range{s.plan.slice.count, 0};
    if (s.stage == Stage::kSlotFree) {
      for (int x = 0; x < k; ++x) {
        if (x != me && !slots().wait_free(id, x, until)) return false;
      }
      slots().claim(id, op.key());
      char* in = arena.input_area(slot, me);
      std::memcpy(in, tensor, own.offset * esize);
      const int64_t tail = own.offset + own.count;
      std::memcpy(in + tail * esize, tensor + tail * esize, (s.plan.slice.count - tail) * esize);
      slots().publish_input(id);
      s.stage = Stage::kInputs;
    }
    for (int x = 0; x < k; ++x) {
      if (x != me && !slots().wait_input(id, x, until)) return false;
    }
    slots().check_match(id);
    s.stage = Stage::kGather;
    const void* inputs[kMaxLocalRanks];
    if (s.plan.replicated) {
      // Straight into the tensor: the result is complete, nothing to gather.
      for (int x = 0; x < k; ++x) inputs[x] = x == me ? tensor : arena.input_area(slot, x);
      reduce_cpu(op.dtype, op.op, tensor, inputs, k, s.plan.slice.count, divisor);
      return true;
    }
    if (!own_chunk) return true;  // small slice: fewer chunks than ranks
    for (int x = 0; x < k; ++x) {
      inputs[x] = (x == me ? tensor : arena.input_area(slot, x)) + own.offset * esize;
    }
    // Our chunk is reduced in place, in our tensor; the peers' all-gather
    // reads a copy of it in the shared output area, made from the cache
    // once it is final (here, or by the rail stage after the network), so
    // that our own all-gather copies the other chunks only.
    chunk = tensor + own.offset * esize;
    mirror = Mirror{chunk, arena.output_area(slot) + own.offset * esize, static_cast<size_t>(own.count * esize)};
    reduce_cpu(op.dtype, op.op, chunk, inputs, k, own.count, topo().num_nodes == 1 ? divisor : 0);
    if (!rail_) std::memcpy(mirror.to, mirror.from, mirror.bytes);
  }
  // A node of one rank (k == 1) reduces nothing locally: its chunk is the
  // slice of its own tensor, which goes to the rail as it is.
  s.stage = Stage::kGather;

  if (rail_) {
    RailTask t;
    t.slice_seq = s.seq;
    t.key = op.key();
    t.chunk = chunk;
    mirrors_[slot] = mirror;  // read by chunk_back, ordered by post()
    t.shards = s.plan.shards[me];
    t.divisor = divisor;
    rail_->post(std::move(t));
  } else {
    slots().publish_chunk(s.seq);
  }
  return true;
}

void HostEngine::chunk_back(uint64_t slice_seq) {
  // The slot's entry is not rewritten before our own all-gather of this
  // slice has seen the chunk published below.
  const Mirror& m = mirrors_[slots().slot(slice_seq)];
  if (m.to) std::memcpy(m.to, m.from, m.bytes);
  slots().publish_chunk(slice_seq);
}

bool HostEngine::all_gather(Slice& s, const TimePoint* until) {
  const PipelineOp& op = *s.op;
  const int k = topo().ranks_per_node;
  const int me = topo().local_rank;
  const SliceId id = s.id();
  if (k == 1) {
    if (!slots().wait_chunk(id, me, until)) return false;
    s.stage = Stage::kDone;
    return true;
  }
  if (!s.plan.replicated) {
    for (int x = 0; x < s.plan.num_chunks(); ++x) {
      if (!slots().wait_chunk(id, x, until)) return false;
    }
    const int64_t esize = c10::elementSize(op.dtype);
    char* tensor = static_cast<char*>(op.buffer.data_ptr()) + s.plan.slice.offset * esize;
    const char* gathered = slots().arena().output_area(slots().slot(s.seq));
    auto copy = [&](int64_t from, int64_t to) {  // elements [from, to) of the slice
      if (to <= from) return;
      if (op.numel * esize >= kStreamingBytes) {
        copy_streaming(tensor + from * esize, gathered + from * esize, (to - from) * esize);
      } else {
        std::memcpy(tensor + from * esize, gathered + from * esize, (to - from) * esize);
      }
    };
    // Our own chunk is in the tensor already.
    const bool own_in_place = me < s.plan.num_chunks();
    const Range skip = own_in_place ? s.plan.chunks[me] : Range{s.plan.slice.count, 0};
    copy(0, skip.offset);
    copy(skip.offset + skip.count, s.plan.slice.count);
  }
  // Released here, in slice order, also for a replicated slice (whose reads
  // ended in reduce_scatter): the counter only moves forward.
  slots().release(id);
  s.stage = Stage::kDone;
  return true;
}

void HostEngine::settle(PipelineOp& base, std::exception_ptr& error) {
  auto& op = static_cast<AllreduceOp&>(base);
  if (error || op.users.empty()) return;
  try {
    at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
    const at::Tensor flat = op.buffer.reshape({-1});
    int64_t offset = 0;
    for (at::Tensor& u : op.users) {
      u.copy_(flat.narrow(0, offset, u.numel()).view(u.sizes()));
      offset += u.numel();
    }
  } catch (...) {
    error = std::current_exception();
  }
}

std::function<void()> HostEngine::completion_call(const std::shared_ptr<PipelineOp>& base, std::exception_ptr error) {
  auto& op = static_cast<AllreduceOp&>(*base);
  auto after = std::move(op.after_complete);
  op.after_complete = nullptr;
  if (!after) return nullptr;
  // Holds the Work, not the op: its tensors go with the pipeline's slices.
  return [after = std::move(after), error] { after(error); };
}

}  // namespace fairring

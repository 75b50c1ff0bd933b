#include "node/node_slots.h"

namespace fairring {

NodeSlots::NodeSlots(NodeArena& arena, const Topology& topo, int slots, MakeCheck make_check, const char* device,
                     std::chrono::microseconds spin)
    : arena_(arena),
      control_(arena.control()),
      topo_(topo),
      slots_(slots),
      make_check_(std::move(make_check)),
      device_(device),
      spin_(spin) {}

void NodeSlots::announce(uint64_t op_seq) {
  control_.issued[topo_.local_rank].store(op_seq + 1, std::memory_order_release);
}

bool NodeSlots::await(SharedCounter& c, uint32_t target, int peer, const char* what, const SliceId& s, bool via_network,
                      const TimePoint* until) {
  if (until) return counter_spin(c, target, *until);
  counter_wait(c, target, make_check_(peer, what, s, via_network), spin_);
  return true;
}

bool NodeSlots::wait_free(const SliceId& s, int peer, const TimePoint* until) {
  if (first_use(s.slice_seq)) return true;
  return await(control_.consumed[peer], mark(s.slice_seq - slots_), peer, "release a pipeline slot", s, false, until);
}

void NodeSlots::claim(const SliceId& s, const OpKey& key) {
  arena_.header(slot(s.slice_seq), topo_.local_rank) = SlotHeader{key, s.slice_seq};
}

void NodeSlots::publish_input(const SliceId& s) {
  counter_publish(control_.in_ready[topo_.local_rank], mark(s.slice_seq));
}

bool NodeSlots::wait_input(const SliceId& s, int peer, const TimePoint* until) {
  return await(control_.in_ready[peer], mark(s.slice_seq), peer, "provide its input", s, false, until);
}

void NodeSlots::check_match(const SliceId& s) {
  const int at = slot(s.slice_seq);
  const SlotHeader& mine = arena_.header(at, topo_.local_rank);
  for (int x = 0; x < topo_.ranks_per_node; ++x) {
    const SlotHeader& h = arena_.header(at, x);
    const int peer = topo_.local_ranks()[x];
    check_same_op(mine.key, topo_.rank, h.key, peer, device_);
    if (h.slice_seq != mine.slice_seq) throw_out_of_step(mine.key, topo_.rank, peer, device_);
  }
}

void NodeSlots::publish_chunk(uint64_t slice_seq) {
  counter_publish(control_.chunk_done[topo_.local_rank], mark(slice_seq));
}

bool NodeSlots::wait_chunk(const SliceId& s, int owner, const TimePoint* until) {
  // Between nodes a chunk is final once it is back from the rails: the
  // owner's step waits on the network, so it gets the network's deadline.
  const int peer = owner == topo_.local_rank ? -1 : owner;
  return await(control_.chunk_done[owner], mark(s.slice_seq), peer, "finish reducing its chunk", s, topo_.num_nodes > 1,
               until);
}

void NodeSlots::release(const SliceId& s) { counter_publish(control_.consumed[topo_.local_rank], mark(s.slice_seq)); }

}  // namespace fairring

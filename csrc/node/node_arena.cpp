#include "node/node_arena.h"

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/fault_injection.h"
#include "common/log.h"
#include "common/error.h"
#include <new>
#include <stdexcept>

namespace fairring {

namespace {
int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
// Every segment's name starts with this (tests and the sweep look for it).
constexpr const char* kShmPrefix = "fairring-";
// Each part of the segment starts on its own page.
constexpr int64_t kPageBytes = 4096;
}  // namespace

NodeArena::NodeArena(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& job_uid,
                     int slots, int64_t slot_area_bytes, std::chrono::milliseconds timeout, int counters_per_slot) {
  ranks_ = topo.ranks_per_node;
  counters_per_slot_ = counters_per_slot;
  if (ranks_ > kMaxLocalRanks) {
    throw Error(ErrorKind::kBackend, "fairring: " + std::to_string(ranks_) + " ranks on one node; at most " +
                                         std::to_string(kMaxLocalRanks) + " are supported");
  }
  const int64_t control_bytes = round_up(sizeof(NodeControl), kPageBytes);
  const int64_t header_bytes = round_up(sizeof(SlotHeader) * slots * ranks_, kPageBytes) +
                               round_up(sizeof(SharedCounter) * slots * ranks_ * counters_per_slot, kPageBytes);

  area_ = round_up(slot_area_bytes, kPageBytes);
  if (ranks_ == 1) {
    // Nothing to share: the counters live in private memory, and so do the
    // slot areas where a node of one rank has any use for them (uneven
    // nodes: the blockwise collectives stage their rail's pieces there).
    if (!topo.uneven) area_ = 0;
    const int64_t areas = area_ * (ranks_ + 1) * slots;
    private_.reset(new char[control_bytes + header_bytes + areas]());
    control_ = new (private_.get()) NodeControl();
    headers_ = reinterpret_cast<SlotHeader*>(private_.get() + control_bytes);
    counters_ = reinterpret_cast<SharedCounter*>(private_.get() + control_bytes +
                                                 round_up(sizeof(SlotHeader) * slots * ranks_, kPageBytes));
    if (area_ > 0) data_ = private_.get() + control_bytes + header_bytes;
    control_->pids[0] = getpid();
    return;
  }

  const int64_t total = control_bytes + header_bytes + area_ * (ranks_ + 1) * slots;
  const std::string ready_key = "fairring/shm_ready/" + std::to_string(topo.node);
  const std::string mapped_key = "fairring/shm_mapped/" + std::to_string(topo.node);

  // The segment is created once every local rank is here to open it, so
  // that its name exists from its creation to the last rank's open (a few
  // milliseconds), not for as long as the slowest rank takes to start: a
  // job killed meanwhile leaves nothing in /dev/shm.
  const std::string here_key = "fairring/shm_here/" + std::to_string(topo.node) + "/";
  if (topo.local_rank != 0) {
    // FAIRRING_TEST_ARENA_DELAY_MS: a rank slow to get here (tests).
    std::this_thread::sleep_for(test_delay("FAIRRING_TEST_ARENA_DELAY_MS"));
    store->set(here_key + std::to_string(topo.local_rank), std::vector<uint8_t>{1});
  }

  if (topo.local_rank == 0) {
    std::vector<std::string> here;
    for (int x = 1; x < ranks_; ++x) here.push_back(here_key + std::to_string(x));
    store->wait(here, timeout);
    // Names a crash left behind (see below) go first.
    if (int n = sweep_stale_segments()) {
      FAIRRING_DEBUG_LOG(topo.rank, "removed %d shared memory segment(s) of crashed jobs from /dev/shm", n);
    }
    const std::string name =
        ShmSegment::name_for("/" + std::string(kShmPrefix) + job_uid + "-node" + std::to_string(topo.node));
    shm_ = ShmSegment::create(name, static_cast<size_t>(total));
    new (shm_.data()) NodeControl();
    store->set(ready_key, std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    store->wait({ready_key}, timeout);
    const std::vector<uint8_t> name = store->get(ready_key);
    shm_ = ShmSegment::open(std::string(name.begin(), name.end()), static_cast<size_t>(total));
  }
  char* base = static_cast<char*>(shm_.data());
  control_ = reinterpret_cast<NodeControl*>(base);
  headers_ = reinterpret_cast<SlotHeader*>(base + control_bytes);
  counters_ = reinterpret_cast<SharedCounter*>(base + control_bytes +
                                               round_up(sizeof(SlotHeader) * slots * ranks_, kPageBytes));
  data_ = base + control_bytes + header_bytes;
  control_->pids[topo.local_rank] = getpid();

  // The last rank to map the segment removes its name: from then on it
  // disappears with the last process, however that process ends.
  if (store->add(mapped_key, 1) == ranks_) shm_.unlink();
}

int sweep_stale_segments() { return ShmSegment::sweep_stale(kShmPrefix); }

void NodeArena::abort(int rank, const Error& why, uint64_t first_failed_op) {
  uint32_t expected = 0;
  if (control_->abort_state.compare_exchange_strong(expected, 1)) {
    control_->abort_rank = rank;
    control_->abort_op = first_failed_op;
    control_->abort_kind = static_cast<uint32_t>(why.kind());
    std::strncpy(control_->abort_msg, why.what(), sizeof(control_->abort_msg) - 1);
    control_->abort_state.store(2, std::memory_order_release);
  }
  for (int i = 0; i < ranks_; ++i) {
    counter_wake_all(control_->in_ready[i]);
    counter_wake_all(control_->chunk_done[i]);
    counter_wake_all(control_->consumed[i]);
  }
}

void NodeArena::leave(int local, uint64_t issued, const std::string& why) {
  std::strncpy(control_->left_why[local], why.c_str(), sizeof(control_->left_why[local]) - 1);
  control_->left[local].store(issued + 1, std::memory_order_release);
  for (int i = 0; i < ranks_; ++i) {
    counter_wake_all(control_->in_ready[i]);
    counter_wake_all(control_->chunk_done[i]);
    counter_wake_all(control_->consumed[i]);
  }
}

std::string NodeArena::left_before(int local, uint64_t op_seq) const {
  const uint64_t left = control_->left[local].load(std::memory_order_acquire);
  if (left == 0 || left - 1 > op_seq) return "";
  return std::string(control_->left_why[local], strnlen(control_->left_why[local], sizeof(control_->left_why[local])));
}

Error NodeArena::abort_error() const {
  if (control_->abort_state.load(std::memory_order_acquire) != 2) {
    return Error(ErrorKind::kBackend, "a rank of this node aborted");
  }
  return Error(static_cast<ErrorKind>(control_->abort_kind), std::string(control_->abort_msg));
}

}  // namespace fairring

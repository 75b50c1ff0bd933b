// The inter-node step of a slice, as the schedule sees it: post a chunk's
// shards to the rail and hear back, in slice order, once every shard's
// reduced result is in the chunk.  Implementations: RailStage (TCP, from host
// memory), and on the CUDA path the same stage fed through pinned memory, or
// NCCL on a stream.  All of them run the same walk (plan/rail_walk.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/rail_walk.h"
#include "common/error.h"
#include "common/op_key.h"
#include "common/reduce_op.h"

namespace fairring {

struct RailTask {
  uint64_t slice_seq = 0;
  int slot = 0;  // the pipeline slot the slice runs in
  OpKey key;     // the collective, for matching and messages only
  // What the rail does with the shards (rail_walk.h), never which
  // collective it is: rails run patterns, each serving several collectives.
  RailPattern pattern = RailPattern::kReduce;
  int back_to = kBackToAll;  // kReduce: where the served sums go
  c10::ScalarType dtype() const { return static_cast<c10::ScalarType>(key.dtype); }
  RedOp op() const { return static_cast<RedOp>(key.op); }
  char* chunk = nullptr;      // this rank's node-reduced chunk; results land here too
  std::vector<Range> shards;  // in chunk (elements); shard j is served by node j
  int64_t divisor = 0;        // applied by the server (AVG)
  // Where shard j is, when not at `chunk` + its offset (empty: at the
  // offset), and where kReduce puts the served sum (null: in place).
  std::vector<char*> pieces;
  char* result = nullptr;
  // kExchange: the pieces we expect (counts) and where each lands.
  std::vector<Range> received;
  std::vector<char*> landings;
  // This node's part of the exchange of the task.
  RailWalk walk(int node, int num_nodes) const {
    return walk_rail(pattern, back_to, shards, node, num_nodes, received);
  }
  char* shard_at(int j) const {
    return pieces.empty() ? chunk + shards[j].offset * static_cast<int64_t>(c10::elementSize(dtype())) : pieces[j];
  }
  // Where a received shard j (a walk's `receives`, kShare or kExchange) lands.
  char* landing_at(int j) const { return landings.empty() ? shard_at(j) : landings[j]; }
};

class RailExchange {
 public:
  // Called once per posted task, in slice order, when the chunk holds the
  // result (for a device: when the work that puts it there is enqueued).
  using SliceDone = std::function<void(uint64_t slice_seq)>;
  // Called at most once, when the exchange fails on its own.
  using Failed = std::function<void(const Error& why)>;

  virtual ~RailExchange() = default;
  virtual void post(RailTask task) = 0;
  // Tells every rail peer why we stop, then stops (from any thread).
  virtual void abort(const Error& why) = 0;
  // After abort(): blocks until the exchange touches the memory of no task
  // posted to it any more (a chunk lives in the caller's tensor), or `until`
  // passes; true if it got there.  The pipeline returns a failed op's
  // tensors to its caller only after this (Pipeline::complete).
  virtual bool let_go(std::chrono::steady_clock::time_point until) = 0;
};

}  // namespace fairring

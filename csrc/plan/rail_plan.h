// One rank's part in the rail exchange of a chunk: which shard it sends to
// which node, which results come back from whom, and whether it serves a
// shard.  Pure arithmetic over the slice plan's shard list, shared by the TCP
// rail (RailStage) and the NCCL rail (CudaEngine), so both pair up the same way.
#pragma once

#include <vector>

#include "plan/plan.h"

namespace fairring {

// A shard served by another node.
struct RemoteShard {
  int node = 0;  // serves it: receives our piece, sends the reduced shard back
  Range shard;   // in the chunk; our piece leaves from, and the result lands in, this range
};

struct RailPlan {
  std::vector<RemoteShard> remote;  // in node order
  // Shard `node` of the chunk, when the plan has that many shards (a small
  // chunk has fewer shards than nodes: the nodes past them serve nothing).
  bool serves = false;
  Range served;
  // Serving: every other node sends its piece of `served` (reduced with ours
  // in node order) and gets the result back.  In node order.
  std::vector<int> contributors;
};

// `shards`: the chunk's shards (SlicePlan::shards[k], shard j served by node
// j; at most `num_nodes` of them), seen from node `node` of `num_nodes`.
RailPlan plan_rail(const std::vector<Range>& shards, int node, int num_nodes);

}  // namespace fairring

#include "plan/rail_plan.h"

#include <stdexcept>
#include <string>

namespace fairring {

RailPlan plan_rail(const std::vector<Range>& shards, int node, int num_nodes) {
  const int num_shards = static_cast<int>(shards.size());
  if (num_nodes < 1 || node < 0 || node >= num_nodes || num_shards < 1 || num_shards > num_nodes) {
    throw std::logic_error("fairring: bad rail plan: " + std::to_string(num_shards) + " shards, node " +
                           std::to_string(node) + " of " + std::to_string(num_nodes));
  }
  RailPlan p;
  for (int j = 0; j < num_shards; ++j) {
    if (j != node) p.remote.push_back(RemoteShard{j, shards[j]});
  }
  if (node < num_shards) {
    p.serves = true;
    p.served = shards[node];
    for (int i = 0; i < num_nodes; ++i) {
      if (i != node) p.contributors.push_back(i);
    }
  }
  return p;
}

}  // namespace fairring

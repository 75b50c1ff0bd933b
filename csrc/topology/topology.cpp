#include "topology/topology.h"
#include "common/error.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace fairring {

std::vector<int> Topology::rail() const {
  if (!on_rail()) return {};
  std::vector<int> peers(num_nodes);
  for (int n = 0; n < num_nodes; ++n) peers[n] = node_ranks[n][local_rank];
  return peers;
}

std::vector<int> Topology::node_sizes() const {
  std::vector<int> sizes;
  for (const auto& members : node_ranks) sizes.push_back(static_cast<int>(members.size()));
  return sizes;
}

std::pair<int, int> Topology::place_of(int r) const {
  for (int n = 0; n < num_nodes; ++n) {
    const auto& members = node_ranks[n];
    for (int k = 0; k < static_cast<int>(members.size()); ++k) {
      if (members[k] == r) return {n, k};
    }
  }
  throw Error(ErrorKind::kInvalidArgument, "fairring: rank " + std::to_string(r) + " is not in the group");
}

namespace {
// Fills in the counts and this rank's place from node_ranks.
void place(Topology& t) {
  t.num_nodes = static_cast<int>(t.node_ranks.size());
  t.rails = static_cast<int>(t.node_ranks[0].size());
  t.largest_node = t.rails;
  for (const auto& members : t.node_ranks) {
    t.rails = std::min(t.rails, static_cast<int>(members.size()));
    t.largest_node = std::max(t.largest_node, static_cast<int>(members.size()));
  }
  t.uneven = false;
  for (const auto& members : t.node_ranks) t.uneven |= static_cast<int>(members.size()) != t.rails;
  const auto [node, local] = t.place_of(t.rank);
  t.node = node;
  t.local_rank = local;
  t.ranks_per_node = static_cast<int>(t.node_ranks[node].size());
}
}  // namespace

Topology Topology::flat() const {
  Topology t;
  t.rank = rank;
  t.size = size;
  t.flattened = true;
  for (int r = 0; r < size; ++r) t.node_ranks.push_back({r});
  place(t);
  return t;
}

Topology build_topology(const std::vector<std::string>& node_keys, int rank) {
  const int size = static_cast<int>(node_keys.size());
  if (size == 0 || rank < 0 || rank >= size) {
    throw Error(ErrorKind::kInvalidArgument, "build_topology: rank out of range");
  }
  Topology t;
  t.rank = rank;
  t.size = size;

  // Group ranks by key, nodes in order of their first (lowest) rank.
  std::map<std::string, int> node_of_key;
  for (int r = 0; r < size; ++r) {
    auto it = node_of_key.find(node_keys[r]);
    if (it == node_of_key.end()) {
      node_of_key.emplace(node_keys[r], static_cast<int>(t.node_ranks.size()));
      t.node_ranks.push_back({r});
    } else {
      t.node_ranks[it->second].push_back(r);
    }
  }
  place(t);
  return t;
}

}  // namespace fairring

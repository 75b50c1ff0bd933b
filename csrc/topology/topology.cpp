#include "topology/topology.h"
#include "common/error.h"

#include <map>
#include <stdexcept>

namespace fairring {

std::vector<int> Topology::rail() const {
  std::vector<int> peers(num_nodes);
  for (int n = 0; n < num_nodes; ++n) peers[n] = node_ranks[n][local_rank];
  return peers;
}

std::pair<int, int> Topology::place_of(int r) const {
  for (int n = 0; n < num_nodes; ++n) {
    for (int k = 0; k < ranks_per_node; ++k) {
      if (node_ranks[n][k] == r) return {n, k};
    }
  }
  throw Error(ErrorKind::kInvalidArgument, "fairring: rank " + std::to_string(r) + " is not in the group");
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

  const size_t k = t.node_ranks[0].size();
  for (const auto& members : t.node_ranks) {
    if (members.size() != k) {
      t.flattened = true;
    }
  }
  if (t.flattened) {
    // Uneven nodes: every rank becomes a node of one.
    t.node_ranks.clear();
    for (int r = 0; r < size; ++r) t.node_ranks.push_back({r});
  }

  t.num_nodes = static_cast<int>(t.node_ranks.size());
  t.ranks_per_node = static_cast<int>(t.node_ranks[0].size());
  for (int n = 0; n < t.num_nodes; ++n) {
    for (int l = 0; l < t.ranks_per_node; ++l) {
      if (t.node_ranks[n][l] == rank) {
        t.node = n;
        t.local_rank = l;
      }
    }
  }
  return t;
}

}  // namespace fairring

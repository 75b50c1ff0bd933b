// Nodes, local ranks and rails, computed from the node key of every rank.
// Pure logic: no I/O, so it can be unit-tested through the Python bindings.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fairring {

struct Topology {
  int rank = 0;            // this rank in the process group
  int size = 1;            // ranks in the process group
  int num_nodes = 1;       // N
  int ranks_per_node = 1;  // K: ranks on this rank's node
  // Rails between nodes: the rank count of the smallest node.  Local rank x
  // < rails of every node owns chunk x of a slice and carries it on rail x;
  // on a larger node the ranks past them are "passive": they publish their
  // input and gather the results through the node's memory, and own no
  // chunk and no rail.  Equal nodes: rails == ranks_per_node.
  int rails = 1;
  int largest_node = 1;  // the rank count of the largest node
  int node = 0;          // index of this rank's node, 0..N-1
  int local_rank = 0;    // index of this rank inside its node, 0..K-1
  // The nodes have different rank counts (some ranks are passive).
  bool uneven = false;
  // A flat view (flat()): every rank its own node.
  bool flattened = false;
  // node_ranks[n][k] = group rank of local rank k on node n.  Nodes are ordered
  // by their lowest rank, local ranks by rank, so every rank computes the same.
  std::vector<std::vector<int>> node_ranks;

  // Group ranks of this rank's node.
  const std::vector<int>& local_ranks() const { return node_ranks[node]; }
  // Whether this rank carries a rail (local rank below `rails`).
  bool on_rail() const { return local_rank < rails; }
  // Group rank of each node's member of this rank's rail (index = node);
  // empty for a passive rank.
  std::vector<int> rail() const;
  // The rank count of each node.
  std::vector<int> node_sizes() const;
  // Where group rank `r` is: {node, local rank}.
  std::pair<int, int> place_of(int r) const;
  // The same group with every rank its own node: the CUDA engine's view of
  // uneven nodes (its movers have no slot areas on a node of one rank).
  Topology flat() const;
};

// node_keys[r] identifies the machine of rank r (hostname + boot id, or the
// FAIRRING_NODE_ID override).  Ranks with equal keys share a node.
Topology build_topology(const std::vector<std::string>& node_keys, int rank);

}  // namespace fairring

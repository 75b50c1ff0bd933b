#include "plan/rail_walk.h"
#include "common/error.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fairring {

namespace {

[[noreturn]] void refuse(const std::string& what, const std::vector<Range>& shards, int node, int num_nodes) {
  throw Error(ErrorKind::kBackend, "fairring: bad rail walk: " + what + " (" + std::to_string(shards.size()) +
                                       " shards, node " + std::to_string(node) + " of " + std::to_string(num_nodes) +
                                       ")");
}

void add_unique(std::vector<int>& v, int x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

}  // namespace

RailWalk walk_rail(RailPattern pattern, int back_to, const std::vector<Range>& shards, int node, int num_nodes,
                   const std::vector<Range>& received) {
  const int num_shards = static_cast<int>(shards.size());
  if (num_nodes < 1 || node < 0 || node >= num_nodes) refuse("no such node", shards, node, num_nodes);
  RailWalk w;
  w.pattern = pattern;
  switch (pattern) {
    case RailPattern::kShare:
      if (num_shards != num_nodes) refuse("a shared chunk has one shard per node", shards, node, num_nodes);
      for (int j = 0; j < num_nodes; ++j) {
        if (j == node) continue;
        w.sends.push_back(Transfer{j, node, shards[node].count});
        w.receives.push_back(Transfer{j, j, shards[j].count});
      }
      return w;
    case RailPattern::kExchange: {
      if (num_shards < num_nodes || num_shards % num_nodes != 0 || received.size() != shards.size()) {
        refuse("an exchange has as many pieces for every node as from it", shards, node, num_nodes);
      }
      const int per_node = num_shards / num_nodes;
      for (int j = 0; j < num_nodes; ++j) {
        if (j == node) continue;
        for (int p = 0; p < per_node; ++p) {
          const int at = j * per_node + p;
          w.sends.push_back(Transfer{j, at, shards[at].count});
          w.receives.push_back(Transfer{j, at, received[at].count});
        }
      }
      return w;
    }
    case RailPattern::kReduce: {
      if (num_shards < 1 || num_shards > num_nodes) refuse("between 1 and one shard per node", shards, node, num_nodes);
      if (back_to != kBackToAll && back_to != kBackToNone && (back_to < 0 || back_to >= num_nodes)) {
        refuse("the sums go back to node " + std::to_string(back_to), shards, node, num_nodes);
      }
      auto returns_to = [back_to](int n) { return back_to == kBackToAll || back_to == n; };
      // With the sums going to one node, the others get an empty answer.
      const bool answers = back_to >= 0;
      for (int j = 0; j < num_shards; ++j) {
        if (j == node) continue;
        w.sends.push_back(Transfer{j, j, shards[j].count});
        if (returns_to(node)) {
          w.sum_receives.push_back(Transfer{j, j, shards[j].count});
        } else if (answers) {
          w.sum_receives.push_back(Transfer{j, j, 0});
        }
      }
      if (node < num_shards) {
        w.reduces = true;
        w.served = node;
        w.served_count = shards[node].count;
        const int64_t count = w.served_count;
        for (int i = 0; i < num_nodes; ++i) {
          if (i == node) continue;
          w.receives.push_back(Transfer{i, node, count});
          if (returns_to(i)) {
            w.sum_sends.push_back(Transfer{i, node, count});
          } else if (answers) {
            w.sum_sends.push_back(Transfer{i, node, 0});
          }
        }
      }
      return w;
    }
  }
  refuse("unknown pattern " + std::to_string(static_cast<int>(pattern)), shards, node, num_nodes);
}

bool carries_data(const std::vector<Transfer>& transfers) {
  return std::any_of(transfers.begin(), transfers.end(), [](const Transfer& t) { return t.count > 0; });
}

bool RailWalk::sends_sum_data() const { return carries_data(sum_sends); }

std::vector<int> RailWalk::shards_read() const {
  std::vector<int> out;
  for (const Transfer& t : sends) {
    if (t.count > 0) add_unique(out, t.shard);
  }
  if (reduces && served_count > 0) add_unique(out, served);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> RailWalk::shards_written() const {
  std::vector<int> out;
  // kReduce's pieces go to staging; kExchange's land where `received` says.
  const bool in_place = pattern != RailPattern::kReduce;
  for (const Transfer& t : in_place ? receives : sum_receives) {
    if (t.count > 0) add_unique(out, t.shard);
  }
  if (reduces && served_count > 0) add_unique(out, served);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fairring

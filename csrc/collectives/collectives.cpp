#include "collectives/collectives.h"

#include <stdexcept>

namespace fairring {

const CollectiveDef& collective_def(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return all_reduce_def();
    case Collective::kBarrier:
      return barrier_def();
    case Collective::kReduceScatter:
      return reduce_scatter_def();
    case Collective::kAllGather:
      return all_gather_def();
    case Collective::kBroadcast:
      return broadcast_def();
    case Collective::kReduce:
      return reduce_def();
  }
  throw std::invalid_argument("fairring: no definition for collective " + std::to_string(static_cast<int>(c)));
}

Collective collective_named(const std::string& name) {
  for (Collective c : {Collective::kAllReduce, Collective::kBarrier, Collective::kBroadcast, Collective::kReduceScatter,
                       Collective::kAllGather, Collective::kReduce}) {
    if (name == collective_name(c)) return c;
  }
  throw std::invalid_argument("fairring: no collective named " + name);
}

}  // namespace fairring

#include "collectives/collectives.h"
#include "common/error.h"

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
    case Collective::kAllToAll:
      return all_to_all_def();
    case Collective::kGather:
      return gather_def();
    case Collective::kScatter:
      return scatter_def();
    case Collective::kAllToAllSizes:
      return all_to_all_sizes_def();
  }
  throw Error(ErrorKind::kInvalidArgument,
              "fairring: no definition for collective " + std::to_string(static_cast<int>(c)));
}

namespace {
// Every kind, for lookups by name; the switch above makes sure each has a
// definition.
constexpr Collective kAll[] = {Collective::kAllReduce,     Collective::kBarrier,   Collective::kBroadcast,
                               Collective::kReduceScatter, Collective::kAllGather, Collective::kReduce,
                               Collective::kAllToAll,      Collective::kGather,    Collective::kScatter,
                               Collective::kAllToAllSizes};

// Every definition is built (and so its words registered, op_key.h) when the
// library loads: a message may name a peer's collective that this rank has
// not run yet.
const bool kAllDefined = [] {
  for (Collective c : kAll) collective_def(c);
  return true;
}();
}  // namespace

Collective collective_named(const std::string& name) {
  for (Collective c : kAll) {
    if (name == collective_name(c)) return c;
  }
  throw Error(ErrorKind::kInvalidArgument, "fairring: no collective named " + name);
}

}  // namespace fairring

// Every collective Fairring runs natively, by kind or by name.  The list is
// FAIRRING_COLLECTIVES (common/op_key.h); each definition lives in its own
// file here, as `<name>_def()`.
#pragma once

#include <string>
#include <vector>

#include "common/op_key.h"
#include "pipeline/collective_def.h"

namespace fairring {

const CollectiveDef& collective_def(Collective c);
// By its name ("all_reduce", "reduce_scatter", ...); throws for an unknown one.
Collective collective_named(const std::string& name);
// Every kind of the list, in its order.
const std::vector<Collective>& all_collectives();

// The definitions, one per collective, each in the file of its name or,
// for a kind that runs another's scripts under its own name, in that one's
// (barrier_def() in all_reduce.cpp; all_to_all_sizes_def() in all_gather.cpp).
#define FAIRRING_COLLECTIVE_DEF(kind, number, name) const CollectiveDef& name##_def();
FAIRRING_COLLECTIVES(FAIRRING_COLLECTIVE_DEF)
#undef FAIRRING_COLLECTIVE_DEF

}  // namespace fairring

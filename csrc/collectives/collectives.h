// Every collective Fairring runs natively, by kind or by name: the one place
// that lists them (a switch with no default, so a new kind is a compile
// error until it is listed).  Each definition lives in its own file here.
#pragma once

#include <string>

#include "common/op_key.h"
#include "pipeline/collective_def.h"

namespace fairring {

const CollectiveDef& collective_def(Collective c);
// By its name ("all_reduce", "reduce_scatter", ...); throws for an unknown one.
Collective collective_named(const std::string& name);

// The definitions, one per file.
const CollectiveDef& all_reduce_def();        // all_reduce.cpp
const CollectiveDef& barrier_def();           // all_reduce.cpp: an all-reduce of one byte
const CollectiveDef& reduce_scatter_def();    // reduce_scatter.cpp
const CollectiveDef& all_gather_def();        // all_gather.cpp
const CollectiveDef& all_to_all_sizes_def();  // all_gather.cpp: the sizes before an unequal all-to-all
const CollectiveDef& broadcast_def();         // broadcast.cpp
const CollectiveDef& reduce_def();            // reduce.cpp
const CollectiveDef& all_to_all_def();        // all_to_all.cpp
const CollectiveDef& gather_def();            // gather.cpp
const CollectiveDef& scatter_def();           // scatter.cpp

}  // namespace fairring

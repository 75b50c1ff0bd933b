// Steps written once for several collectives' scripts (the slot's own
// steps, acquire and release, are the primitives', slice_schedule.h).
#pragma once

#include "pipeline/slice_schedule.h"

namespace fairring {

// publish-input (all_reduce.cpp): our slice, minus the chunk we reduce
// straight from the tensor, into our input area, for the node's peers;
// all-reduce and reduce.
bool step_publish_input(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);
// gather (all_reduce.cpp): wait for every chunk of the slice, copy the
// others' from their owners' output areas into the tensor; all-reduce, and
// a reduce's root.
bool step_gather(SliceSchedule& p, Slice& s, const SliceSchedule::TimePoint* until);

}  // namespace fairring

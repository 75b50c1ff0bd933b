// One slice of a collective as it moves through the pipeline.
#pragma once

#include <cstdint>
#include <memory>

#include "plan/plan.h"
#include "node/node_slots.h"
#include "pipeline/pipeline_op.h"

namespace fairring {

struct Slice {
  std::shared_ptr<PipelineOp> op;
  int64_t index = 0;  // slice of the op
  uint64_t seq = 0;   // global slice number
  SlicePlan plan;
  int phase = 0;       // the next phase of its list to run (slice_schedule.h)
  bool begun = false;  // the mover has seen its first step
  SliceId id() const { return SliceId{op->seq, op->number, seq, op->collective}; }
};

}  // namespace fairring

// A collective as the pipeline runs it.  Each collective is one file under
// collectives/ that fills this in: its script (the named steps of one slice,
// written over the slice primitives of slice_schedule.h) and how it cuts an
// op into slices.  The pipeline, the node protocol, the movers and the rails
// know only the primitives; the backend gives every op its definition.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "common/op_key.h"
#include "plan/plan.h"

namespace fairring {

class SliceSchedule;
struct Slice;

// One step of a slice: runs (or, on a device, enqueues) its part and returns
// true, or returns false when a wait did not finish before `until` (null:
// block) and must be resumed.
using StepFn = bool (*)(SliceSchedule& p, Slice& s, const std::chrono::steady_clock::time_point* until);

struct Step {
  const char* name;  // for traces and tests
  StepFn run;
};

// The steps of one slice.  The pipeline runs steps[0, front) as the slice
// enters ("front": up to handing it to the rails) and the rest
// `parallelism - 1` slices later ("back").
struct Script {
  std::vector<Step> steps;
  size_t front = 0;
};

class CollectiveDef {
 public:
  virtual ~CollectiveDef() = default;
  virtual Collective kind() const = 0;
  // The script with the node steps, or without them (`alone`: a node of
  // one rank, whose slice need not be staged).
  virtual const Script& script(bool alone) const = 0;
  // The whole tensor, or one block per rank (plan.h).
  virtual Cut cut() const = 0;
};

// A collective given by its two scripts: on a node of several ranks, and on
// a node of one rank (no node steps).  What each collective file builds,
// with the words messages use for it (registered for every layer).
class ScriptedCollective : public CollectiveDef {
 public:
  ScriptedCollective(Collective kind, CollectiveText text, Cut cut, Script node, Script alone)
      : kind_(kind), cut_(cut), node_(std::move(node)), alone_(std::move(alone)) {
    register_collective_text(kind, text);
  }
  Collective kind() const override { return kind_; }
  Cut cut() const override { return cut_; }
  const Script& script(bool alone) const override { return alone ? alone_ : node_; }

 private:
  Collective kind_;
  Cut cut_;
  Script node_;
  Script alone_;
};

}  // namespace fairring

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

// The steps of one slice, in two named halves.  The pipeline runs the
// front as the slice enters (up to handing it to the rails) and the back
// `parallelism - 1` slices later.
struct Script {
  Script(std::vector<Step> front_steps, std::vector<Step> back_steps) : steps(std::move(front_steps)) {
    front = steps.size();
    steps.insert(steps.end(), back_steps.begin(), back_steps.end());
  }
  std::vector<Step> steps;  // the front's, then the back's
  size_t front = 0;         // steps[0, front) are the front
};

// What the caller's tensors hold, for the checks and the entry points
// that every collective shares (backend): a block per rank in the input,
// in the output, or in both (an all-to-all); a root, or none.  On a rooted
// collective the per-rank side is the root's only (a gather's output, a
// scatter's input).
struct Shape {
  bool input_per_rank = false;
  bool output_per_rank = false;
  bool rooted = false;

  static constexpr Shape whole() { return Shape{}; }
  static constexpr Shape blocks_in() { return Shape{true, false, false}; }
  static constexpr Shape blocks_out() { return Shape{false, true, false}; }
  static constexpr Shape blocks_both() { return Shape{true, true, false}; }
  constexpr Shape with_root() const { return Shape{input_per_rank, output_per_rank, true}; }
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
  virtual Shape shape() const = 0;
};

// A collective given by its two scripts: on a node of several ranks, and on
// a node of one rank (no node steps).  What each collective file builds,
// with the words messages use for its arguments (registered for every layer).
class ScriptedCollective : public CollectiveDef {
 public:
  ScriptedCollective(Collective kind, DescribeArgs args, Cut cut, Shape shape, Script node, Script alone)
      : kind_(kind), cut_(cut), shape_(shape), node_(std::move(node)), alone_(std::move(alone)) {
    register_collective_args(kind, args);
  }
  Collective kind() const override { return kind_; }
  Cut cut() const override { return cut_; }
  Shape shape() const override { return shape_; }
  const Script& script(bool alone) const override { return alone ? alone_ : node_; }

 private:
  Collective kind_;
  Cut cut_;
  Shape shape_;
  Script node_;
  Script alone_;
};

}  // namespace fairring

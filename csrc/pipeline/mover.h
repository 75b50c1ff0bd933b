// What the slice schedule (slice_schedule.h) asks of the memory a device
// keeps its data in.  The schedule is written once; a mover says how its
// steps happen: the host mover copies with memcpy and reduces with the CPU
// kernels, right away; the CUDA mover enqueues the same steps on the slot's
// stream and orders them across processes with interprocess events.  Like
// Gloo's CudaAllreduceRing<T, W>: one algorithm, the memory a parameter.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "common/reduce_op.h"

namespace fairring {

struct PipelineOp;

// The steps of the node protocol whose data a peer reads afterwards.  On the
// host, NodeSlots' counters say all there is to say; on a device the data is
// written asynchronously, so each step also leaves a mark (an event) that a
// peer's later work waits for.
enum class PeerStep {
  kInputReady = 0,  // our input area of the slot holds the slice
  kChunkDone = 1,   // our output area holds our final chunk
  kConsumed = 2,    // we no longer read the peers' areas of the slot
};
constexpr int kPeerSteps = 3;

class Mover {
 public:
  virtual ~Mover() = default;

  // The slot's staging areas of local rank x, as this rank sees them.  A
  // chunk at offset o of the slice is at output_area(slot, owner) + o.
  virtual char* input_area(int slot, int x) = 0;
  virtual char* output_area(int slot, int x) = 0;

  // The first step of a slice of `op` on this rank.
  virtual void begin(int slot, PipelineOp& op) {
    (void)slot;
    (void)op;
  }
  // done() and after() are about node peers: on a node of one rank the
  // schedule calls neither (a device mover keeps no events there).
  // We finished `step` of the slot's slice (NodeSlots publishes it next).
  virtual void done(int slot, PeerStep step) {
    (void)slot;
    (void)step;
  }
  // What follows reads what peer x wrote in `step` (kConsumed: overwrites
  // what x read).  Called once NodeSlots has seen x publish it.
  virtual void after(int slot, int x, PeerStep step) {
    (void)slot;
    (void)x;
    (void)step;
  }

  // `large`: the op outgrows the caches (the result need not be cached).
  virtual void copy(int slot, char* to, const char* from, int64_t bytes, bool large) = 0;
  // out[i] = inputs[0][i] op ... op inputs[n-1][i], divided by `divisor` if > 0.
  // `out` may be one of the inputs.
  virtual void reduce(int slot, c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int n,
                      int64_t count, int64_t divisor) = 0;

  // The slice's last step on this rank.
  virtual void end(int slot) { (void)slot; }
};

}  // namespace fairring

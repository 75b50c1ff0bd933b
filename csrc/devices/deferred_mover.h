// A host mover that behaves like a device, for testing the schedule's
// ordering on CPU: with FAIRRING_TEST_DEFERRED_MOVER=1 (on every rank) the
// host engine uses it instead of the plain host mover.
//
// Every step is queued on the slot's "stream" (one worker thread per slot)
// and runs later, in order, after a random delay.  done() and after() are
// interprocess events with the semantics the CUDA engine relies on: a wait
// is for the last record the peer had enqueued when the wait was enqueued
// (cudaStreamWaitEvent on an IPC event).  A read of a peer's data that the
// schedule does not order after the peer's event then sees stale data, and
// the tests' results are wrong: what would happen on a GPU, caught here.
// Rails get a fence: the chunk is posted when the slot's stream reaches the
// post (as the CUDA path posts once its device-to-host copy is done).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "node/node_arena.h"
#include "pipeline/mover.h"
#include "rails/rail_exchange.h"
#include "rails/rail_feeder.h"

namespace fairring {

// Streams of host work that behave like a device's: each runs what it is
// given later, in order (a worker thread each), one step in four after a
// random delay.  join() is the model of cudaEventRecord on one stream and
// cudaStreamWaitEvent on another.
class DeferredStreams {
 public:
  DeferredStreams(int count, unsigned seed);
  ~DeferredStreams();  // drops what is queued, joins the workers

  // Queues `fn` on stream i.
  void enqueue(int i, std::function<void()> fn);
  // What stream `to` runs from now on runs after what stream `from` has
  // queued so far.
  void join(int to, int from);
  // Waits until every stream has run all it was given; rethrows a stream's
  // failure (the first step that threw; after it, steps are skipped).
  void synchronize();
  // The group failed: what is queued is dropped (its ops' tensors may go).
  void cancel() { cancelled_ = true; }
  // After cancel(): blocks until no stream is inside a step (each is done
  // with the memory it was given), or `until` passes; true if so.
  bool let_go(std::chrono::steady_clock::time_point until);

 private:
  struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    bool busy = false;
    std::thread worker;
  };
  void run(Stream& s, unsigned seed);

  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cancelled_{false};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

class DeferredMover : public Mover {
 public:
  // The arena carries 2 * kPeerSteps counters per slot and rank (made with
  // counters_per_slot = kCounters).  `timeout` bounds a wait on a peer.
  static constexpr int kCounters = 2 * kPeerSteps;
  // `ranks_per_node` == 1: done() and after() are a contract violation (as on
  // the CUDA mover, which has no events there), reported as an error.
  DeferredMover(NodeArena& arena, int local_rank, int ranks_per_node, int slots, int rank,
                std::chrono::milliseconds timeout);
  ~DeferredMover() override;

  char* input_area(int slot, int x) override { return arena_.input_area(slot, x); }
  char* output_area(int slot, int) override { return arena_.output_area(slot); }
  void done(int slot, PeerStep step) override;
  void after(int slot, int x, PeerStep step) override;
  void copy(int slot, char* to, const char* from, int64_t bytes, bool large) override;
  void reduce(int slot, c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int n, int64_t count,
              int64_t divisor) override;

  // Queues `fn` on the slot's stream.
  void enqueue(int slot, std::function<void()> fn) { streams_.enqueue(slot, std::move(fn)); }
  // Waits until every stream has run all it was given; rethrows a stream's
  // failure (a wait on a peer that timed out, or the node aborted).
  void synchronize() { streams_.synchronize(); }
  // The group failed: what is queued is dropped (its ops' tensors may go).
  void cancel() { streams_.cancel(); }
  // After cancel(): blocks until no stream is inside a step, or `until`
  // passes; true if so.
  bool let_go(std::chrono::steady_clock::time_point until) { return streams_.let_go(until); }

 private:
  SharedCounter& enqueued(int slot, int x, PeerStep step) { return arena_.counter(slot, x, static_cast<int>(step)); }
  SharedCounter& completed(int slot, int x, PeerStep step) {
    return arena_.counter(slot, x, kPeerSteps + static_cast<int>(step));
  }

  void require_peers(const char* what) const;

  NodeArena& arena_;
  const int me_;
  const bool has_peers_;
  std::chrono::milliseconds timeout_;
  DeferredStreams streams_;  // one per slot
};

// The rail's fence: a chunk is posted to `inner`, in slice order, once the
// slot's stream of `mover` has reached the post, by the feeder the CUDA
// staged rail uses for its device-to-host copies.
class FencedRail : public RailExchange {
 public:
  FencedRail(DeferredMover& mover, RailExchange& inner, int rank, std::chrono::milliseconds timeout, Failed failed);
  void post(RailTask task) override;
  void abort(const Error& why) override;
  bool let_go(std::chrono::steady_clock::time_point until) override { return inner_.let_go(until); }

 private:
  DeferredMover& mover_;
  RailExchange& inner_;
  RailFeeder feeder_;
};

}  // namespace fairring

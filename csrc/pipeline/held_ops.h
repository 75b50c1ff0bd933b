// Completed ops whose device work may still run, held (with their tensors)
// until it is over, and the device side of the group's watchdog.  Used by
// the CUDA engine; free of CUDA itself (the device is behind Hooks), so that
// its rules are unit-tested on the CPU (tests/test_held_ops.py).
//
// The CUDA engine's streams are its own and die with it, so it cannot
// recordStream on them: instead the caching allocator gets a tensor back
// only once the op's `done` event has passed.  One thread polls the oldest
// op (ops finish in issue order on the engine's tail stream).
//
// The watchdog: an op's Work is done on the host once its device work is
// enqueued (as with NCCL), so a device that never gets there (a local peer
// killed with work queued, a stalled NCCL transfer) would otherwise go
// unseen.  The oldest op gets the group's timeout from when it became the
// oldest; past it, or 2 s after a peer is found gone (PeerWatch), the group fails
// naming the op, and every held op whose device work has not finished is
// reported failed to its Work (device_failed).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/error.h"
#include "pipeline/pipeline_op.h"

namespace fairring {

// How a wait on device work that may depend on local peers treats trouble
// with them (a check that throws: a peer gone, the node aborted): it looks
// every kCheckEvery and gives up only once the trouble has lasted kGrace.
// A peer that exits normally has done its part, and what is left of ours
// (copies of what it wrote) ends within the grace; work that really waits
// on it does not.  The watchdog and the engine's host-side waits share it.
class PeerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kCheckEvery{200};
  static constexpr std::chrono::milliseconds kGrace{2000};

  // Whether the peers are due for a look at `now` (then pass what it found
  // to saw()).  The first look is due at once.
  bool due(Clock::time_point now);
  // What a look at `now` found (nullopt: nothing wrong).  Returns the
  // trouble to give up with once it has lasted kGrace; trouble stays until
  // reset() (a peer found gone stays gone).
  std::optional<Error> saw(Clock::time_point now, std::optional<Error> trouble);
  // A new wait (the next op): no trouble seen yet.
  void reset() { trouble_since_ = Clock::time_point{}; }

 private:
  Clock::time_point next_check_{};
  Clock::time_point trouble_since_{};
};

// The ordering that keeps a failed op held until its device work ends, on
// a device whose streams run what was queued even after the group failed
// (CUDA: ncclCommAbort ends NCCL's kernels, and what waits behind them then
// runs): for each of the `streams` the op's work may be on, `join(s)` makes
// the tail wait for what stream s has queued so far; then `record_done()`
// marks the op's end on the tail, the mark HeldOps' `finished` hook looks
// at.  Without it, a failed op's `done` is never recorded, reads as
// finished, and its memory goes back while copies into it are queued.
void fence_failed_op(int streams, const std::function<void(int)>& join, const std::function<void()>& record_done);

class HeldOps {
 public:
  struct Hooks {
    // On HeldOps' thread, first (select the device, say).
    std::function<void()> thread_start;
    // The op's device work is over (true also if none of it was enqueued);
    // throws on a device error.  Quick, never blocks.
    std::function<bool(const PipelineOp&)> finished;
    // Throws (naming it) if a peer the device work may wait on is gone.
    // Called about every 200 ms while the oldest op's work is pending.
    std::function<void()> check_peers;
    // Fails the group (from HeldOps' thread, no lock held): the oldest op's
    // device work timed out, its peer died, or the device reported a fault.
    std::function<void(const Error&)> fault;
    // The op's device work did not (or may never) finish: its Work reports
    // `why` (from HeldOps' thread, no lock held; once per op).
    std::function<void(const PipelineOp&, const Error&)> device_failed;
  };
  // `timeout`: the group's; the oldest op's device work gets that long, and
  // teardown waits at most that long for the held ops.
  HeldOps(int rank, Hooks hooks, std::chrono::milliseconds timeout);
  ~HeldOps();  // stop()

  void hold(std::shared_ptr<PipelineOp> op);
  // The group failed: held ops whose device work has not finished are
  // reported failed with `why`; they stay held until it does (or forever).
  void group_failed(const Error& why);
  // True once nothing is held (or the group failed), before `until`.
  bool wait_released(std::chrono::steady_clock::time_point until);
  // Waits (up to the timeout, not at all after a failure) for the held ops'
  // device work, then leaks what is left rather than free it under a
  // running kernel; stops the thread.  Idempotent.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    std::shared_ptr<PipelineOp> op;
    Clock::time_point since;  // held, or became the oldest, whichever is later
    bool reported = false;    // device_failed was called for it
  };

  void loop();
  // Releases the held ops whose device work is over, oldest first; under
  // mu_, dropping each outside it.  Stops at the first one still running,
  // and watches it (timeout, peers) unless the group failed.
  void release_finished(std::unique_lock<std::mutex>& lock);
  // After a failure: releases every op that has finished (in any order),
  // reports the others once.
  void release_after_failure(std::unique_lock<std::mutex>& lock);
  // Drops `op` outside the lock: its last reference may take a while (or
  // the GIL, for its Python object), and hold() takes the lock.
  void drop(std::shared_ptr<PipelineOp> op, std::unique_lock<std::mutex>& lock);
  std::string name(const PipelineOp& op) const;

  const int rank_;
  Hooks hooks_;
  const std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> held_;
  std::optional<Error> failure_;  // the group's failure, once told (group_failed)
  bool failed_ = false;
  bool dropping_ = false;  // the thread is dropping an op outside the lock
  bool stopping_ = false;
  PeerWatch peers_;  // of the oldest op
  std::thread thread_;
};

}  // namespace fairring

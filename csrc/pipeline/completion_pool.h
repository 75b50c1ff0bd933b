// Runs the calls that complete futures (and so run user callbacks: DDP comm
// hooks, then() chains) off the pipeline threads.
//
// A callback may block on another collective of the same group: DDP's
// PowerSGD hook calls all_reduce(...).get_future().wait() inside a then()
// callback.  With one completion thread that wait can never end (the future
// it waits for is queued behind it).  So the pool guarantees progress: when a
// call is queued and every worker is inside a call, another worker starts.
// Calls start in the order they were posted; a call posted while every
// worker is still inside one (blocked or merely slow) runs alongside it, as
// gloo's worker threads run theirs.  Workers started that way stay, idle, for
// the pool's life, so a job settles at a handful of them.
//
// Its state is shared with the workers, so a worker may outlive the pool: the
// owner may be destroyed from inside a callback (a group dropped there).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

namespace fairring {

class CompletionPool {
 public:
  // `rank` prefixes the log line of a callback that raised.
  explicit CompletionPool(int rank);
  // Lets queued calls run, then joins the workers (detaches the calling
  // worker when destroyed from inside a callback).
  ~CompletionPool();
  CompletionPool(const CompletionPool&) = delete;
  CompletionPool& operator=(const CompletionPool&) = delete;

  void post(std::function<void()> fn);
  // True if no call is queued or running: a caller may then run its own
  // completion in place without overtaking anything.
  bool idle() const;
  // Blocks until no call is queued or running, or `until` passes.  True if idle.
  bool wait_idle(std::chrono::steady_clock::time_point until) const;
  // True when the calling thread is one of the pool's workers.
  bool on_worker() const;

  struct State;  // shared with the workers (completion_pool.cpp)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace fairring

// The Work object Fairring returns for its own collectives.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

namespace fairring {

// What a Work may call on its group (abort it, move its own op); the group
// clears it when it goes, so that a Work outliving its group calls nothing.
template <typename... Args>
class GroupHook {
 public:
  explicit GroupHook(std::function<void(Args...)> fn) : fn_(std::move(fn)) {}
  void operator()(Args... args) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (fn_) fn_(args...);
  }
  void clear() {
    std::unique_lock<std::shared_mutex> lock(mu_);
    fn_ = nullptr;
  }

 private:
  std::shared_mutex mu_;
  std::function<void(Args...)> fn_;
};

// Fails the group with a reason.
using GroupAbortHook = GroupHook<const std::string&>;
// Moves the group's ops on the waiting thread until `done()` says so or the
// budget passes (point-to-point between node-mates: P2pEngine::poll).
using WaitPoller = GroupHook<const std::function<bool()>&, std::chrono::microseconds>;

class FairringWork : public c10d::Work {
 public:
  // `profiling_title` names the op in torch.profiler traces ("fairring:all_reduce").
  FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, const char* profiling_title);

  // Completes the work: wait() returns (or throws).  Quick, never blocks.
  void mark_done(std::exception_ptr error);
  // wait() first lets `poller` move the op for up to `budget`, then sleeps
  // if it is not done; isCompleted() lets it look once.
  void set_wait_poller(std::shared_ptr<WaitPoller> poller, std::chrono::microseconds budget) {
    poller_ = std::move(poller);
    poll_budget_ = budget;
  }
  // Completes the future, running its callbacks (DDP's comm hook chains on it).
  void complete_future(std::exception_ptr error);

  // Returns once the op is done and its future completed, so that
  // get_future().value() works right after wait().  On the main thread a
  // pending signal's Python handler runs while it waits: if it raises (Ctrl-C:
  // KeyboardInterrupt), the group is aborted (the interrupt hook; the peers
  // are told) and wait() raises that exception.
  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  // `what`: the op's kind, a literal ("all_reduce").
  void set_interrupt_hook(std::shared_ptr<GroupAbortHook> hook, const char* what) {
    interrupt_hook_ = std::move(hook);
    what_ = what;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);
    future_taken_ = true;
    return future_;
  }
  // Completes the future here and now if nobody has asked for it yet (so no
  // callback is chained on it and none can run here); true if it did.  Saves
  // a completion thread's wake-up on the latency path of a wait().
  bool complete_future_if_untaken(std::exception_ptr error);
  // A receive's sender (recv from any source); set before mark_done.
  void set_source_rank(int rank) { source_rank_ = rank; }
  int sourceRank() const override { return source_rank_ >= 0 ? source_rank_ : c10d::Work::sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  // Lets the poller move the op (set_wait_poller) for up to `budget`.
  void poll(std::chrono::microseconds budget);
  // Waits until the op is done, at most `timeout` (the base's wait then
  // raises), running pending signal handlers every kSignalPoll.
  void wait_interruptibly(std::chrono::milliseconds timeout);

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<GroupAbortHook> interrupt_hook_;
  std::shared_ptr<WaitPoller> poller_;
  std::chrono::microseconds poll_budget_{0};
  std::atomic<bool> marked_{false};  // mark_done has run (poller's test)
  const char* what_ = "";            // the op, for the interrupt's message
  int source_rank_ = -1;
  std::mutex future_mu_;  // future_taken_, and a completion that relies on it
  bool future_taken_ = false;
};

// A send or receive delegated to gloo, behind a wait() that may be called
// more than once (and from two threads: the caller's, and one whose op
// follows it under the order rule).  gloo's own wait() of a send or receive
// waits for its next completion each time it is called, so a second call
// waits for a message that never comes.
class OnceWaitedWork : public c10d::Work {
 public:
  OnceWaitedWork(c10::intrusive_ptr<c10d::Work> inner, int rank, c10d::OpType type);
  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::mutex wait_mu_;  // one inner wait() at a time
  std::atomic<bool> waited_{false};
  std::exception_ptr error_;
};

}  // namespace fairring

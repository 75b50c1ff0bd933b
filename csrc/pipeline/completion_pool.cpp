#include "pipeline/completion_pool.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "common/log.h"

namespace fairring {

namespace {
// Workers alive at once.  Each extra one exists because a callback blocked
// while completions were queued; a chain of callbacks that each wait on the
// next collective deeper than this is not a pattern anyone uses.
constexpr int kMaxWorkers = 64;
}  // namespace

struct CompletionPool::State {
  explicit State(int r) : rank(r) {}
  const int rank;
  mutable std::mutex mu;
  std::condition_variable work_cv;
  mutable std::condition_variable idle_cv;
  std::deque<std::function<void()>> queue;
  int workers = 0;
  int idle_workers = 0;  // waiting for work (notified or not)
  int running = 0;       // calls in progress
  bool stopping = false;
  bool warned_cap = false;
};

namespace {
thread_local const void* tl_pool_state = nullptr;

// Starts a worker if queued calls have nobody free to run them.  Under st.mu.
void ensure_worker(const std::shared_ptr<CompletionPool::State>& st);

void worker_loop(std::shared_ptr<CompletionPool::State> st) {
  pthread_setname_np(pthread_self(), "fairring-done");
  tl_pool_state = st.get();
  std::unique_lock<std::mutex> lock(st->mu);
  for (;;) {
    ++st->idle_workers;
    st->work_cv.wait(lock, [&] { return !st->queue.empty() || st->stopping; });
    --st->idle_workers;
    if (st->queue.empty()) break;  // stopping, nothing left
    std::function<void()> fn = std::move(st->queue.front());
    st->queue.pop_front();
    ++st->running;
    // If this call blocks, what is still queued needs another worker.
    ensure_worker(st);
    lock.unlock();
    try {
      fn();
    } catch (const std::exception& e) {
      FAIRRING_LOG(st->rank, "a completion callback raised: %s", e.what());
    } catch (...) {
      FAIRRING_LOG(st->rank, "a completion callback raised a non-standard exception");
    }
    fn = nullptr;  // drops the Work (and its tensors) before the call counts as done
    lock.lock();
    --st->running;
    if (st->queue.empty() && st->running == 0) st->idle_cv.notify_all();
  }
  --st->workers;
}

void ensure_worker(const std::shared_ptr<CompletionPool::State>& st) {
  if (st->queue.empty() || st->idle_workers > 0) return;
  if (st->workers >= kMaxWorkers) {
    if (!st->warned_cap) {
      st->warned_cap = true;
      FAIRRING_LOG(st->rank, "%d completion callbacks are blocked at once; later ones wait for one to return",
                   kMaxWorkers);
    }
    return;
  }
  ++st->workers;
  // Detached: the worker holds the state, and ends once the pool stops and
  // the queue is empty.  Never joined, so that a pool destroyed while the
  // caller holds the GIL cannot wait on a callback that needs it.
  std::thread(worker_loop, st).detach();
}
}  // namespace

CompletionPool::CompletionPool(int rank) : state_(std::make_shared<State>(rank)) {}

CompletionPool::~CompletionPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->work_cv.notify_all();
}

void CompletionPool::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(std::move(fn));
    ensure_worker(state_);
  }
  state_->work_cv.notify_one();
}

bool CompletionPool::idle() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->queue.empty() && state_->running == 0;
}

bool CompletionPool::wait_idle(std::chrono::steady_clock::time_point until) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->idle_cv.wait_until(lock, until, [&] { return state_->queue.empty() && state_->running == 0; });
}

bool CompletionPool::on_worker() const { return tl_pool_state == state_.get(); }

}  // namespace fairring

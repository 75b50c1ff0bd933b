#include "devices/deferred_mover.h"

#include <pthread.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/reduce_cpu.h"
#include "common/error.h"

namespace fairring {

namespace {
// One step in four waits before it runs, up to this long: long enough to
// let a peer's unordered read overtake it, short enough for the tests.
constexpr int kMaxDelayUs = 200;
}  // namespace

DeferredStreams::DeferredStreams(int count, unsigned seed) {
  for (int i = 0; i < count; ++i) {
    streams_.push_back(std::make_unique<Stream>());
    Stream& s = *streams_.back();
    s.worker = std::thread([this, &s, seed, i] {
      pthread_setname_np(pthread_self(), "fairring-mover");
      run(s, seed + static_cast<unsigned>(i));
    });
  }
}

DeferredStreams::~DeferredStreams() {
  cancelled_ = true;
  stopping_ = true;
  for (auto& s : streams_) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
    }
    s->cv.notify_all();
    s->worker.join();
  }
}

void DeferredStreams::run(Stream& s, unsigned seed) {
  std::mt19937 rng(seed);
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return !s.tasks.empty() || stopping_; });
      if (s.tasks.empty()) return;  // stopping
      fn = std::move(s.tasks.front());
      s.tasks.pop_front();
      s.busy = true;
    }
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % kMaxDelayUs));
    bool failed = cancelled_;
    {
      std::lock_guard<std::mutex> lock(error_mu_);
      failed = failed || error_ != nullptr;
    }
    // After a failure a stream only drains: its data no longer matters.
    if (!failed) {
      try {
        fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
    }
    s.cv.notify_all();
  }
}

void DeferredStreams::enqueue(int i, std::function<void()> fn) {
  Stream& s = *streams_.at(static_cast<size_t>(i));
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.tasks.push_back(std::move(fn));
  }
  s.cv.notify_all();
}

void DeferredStreams::join(int to, int from) {
  auto reached = std::make_shared<std::atomic<bool>>(false);
  enqueue(from, [reached] { reached->store(true, std::memory_order_release); });
  // A dropped mark (cancel) never comes: the wait ends with the streams.
  enqueue(to, [this, reached] {
    while (!reached->load(std::memory_order_acquire) && !cancelled_) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
}

void DeferredStreams::synchronize() {
  for (auto& s : streams_) {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return s->tasks.empty() && !s->busy; });
  }
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_) std::rethrow_exception(error_);
}

bool DeferredStreams::let_go(std::chrono::steady_clock::time_point until) {
  for (auto& s : streams_) {
    std::unique_lock<std::mutex> lock(s->mu);
    if (!s->cv.wait_until(lock, until, [&] { return !s->busy; })) return false;
  }
  return true;
}

DeferredMover::DeferredMover(NodeArena& arena, int local_rank, int ranks_per_node, int slots, int rank,
                             std::chrono::milliseconds timeout)
    : arena_(arena),
      me_(local_rank),
      has_peers_(ranks_per_node > 1),
      timeout_(timeout),
      streams_(slots, static_cast<unsigned>(rank * 1009)) {}

DeferredMover::~DeferredMover() = default;

void DeferredMover::require_peers(const char* what) const {
  if (!has_peers_) {
    throw Error(ErrorKind::kBackend, std::string("fairring: the schedule called the mover's ") + what +
                                         " on a node of one rank (mover.h: no node peer, no event)");
  }
}

void DeferredMover::done(int slot, PeerStep step) {
  require_peers("done()");
  // Enqueue a record: its number is known now, it completes when the stream
  // gets there.
  SharedCounter& e = enqueued(slot, me_, step);
  const uint32_t n = e.value.load(std::memory_order_relaxed) + 1;
  counter_publish(e, n);
  SharedCounter* c = &completed(slot, me_, step);
  enqueue(slot, [c, n] { counter_publish(*c, n); });
}

void DeferredMover::after(int slot, int x, PeerStep step) {
  require_peers("after()");
  // The last record x had enqueued when this wait is enqueued.
  const uint32_t target = enqueued(slot, x, step).value.load(std::memory_order_acquire);
  SharedCounter* c = &completed(slot, x, step);
  NodeArena* arena = &arena_;
  const auto timeout = timeout_;
  enqueue(slot, [c, target, arena, timeout, x] {
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    counter_wait(*c, target, [&] {
      if (arena->aborted()) throw Error(ErrorKind::kBackend, "deferred mover: the node aborted");
      if (std::chrono::steady_clock::now() > give_up) {
        throw Error(ErrorKind::kBackend,
                    "deferred mover: Timed out waiting for local rank " + std::to_string(x) + "'s event");
      }
    });
  });
}

void DeferredMover::copy(int slot, char* to, const char* from, int64_t bytes, bool) {
  enqueue(slot, [to, from, bytes] { std::memcpy(to, from, static_cast<size_t>(bytes)); });
}

void DeferredMover::reduce(int slot, c10::ScalarType dtype, RedOp op, void* out, const void* const* inputs, int n,
                           int64_t count, int64_t divisor) {
  std::vector<const void*> in(inputs, inputs + n);
  enqueue(slot, [=, in = std::move(in)] { reduce_cpu(dtype, op, out, in.data(), n, count, divisor); });
}

FencedRail::FencedRail(DeferredMover& mover, RailExchange& inner, int rank, std::chrono::milliseconds timeout,
                       Failed failed)
    : mover_(mover),
      inner_(inner),
      feeder_(inner, rank, "the deferred stream to reach a rail post", timeout, std::move(failed)) {}

void FencedRail::post(RailTask task) {
  auto reached = std::make_shared<std::atomic<bool>>(false);
  mover_.enqueue(task.slot, [reached] { reached->store(true, std::memory_order_release); });
  feeder_.push(std::move(task), [reached] { return reached->load(std::memory_order_acquire); });
}

void FencedRail::abort(const Error& why) {
  feeder_.stop();
  inner_.abort(why);
}

}  // namespace fairring

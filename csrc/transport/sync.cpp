#include "transport/sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <thread>

namespace fairring {

namespace {

// Shared (not FUTEX_PRIVATE) futexes: the word lives in memory mapped by
// several processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long timeout_ns) {
  struct timespec ts;
  ts.tv_sec = timeout_ns / 1000000000L;
  ts.tv_nsec = timeout_ns % 1000000000L;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

constexpr int kSpins = 256;                        // about a microsecond or two
constexpr long kSleepSliceNs = 20L * 1000 * 1000;  // re-check every 20 ms

}  // namespace

void counter_publish(SharedCounter& c, uint32_t value) {
  c.value.store(value, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) {
    futex_wake(&c.value);
  }
}

void counter_wake_all(SharedCounter& c) { futex_wake(&c.value); }

void counter_bump(SharedCounter& c) {
  c.value.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&c.value);
}

bool counter_wait_change(SharedCounter& c, uint32_t seen, std::chrono::nanoseconds spin,
                         std::chrono::nanoseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1;; ++i) {
    if (c.value.load(std::memory_order_acquire) != seen) return true;
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() - start >= spin) break;
      std::this_thread::yield();  // ranks may outnumber cores
    } else {
      cpu_relax();
    }
  }
  const auto left = limit - (std::chrono::steady_clock::now() - start);
  if (left <= std::chrono::nanoseconds::zero()) return false;
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.value.load(std::memory_order_seq_cst) == seen) futex_wait(&c.value, seen, static_cast<long>(left.count()));
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return c.value.load(std::memory_order_acquire) != seen;
}

bool counter_spin(SharedCounter& c, uint32_t target, std::chrono::steady_clock::time_point until) {
  for (unsigned i = 1;; ++i) {
    if (counter_reached(c.value.load(std::memory_order_acquire), target)) return true;
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= until) return false;
      // When ranks outnumber cores the peer may need this core to get there.
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }
}

void counter_wait(SharedCounter& c, uint32_t target, const std::function<void()>& check,
                  std::chrono::nanoseconds spin) {
  for (int i = 0; i < kSpins; ++i) {
    if (counter_reached(c.value.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  if (spin > std::chrono::nanoseconds::zero() && counter_spin(c, target, std::chrono::steady_clock::now() + spin)) {
    std::atomic_thread_fence(std::memory_order_acquire);
    return;
  }
  // Give the core to whoever we are waiting for before going to sleep.
  std::this_thread::yield();
  for (;;) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t v = c.value.load(std::memory_order_seq_cst);
    if (!counter_reached(v, target)) {
      futex_wait(&c.value, v, kSleepSliceNs);
      v = c.value.load(std::memory_order_acquire);
    }
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (counter_reached(v, target)) {
      std::atomic_thread_fence(std::memory_order_acquire);
      return;
    }
    check();
  }
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void doorbell_ring(SharedCounter& c) {
  c.value.fetch_add(1, std::memory_order_seq_cst);
  if (c.needs_wakes.load(std::memory_order_seq_cst) == 0 && doorbell_watched(c)) return;
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&c.value);
}

bool doorbell_watched(const SharedCounter& c) {
  return c.pollers.load(std::memory_order_seq_cst) != 0 || now_ns() < c.watched_until.load(std::memory_order_seq_cst);
}

void doorbell_watch(SharedCounter& c, std::chrono::nanoseconds span) {
  const int64_t now = now_ns();
  const int64_t until = now + span.count();
  int64_t old = c.watched_until.load(std::memory_order_seq_cst);
  while (old < until && !c.watched_until.compare_exchange_weak(old, until, std::memory_order_seq_cst)) {
  }
  // A sleeper that went to sleep before this promise may sleep past it:
  // woken, it sleeps again no later than `until`.  (Within a promise, one
  // that extends it needs no wake-up: the sleeper wakes at the old end and
  // sees the new one.)
  if (old < now && c.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake(&c.value);
}

void doorbell_unwatch(SharedCounter& c) { c.watched_until.store(0, std::memory_order_seq_cst); }

bool doorbell_wait(SharedCounter& c, uint32_t seen, std::chrono::nanoseconds spin, std::chrono::nanoseconds limit) {
  uint32_t expect = seen;
  const uint32_t value = c.value.load(std::memory_order_acquire);
  if (value != seen) {
    if (c.needs_wakes.load(std::memory_order_seq_cst) != 0 || !doorbell_watched(c)) return true;
    // Rung while watched: the watchers look at what those rings announce
    // (they promised to); this thread sleeps through them.  Else, on a CPU
    // it shares with a polling caller, it would find a new ring each time it
    // runs and never sleep.
    expect = value;
  } else if (!doorbell_watched(c) && spin > std::chrono::nanoseconds::zero() &&
             counter_wait_change(c, seen, spin, spin)) {
    return true;
  }
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  // Read after registering as a sleeper: a promise made before is seen
  // here, one made after finds the sleeper registered and wakes it.
  const int64_t now = now_ns();
  int64_t until = now + limit.count();
  const int64_t watched = c.watched_until.load(std::memory_order_seq_cst);
  if (watched > now) until = std::min(until, watched + 1000);
  const int64_t left = until - now;
  if (left > 0 && c.value.load(std::memory_order_seq_cst) == expect) {
    futex_wait(&c.value, expect, static_cast<long>(left));
  }
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return c.value.load(std::memory_order_acquire) != seen;
}

}  // namespace fairring

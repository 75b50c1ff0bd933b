// Cross-process counters in shared memory: spin briefly, then sleep on a
// futex.  CPU jobs often run more ranks than cores, so a waiter must give its
// core away quickly instead of spinning through the peer's time slice.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>

namespace fairring {

// One counter per cache line.  `value` only grows (modulo 2^32); a waiter
// waits until it reaches a target.
struct alignas(64) SharedCounter {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
  // Doorbells only (below): who stands in for the sleeper.
  std::atomic<uint32_t> pollers{0};       // threads polling for it now
  std::atomic<uint32_t> needs_wakes{0};   // the sleeper is mid-way through work each ring moves on
  std::atomic<int64_t> watched_until{0};  // steady-clock ns: a thread will look by then
};

// A spinning thread's pause between two looks at shared memory.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Has `value` reached `target`?  Wrap-around safe for distances below 2^31.
inline bool counter_reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

// Stores `value` and wakes sleepers, if any.
void counter_publish(SharedCounter& c, uint32_t value);

// Adds one to `value` and wakes sleepers, if any: a doorbell that several
// writers ring (counter_wait_change waits for it).
void counter_bump(SharedCounter& c);

// Wakes every sleeper without changing the value (used on abort).
void counter_wake_all(SharedCounter& c);

// Waits until c.value reaches `target`.  While sleeping it wakes up every few
// milliseconds and calls `check`, which throws to give up (deadline, abort,
// dead peer).  Spins (as counter_spin) for `spin` before it first sleeps:
// a futex sleep and wake-up cost tens of microseconds, more than most waits
// between ranks that each have a core.
void counter_wait(SharedCounter& c, uint32_t target, const std::function<void()>& check,
                  std::chrono::nanoseconds spin = std::chrono::nanoseconds::zero());

// Waits, spinning for `spin` then sleeping, until c.value differs from
// `seen` or `limit` (from the call) passes.  True if it changed.
bool counter_wait_change(SharedCounter& c, uint32_t seen, std::chrono::nanoseconds spin,
                         std::chrono::nanoseconds limit);

// Spins (giving the core away now and then, never sleeping) until c.value
// reaches `target` or `until` passes.  True if it was reached.  For a caller
// that has other work to fall back on when the peer is late.
bool counter_spin(SharedCounter& c, uint32_t target, std::chrono::steady_clock::time_point until);

// ---- Doorbells ----
// A counter that several writers bump to announce work to one sleeping
// thread (the point-to-point node thread), where other threads of the
// sleeper's process may do that work themselves: callers waiting on their
// own receives.  Such a thread either polls (`pollers`: it looks again
// before it stops), or promises to look by a time (doorbell_watch).  A ring
// then leaves the sleeper asleep: on a machine with few cores, a wake-up per
// small message costs more than the message.  The sleeper sleeps no later
// than the promise (doorbell_wait), so a promise not kept costs a delay,
// never a message; while it streams (`needs_wakes`) every ring wakes it.

// Bumps the bell; wakes the sleeper unless another thread stands in for it.
void doorbell_ring(SharedCounter& c);
// Promises that a thread of the sleeper's process looks at the bell's work
// within `span` from now.
void doorbell_watch(SharedCounter& c, std::chrono::nanoseconds span);
// Withdraws every promise (a caller that stops polling, not done): the
// next ring wakes the sleeper.  The caller then looks once more itself.
void doorbell_unwatch(SharedCounter& c);
// Whether a thread polls or has promised to look (the sleeper need not spin).
bool doorbell_watched(const SharedCounter& c);
// The sleeper's wait: as counter_wait_change, but while watched it does not
// spin, sleeps through rings since `seen` (the watchers look at them), and
// sleeps no later than the promise to look.  True if `value` is not `seen`.
bool doorbell_wait(SharedCounter& c, uint32_t seen, std::chrono::nanoseconds spin, std::chrono::nanoseconds limit);

}  // namespace fairring

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
};

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

}  // namespace fairring

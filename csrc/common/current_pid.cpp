#include "common/current_pid.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace fairring {

namespace {
std::atomic<pid_t> cached{0};

void forget_in_child() { cached.store(0, std::memory_order_relaxed); }

// Registered once, when the library loads (before any fork it must see).
[[maybe_unused]] const bool registered = [] {
  pthread_atfork(nullptr, nullptr, forget_in_child);
  return true;
}();
}  // namespace

pid_t current_pid() {
  pid_t pid = cached.load(std::memory_order_relaxed);
  if (pid == 0) {
    pid = getpid();
    cached.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

}  // namespace fairring

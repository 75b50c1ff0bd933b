#include "topology/machine.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace fairring {

namespace {
// Longer than most waits between two ranks that run at once (one side a
// slice's copy or reduce ahead), shorter than a slice: the spin either ends
// the wait or costs little beside the slice.  A futex sleep and wake-up cost
// 20-50 us on a VM (docs/BENCHMARKS_HISTORY.md, "Mid-size ops").
constexpr std::chrono::microseconds kWaitSpin(50);
}  // namespace

std::string machine_key() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (!(f >> boot)) boot = "no-boot-id";
  return std::string(host) + "/" + boot;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int64_t parse_cache_size(const std::string& text) {
  size_t i = 0;
  int64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (n > (int64_t{1} << 40)) return 0;
    n = n * 10 + (text[i++] - '0');
  }
  if (i == 0) return 0;
  int64_t unit = 1;
  if (i < text.size()) {
    const char u = text[i++];
    if (u == 'K') {
      unit = int64_t{1} << 10;
    } else if (u == 'M') {
      unit = int64_t{1} << 20;
    } else if (u == 'G') {
      unit = int64_t{1} << 30;
    } else {
      return 0;
    }
  }
  while (i < text.size() && (text[i] == '\n' || text[i] == ' ')) ++i;
  return i == text.size() ? n * unit : 0;
}

int64_t shared_cache_bytes() {
  int64_t best = 0;
  for (int index = 0; index < 16; ++index) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    if (!f) break;
    std::string text;
    f >> text;
    best = std::max(best, parse_cache_size(text));
  }
  return best;
}

std::chrono::microseconds wait_spin_for(int ranks_here, int cpus) {
  // Ranks that outnumber the CPUs need each other's cores: a spinning waiter
  // would hold the core its peer needs to get there (it yields, but still
  // burns what the peer or the trainer could use).
  return ranks_here <= cpus ? kWaitSpin : std::chrono::microseconds(0);
}

}  // namespace fairring

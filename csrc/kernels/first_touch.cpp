#include "kernels/first_touch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace fairring {

namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;  // x86-64's PMD size

std::string read_thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!f || !std::getline(f, line)) return "unknown";
  // "always [madvise] never": the bracketed word is in force.
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unknown";
  return line.substr(open + 1, close - open - 1);
}

}  // namespace

const char* thp_mode() {
  static const std::string mode = read_thp_mode();
  return mode.c_str();
}

int64_t advise_fresh_memory(void* p, int64_t bytes) {
  static const bool advisable = std::string(thp_mode()) == "madvise";
  if (!advisable || bytes <= 0) return 0;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) & ~(kHugePage - 1);
  if (last <= first) return 0;
  // A warm buffer (its first page mapped) keeps its small pages: advice
  // would only have khugepaged copy it into huge ones later.
  unsigned char resident = 0;
  if (mincore(reinterpret_cast<void*>(first), static_cast<size_t>(sysconf(_SC_PAGESIZE)), &resident) != 0 ||
      (resident & 1)) {
    return 0;
  }
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return 0;
  return static_cast<int64_t>(last - first);
}

}  // namespace fairring
